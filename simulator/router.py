"""Routing strategies: which pod serves a request.

- `roundrobin`: pods in turn.
- `session`: sticky per session id (a fixed hash of the id picks the pod); requests without a
  session go to the least-loaded pod (production-stack falls back to the lowest-QPS endpoint).
- `prefixaware`: the router remembers which chunk hashes it sent to each pod and never forgets
  (like production-stack's hash trie, it assumes no eviction). The pod with the longest
  remembered prefix wins, among pods under the load cap (in-flight <= ratio x min + slack); ties
  go to the least-loaded pod, then the lowest index.
- `kvaware`: asks the twin for each pod's real cached prefix (GPU, CPU, shared L2) and picks the
  smallest expected TTFT = queued prefill work + load/read time + prefill of the uncached rest;
  ties go to the least-loaded pod, then the lowest index.

"Load" is the number of requests in flight on a pod (arrived, first token or decode not done).
"""
from __future__ import annotations

from bisect import bisect_left
from collections.abc import Callable, Sequence

from simulator.cluster import RouterSettings

_MASK = (1 << 64) - 1


def _least_loaded(loads: Sequence[int]) -> int:
    return min(range(len(loads)), key=loads.__getitem__)


class Router:
    name = "?"
    needs_loads = True
    needs_estimate = False

    def __init__(self, pods: int, settings: RouterSettings) -> None:
        self.pods = pods
        self.settings = settings

    def choose(
        self,
        chunks: Sequence[int],
        session_id: int | None,
        loads: Sequence[int],
        estimate: Callable[[int], float] | None,
        remembered: int | None = None,
    ) -> int:
        """The pod for a request. `remembered`: only `chunks[:remembered]` can have been seen before
        (the rest is new to the whole twin); None = unknown."""
        raise NotImplementedError

    def record(self, pod: int, chunks: Sequence[int]) -> None:
        """Called after each routing decision with the request's chunk hashes."""

    def forget_pod(self, pod: int) -> None:
        """The pod restarted; routers that track real state would forget it (ours keep memory)."""


class RoundRobinRouter(Router):
    name = "roundrobin"
    needs_loads = False

    def __init__(self, pods: int, settings: RouterSettings) -> None:
        super().__init__(pods, settings)
        self._next = 0

    def choose(self, chunks, session_id, loads, estimate, remembered=None) -> int:
        pod = self._next
        self._next = (pod + 1) % self.pods
        return pod


class SessionRouter(Router):
    name = "session"

    def choose(self, chunks, session_id, loads, estimate, remembered=None) -> int:
        if session_id is None:
            return _least_loaded(loads)
        z = ((session_id & _MASK) * 0x9E3779B97F4A7C15) & _MASK
        return (z >> 32) % self.pods


class PrefixAwareRouter(Router):
    name = "prefixaware"

    def __init__(self, pods: int, settings: RouterSettings) -> None:
        super().__init__(pods, settings)
        self._seen: list[set[int]] = [set() for _ in range(pods)]
        self._last = (-1, 0)  # (pod, matched chunks) of the latest choice

    def choose(self, chunks, session_id, loads, estimate, remembered=None) -> int:
        cap = min(loads) * self.settings.prefix_load_ratio + self.settings.prefix_load_slack
        # Only chunks[:n] can be remembered anywhere. Each pod's memory is prefix-closed (a chained
        # chunk hash implies its whole prefix, and whole prompts are recorded), so membership is
        # monotone along the prompt: binary-search the reversed prompt, where it is ascending.
        n = len(chunks) if remembered is None else remembered
        back = None
        best, best_len, best_load = -1, -1, 0
        for pod, seen in enumerate(self._seen):
            load = loads[pod]
            if load > cap:
                continue
            if not n or chunks[0] not in seen:
                m = 0
            elif chunks[n - 1] in seen:  # both ends checked first: most pods have all or nothing
                m = n
            else:
                if back is None:
                    back = chunks[n - 1::-1]
                m = n - bisect_left(back, True, 0, n, key=seen.__contains__)
            if m > best_len or (m == best_len and load < best_load):
                best, best_len, best_load = pod, m, load
        self._last = (best, best_len)
        return best

    def record(self, pod: int, chunks: Sequence[int]) -> None:
        # the chosen pod already remembers the matched prefix: add only the rest
        chosen, known = self._last
        self._seen[pod].update(chunks[known:] if pod == chosen and known else chunks)


class KvAwareRouter(Router):
    name = "kvaware"
    needs_estimate = True

    def choose(self, chunks, session_id, loads, estimate, remembered=None) -> int:
        assert estimate is not None
        return min(range(self.pods), key=lambda p: (estimate(p), loads[p], p))


class PlacedRouter(Router):
    """Not a strategy: each request goes to the pod given for it, in arrival order (an observed
    placement replayed as it happened, e.g. the pods that served a stream rebuilt from their KV
    events). One pod per `choose` call; choosing past the end of the placement is an error."""

    name = "placed"
    needs_loads = False

    def __init__(self, pods: int, settings: RouterSettings, placement: Sequence[int]) -> None:
        super().__init__(pods, settings)
        self.placement = [int(q) for q in placement]
        bad = [q for q in self.placement if not 0 <= q < pods]
        if bad:
            raise ValueError(f"placement: pod index {bad[0]} outside the cluster's {pods} pods")
        self._next = 0

    def choose(self, chunks, session_id, loads, estimate, remembered=None) -> int:
        i = self._next
        if i >= len(self.placement):
            raise ValueError(f"placement: request {i + 1} has no pod (the placement covers {len(self.placement)})")
        self._next = i + 1
        return self.placement[i]


ROUTERS: dict[str, type[Router]] = {
    r.name: r for r in (RoundRobinRouter, SessionRouter, PrefixAwareRouter, KvAwareRouter)
}


def make_router(name: str, pods: int, settings: RouterSettings) -> Router:
    try:
        return ROUTERS[name](pods, settings)
    except KeyError:
        raise ValueError(f"router: unknown {name!r}; valid choices: {', '.join(ROUTERS)}") from None
