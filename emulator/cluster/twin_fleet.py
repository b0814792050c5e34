"""The digital twin as a live fleet on a simulated clock (no sockets, no threads, no sleeping).

`TwinFleet` serves a workload's requests on `simulator.twin.Twin` up to whatever time the caller
advances it to, and offers what the tuner needs from a real deployment:

- the `contracts.actuator.Actuator` protocol, with the deployment's restart rules
  (`local_actuator.restart_plan`): an LMCache change is a rolling restart of every vLLM pod, one
  at a time, each down for `restart_downtime_s` (no prefill starts on it; requests routed to it
  queue) and back with cold GPU and CPU caches; Curvine settings restart the master (pool data
  stays); the router reloads hot;
- `tuners.live.WindowSource`: the TTFT samples and cumulative hit ratio of the requests that
  arrived in a window;
- `signals(now, window_s)`: the drift detector's workload signals over the trailing window,
  from the request stream itself (prefix reuse of the workload, mean prompt tokens, arrival
  rate), so they do not depend on the configuration;
- the served truth (`ttft`, `phase` per request) and a log of what was applied when;
- with `identity`, what an agent would collect from it: what each pod's vLLM `/metrics` serves
  (`snapshots()`, counters reset by a restart, as a new process's are), and with `event_sink` every
  block event of every pod (`contracts.events`), as the pods would publish them.

`bench/live_tuning.py` and `emulator.demo.sim_run` drive the real controller against it.
"""
from __future__ import annotations

import bisect
import dataclasses
from collections.abc import Sequence

import numpy as np

from contracts.actuator import ApplyResult, PermanentActuationError
from contracts.events import EventSink
from contracts.knobs import DEFAULT_KNOBS, Knobs
from emulator.cluster.exposition import Snapshot
from emulator.cluster.local_actuator import restart_plan
from emulator.cluster.pod_metrics import PodIdentity, VllmPodMetrics
from emulator.cluster.twin_adapter import pod_load, request_outcome
from simulator.cluster import ClusterSpec
from simulator.records import Request
from simulator.twin import Twin
from tuners.objective import TtftObservations

DEFAULT_RESTART_DOWNTIME_S = 6.0  # the demo's 0.3 wall seconds at 20x


@dataclasses.dataclass(frozen=True)
class FleetAction:
    """One configuration change the fleet carried out. kind: apply | rollback."""

    at: float
    kind: str
    changed: tuple[str, ...]
    pods_restarted: bool
    knobs: Knobs


class TwinFleet:
    """A twin serving `requests` (arrival order) as a fleet the tuner can act on."""

    def __init__(self, requests: Sequence[Request], cluster: ClusterSpec, knobs: Knobs = DEFAULT_KNOBS, *,
                 restart_downtime_s: float = DEFAULT_RESTART_DOWNTIME_S, dry_run: bool = False,
                 identity: PodIdentity | None = None, event_sink: EventSink | None = None) -> None:
        self.twin = Twin(cluster, knobs, event_sink=event_sink)
        self.identity = identity
        self.pod_metrics = {name: VllmPodMetrics(identity, 0.0) for name in self.twin.pod_names} if identity else {}
        self.requests = list(requests)
        self.arrivals = [r.timestamp_ms / 1000.0 for r in self.requests]
        self.downtime_s = restart_downtime_s
        self.dry_run = dry_run
        self.now = 0.0
        self._next = 0
        self._current = knobs
        self._last_good: Knobs | None = None
        self._restarts: list[tuple[float, int]] = []  # (at, pod index), pending, sorted
        self._seen: set[int] = set()
        n = len(self.requests)
        self.ttft = np.full(n, np.nan)
        self.prompt = np.zeros(n)
        self.hits = np.zeros(n)
        self.queue = np.zeros(n)
        self.blocks = np.zeros(n)
        self.new_blocks = np.zeros(n)
        self.phase = np.array([r.phase for r in self.requests], dtype=int)
        self.actions: list[FleetAction] = []

    # -- the clock -----------------------------------------------------------------------------
    @property
    def served(self) -> int:
        return self._next

    @property
    def finished(self) -> bool:
        return self._next >= len(self.requests)

    def advance(self, until: float) -> int:
        """Serve every request that arrives by `until` (pending pod restarts in time order)."""
        start = self._next
        while self._next < len(self.requests) and self.arrivals[self._next] <= until:
            t = self.arrivals[self._next]
            while self._restarts and self._restarts[0][0] <= t:
                at, pod = self._restarts.pop(0)
                self.twin.restart_pod(pod, at, down_s=self.downtime_s)
                if self.identity is not None:  # a new process: its counters start again
                    self.pod_metrics[self.twin.pod_names[pod]] = VllmPodMetrics(self.identity, at)
            self._serve(self._next)
            self._next += 1
        self.now = max(self.now, until)
        return self._next - start

    def _serve(self, i: int) -> None:
        req = self.requests[i]
        o = self.twin.submit(req)
        if self.identity is not None:
            self.pod_metrics[o.pod].record(request_outcome(self.twin, req, o))
        self.ttft[i] = o.ttft_s
        self.prompt[i] = o.prompt_tokens
        self.hits[i] = o.hit_tokens
        self.queue[i] = o.queue_delay_s
        ids = req.hash_ids
        new = sum(1 for h in ids if h not in self._seen)
        self._seen.update(ids)
        self.blocks[i] = len(ids)
        self.new_blocks[i] = new

    def _span(self, since: float, until: float) -> slice:
        lo = bisect.bisect_left(self.arrivals, since, 0, self._next)
        hi = bisect.bisect_left(self.arrivals, until, 0, self._next)
        return slice(lo, hi)

    def snapshots(self) -> dict[str, Snapshot]:
        """What each pod's vLLM `/metrics` serves now (with `identity`), its gauges read from the
        twin; `render_python_client` makes the page of one."""
        out = {}
        for name, metrics in self.pod_metrics.items():
            metrics.set_load(**pod_load(self.twin, name), l2_bytes=0.0)
            out[name] = metrics.snapshot()
        return out

    # -- WindowSource ----------------------------------------------------------------------------
    def ttft_observations(self, since: float, until: float) -> TtftObservations | None:
        x = self.ttft[self._span(since, until)]
        return TtftObservations(samples=tuple(float(v) for v in x)) if x.size else None

    def cumulative_hit_ratio(self, since: float, until: float) -> float | None:
        s = self._span(since, until)
        prompt = float(self.prompt[s].sum())
        return float(self.hits[s].sum()) / prompt if prompt > 0 else None

    def signals(self, now: float, window_s: float) -> dict[str, float]:
        """Workload signals over [now - window_s, now): reuse_ratio, prompt_tokens_mean, arrival_rate."""
        s = self._span(now - window_s, now)
        n = s.stop - s.start
        if n == 0:
            return {}
        blocks = float(self.blocks[s].sum())
        return {"reuse_ratio": 1.0 - float(self.new_blocks[s].sum()) / blocks if blocks else 0.0,
                "prompt_tokens_mean": float(self.prompt[s].mean()), "arrival_rate": n / window_s}

    def latency_points(self, since: float, until: float, step_s: float = 10.0) -> list[tuple[float, float, float]]:
        """Per `step_s` window: (requests, mean uncached prompt tokens, mean TTFT - queue time),
        what the agent reads from vLLM's token counters and TTFT / queue-time histograms."""
        out = []
        t = since
        while t < until:
            s = self._span(t, min(t + step_s, until))
            n = s.stop - s.start
            if n:
                out.append((float(n), float((self.prompt[s] - self.hits[s]).mean()),
                            float((self.ttft[s] - self.queue[s]).mean())))
            t += step_s
        return out

    # -- Actuator ------------------------------------------------------------------------------
    def current(self) -> Knobs:
        return self._current

    def last_good(self) -> Knobs | None:
        return self._last_good

    def mark_good(self, knobs: Knobs) -> None:
        self._last_good = knobs

    def apply(self, knobs: Knobs, *, dry_run: bool = False) -> ApplyResult:
        return self._apply(knobs, dry_run=dry_run or self.dry_run, kind="apply")

    def rollback(self) -> ApplyResult:
        if self._last_good is None:
            raise PermanentActuationError("rollback: no last good configuration has been marked")
        return self._apply(self._last_good, dry_run=self.dry_run, kind="rollback")

    def _apply(self, knobs: Knobs, *, dry_run: bool, kind: str) -> ApplyResult:
        changed = self._current.diff(knobs)
        pods_restart, master_restart = restart_plan(set(changed))
        names = self.twin.pod_names
        restarted = (names if pods_restart else ()) + (("curvine-master",) if master_restart else ())
        if not changed or dry_run:
            return ApplyResult(knobs=knobs, applied=False, dry_run=dry_run, changed=changed,
                               restarted=restarted if dry_run else (),
                               message=f"{kind}: " + ("dry run, nothing applied" if dry_run else "no change"))
        self._current = knobs
        self.twin.reconfigure(knobs)
        if pods_restart:  # rolling: one pod after the other
            for i in range(len(names)):
                self._restarts.append((self.now + i * self.downtime_s, i))
            self._restarts.sort()
        self.actions.append(FleetAction(self.now, kind, tuple(sorted(changed)), pods_restart, knobs))
        return ApplyResult(knobs=knobs, applied=True, changed=changed, restarted=restarted,
                           message=f"{kind}: " + ", ".join(f"{k} {a}->{b}" for k, (a, b) in changed.items()))


__all__ = ["DEFAULT_RESTART_DOWNTIME_S", "FleetAction", "TwinFleet"]
