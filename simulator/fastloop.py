"""The batch replay loop with the common tier policies written out (no per-chunk method calls).

`Twin._process` is the general engine: one method call per request, one per tier operation.
For a whole workload with no event sink, the tuner's usual settings (GPU LRU, CPU and L2 LRU or
FIFO, any router but `kvaware`) run here instead: one loop over the requests routes, looks up
(on the tiers' sets directly), attributes the misses, updates the tiers (`simulator.fastloop_tiers`:
the common cases written out on each policy's set, recency log and stale counts, the rare ones
through the policy's own methods) and queues the prefill (`_Latency`, `Twin._process`'s
arithmetic in its order). The results are identical to `_process` request by request
(tests/test_sim_fastpath.py; docs/twin.md).

Only what `replay` reports is kept up to date: per-request rows, evictions, the L2 pool's
counters and the miss-attribution ground truth (pods' metric counters and latency samples are
not filled: nothing reads them after a batch replay).
"""
from __future__ import annotations

from bisect import bisect_left
from collections.abc import Callable
from heapq import heappop, heappush
from itertools import filterfalse, takewhile
from typing import TYPE_CHECKING

import polars as pl

from simulator.counters import MissTotals
from simulator.fastloop_tiers import LogTiers
from simulator.policies import FIFO, LRU
from simulator.router import PlacedRouter, PrefixAwareRouter, RoundRobinRouter, SessionRouter
from simulator.tier_lookup import cpu_l2_runs

if TYPE_CHECKING:
    from simulator.twin import Twin

_EMPTY: list[int] = []
_LOG_TYPES = (LRU, FIFO)


def supports(twin: Twin) -> bool:
    """Whether `run` models this twin exactly (otherwise use `Twin._process`)."""
    if twin._sink is not None or twin._native:
        return False
    if not isinstance(twin._router, (PrefixAwareRouter, RoundRobinRouter, SessionRouter, PlacedRouter)):
        return False
    tiers = [p.gpu for p in twin._pods] + [p.cpu for p in twin._pods] + [twin._l2]
    return all(t is None or type(t) in _LOG_TYPES for t in tiers) and all(
        p.gpu is None or type(p.gpu) is LRU for p in twin._pods)


def run(
    twin: Twin,
    times: list[float],
    prompts: list[int],
    outputs: list[int],
    flat: list[int],
    offsets: list[int],
    colds: list[int],
    freshes: list[int],
    sessions: list[int | None],
    progress: Callable[[int, int], None] | None = None,
) -> list[tuple]:
    """Replay every request (see `Twin._process` for the meaning of each step); returns the rows."""
    router = twin._router
    npods, c, l2_min = len(twin._pods), twin._chunk, twin._l2_min
    heap, loads = twin._heap, twin._loads
    tiers = LogTiers(twin)
    update = tiers.update
    gpu_on, cpu_on, l2_on = tiers.gpu_on, tiers.cpu_on, tiers.l2_on
    g_in, c_in, in_l2_all = tiers.gpu_in, tiers.cpu_in, tiers.l2_in
    latency = _Latency(twin)
    serve, l2_write = latency.serve, latency.l2_write
    prefix, rr = isinstance(router, PrefixAwareRouter), isinstance(router, RoundRobinRouter)
    if prefix:
        mem = router._seen
        mem_in = [s.__contains__ for s in mem]
        ratio, slack = router.settings.prefix_load_ratio, router.settings.prefix_load_slack
        last = router._last
    if rr:
        nxt = router._next
    choose = router.choose
    rows: list[tuple] = []
    append = rows.append
    total = len(times)
    step = max(total // 200, 1)
    now = twin._now
    for i in range(total):
        now = times[i]
        prompt = prompts[i]
        chunks = flat[offsets[i]:offsets[i + 1]]
        cold, fresh = colds[i], freshes[i]
        while heap and heap[0][0] <= now:
            loads[heappop(heap)[2]] -= 1
        n = len(chunks)
        known = n - fresh
        # -- route ---------------------------------------------------------------------------------
        if prefix:
            idx, best_len = _route_prefix(chunks, known, loads, mem_in, ratio, slack)
            last = (idx, best_len)
            mem[idx].update(chunks[best_len:] if best_len else chunks)
        elif rr:
            idx = nxt
            nxt = (idx + 1) % npods
        else:
            idx = choose(chunks, sessions[i], loads, None, known)
        # -- lookup: GPU prefix, then CPU / L2 runs ------------------------------------------------
        l2 = l2_on and prompt >= l2_min
        g, cpu_keys, l2_keys, k = _lookup(chunks, known, g_in[idx], c_in[idx], in_l2_all, cpu_on, l2)
        computed = chunks[k:] if k else chunks
        ncomp = n - k
        n_cpu, n_l2 = len(cpu_keys), len(l2_keys)
        # -- miss attribution, tier updates (simulator.fastloop_tiers), latency --------------------
        cold, capacity, routing = _attribute_misses(computed, ncomp, cold, idx, npods, g_in, c_in, gpu_on, cpu_on)
        update(idx, chunks, g, fresh, cpu_keys, l2_keys, computed)
        l2_write_s = l2_write(ncomp) if l2_on and ncomp else 0.0
        computed_tokens, queue, ttft, l2_read_s = serve(idx, now, prompt, k, n_cpu, n_l2, outputs[i])
        append((idx, now, prompt, g * c, n_cpu * c, n_l2 * c, computed_tokens, queue, ttft, l2_read_s, l2_write_s,
                cold * c, capacity * c, routing * c, prompt - n * c))
        if progress is not None and i % step == 0:
            progress(i, total)
    # -- write the state back ------------------------------------------------------------------------
    twin._now = now
    if prefix:
        router._last = last
    if rr:
        router._next = nxt
    tiers.write_back(twin)
    latency.write_back(twin)
    return rows


class _Latency:
    """`Twin._process`'s latency model (same arithmetic, same order) over the pods' queues and the
    requests in flight, with the L2 pool's transfer totals of the replay."""

    __slots__ = ("attention_s", "c", "chunk_bytes", "cpu_chunk_s", "cpu_fixed_s", "decode_s", "free_at", "heap",
                 "l2_chunk_s", "l2_retrieve_s", "load_delay_s", "loads", "overhead_busy_s", "overhead_s", "prefill_s",
                 "read_bytes", "read_chunks", "read_time", "w_byte_s", "w_chunk_s", "write_bytes", "write_chunks",
                 "write_time")

    def __init__(self, twin: Twin) -> None:
        self.c, self.heap, self.loads = twin._chunk, twin._heap, twin._loads
        self.free_at = [p.free_at for p in twin._pods]
        self.prefill_s, self.overhead_s, self.decode_s = twin._prefill_s, twin._overhead_s, twin._decode_s
        self.attention_s, self.overhead_busy_s = twin._attention_s, twin._overhead_busy_s
        self.load_delay_s = twin._load_delay_s
        self.cpu_chunk_s, self.l2_chunk_s, self.l2_retrieve_s = twin._cpu_chunk_s, twin._l2_chunk_s, twin._l2_retrieve_s
        self.cpu_fixed_s = twin._cpu_fixed_s
        self.w_chunk_s, self.w_byte_s, self.chunk_bytes = twin._w_chunk_s, twin._w_byte_s, twin._chunk_bytes
        self.read_bytes = self.read_chunks = self.write_bytes = self.write_chunks = 0
        self.read_time = self.write_time = 0

    def l2_write(self, ncomp: int) -> float:
        """Write `ncomp` computed chunks to the L2 pool; returns the write time."""
        nbytes = ncomp * self.chunk_bytes
        l2_write_s = ncomp * self.w_chunk_s + nbytes * self.w_byte_s
        self.write_bytes += nbytes
        self.write_chunks += ncomp
        self.write_time += l2_write_s
        return l2_write_s

    def serve(self, idx: int, now: float, prompt: int, k: int, n_cpu: int, n_l2: int,
              out_len: int) -> tuple[int, float, float, float]:
        """Queue a request on pod `idx` (`k` chunks cached, `n_cpu` of them loaded from the CPU tier
        and `n_l2` from L2); returns its computed tokens, queue delay, TTFT and L2 read time."""
        c = self.c
        computed_tokens = prompt - k * c
        busy = (computed_tokens if computed_tokens > 0 else 1) * self.prefill_s + self.overhead_busy_s
        attention_s = self.attention_s
        if attention_s:
            busy += max(computed_tokens, 1) * (k * c + 0.5 * max(computed_tokens, 1)) * attention_s
        extra = self.overhead_s
        l2_read_s = 0.0
        if n_cpu:
            busy += n_cpu * self.cpu_chunk_s
            if not n_l2:
                extra += self.cpu_fixed_s
        if n_l2:
            l2_read_s = n_l2 * self.l2_chunk_s
            busy += l2_read_s
            extra += self.l2_retrieve_s
            self.read_bytes += n_l2 * self.chunk_bytes
            self.read_chunks += n_l2
            self.read_time += l2_read_s
        free_at = self.free_at
        fa = free_at[idx]
        start = now if now >= fa else fa  # noqa: FURB136 (max() is a call; this is the hot loop)
        free_at[idx] = start + busy
        queue = start - now
        ttft = queue + busy + extra
        heappush(self.heap, (now + ttft + out_len * self.decode_s, start, idx))
        load_delay_s = self.load_delay_s
        if load_delay_s:  # the load term (ClusterSpec.load_delay_s), as in Twin._process
            queue += load_delay_s
            ttft += load_delay_s
        self.loads[idx] += 1
        return computed_tokens, queue, ttft, l2_read_s

    def write_back(self, twin: Twin) -> None:
        """The pods' queues and the L2 pool's transfer totals, back to the twin."""
        for q, p in enumerate(twin._pods):
            p.free_at = self.free_at[q]
        lt = twin._l2_totals
        lt.read_bytes += self.read_bytes
        lt.read_chunks += self.read_chunks
        lt.read_time_s += self.read_time
        lt.write_bytes += self.write_bytes
        lt.write_chunks += self.write_chunks
        lt.write_time_s += self.write_time


def _route_prefix(chunks: list[int], known: int, loads: list[int], mem_in: list[Callable[[int], bool]],
                  ratio: float, slack: int) -> tuple[int, int]:
    """The prefix-aware router's choice (`PrefixAwareRouter.choose`): the pod under the load cap
    that remembers the longest prefix of the `known` chunks (ties: the less loaded, then the
    first); returns it and that prefix length."""
    if not known:  # nothing remembered anywhere: the first least-loaded pod (always under the cap)
        return loads.index(min(loads)), 0
    cap = min(loads) * ratio + slack
    head, last_known = chunks[0], chunks[known - 1]
    back = None
    idx, best_len, best_load = -1, -1, 0
    for q in range(len(loads)):
        load = loads[q]
        if load > cap:
            continue
        # memories are prefix-closed: check both ends before a binary search
        has = mem_in[q]
        if not has(head):
            m = 0
        elif has(last_known):
            m = known
        else:
            if back is None:
                back = chunks[known - 1::-1]
            m = known - bisect_left(back, True, 0, known, key=has)
        if m > best_len or (m == best_len and load < best_load):
            idx, best_len, best_load = q, m, load
    return idx, best_len


def _lookup(chunks: list[int], known: int, in_gpu: Callable[[int], bool] | None,
            in_cpu: Callable[[int], bool] | None, in_l2: Callable[[int], bool] | None, cpu_on: bool,
            l2: bool) -> tuple[int, list[int], list[int], int]:
    """Look a prompt's `known` chunks up on the pod: the GPU prefix, then alternate runs in its CPU
    tier and the L2 pool (`l2`: this prompt may use it), CPU first, up to the first chunk in
    neither. Returns the GPU hits, the CPU keys, the L2 keys and how many chunks were found."""
    g = len(list(takewhile(in_gpu, chunks))) if in_gpu is not None and known else 0
    if g == known or not (cpu_on or l2):
        return g, _EMPTY, _EMPTY, g
    rest = chunks[g:] if g else chunks
    if not l2:
        a = len(list(takewhile(in_cpu, rest)))
        return g, rest[:a] if a else _EMPTY, _EMPTY, g + a
    if not cpu_on:
        b = len(list(takewhile(in_l2, rest)))
        return g, _EMPTY, rest[:b] if b else _EMPTY, g + b
    cpu_keys, l2_keys, k = cpu_l2_runs(rest, in_cpu, in_l2)
    return g, cpu_keys, l2_keys, g + k


def _attribute_misses(computed: list[int], ncomp: int, cold: int, idx: int, npods: int, g_in: list, c_in: list,
                      gpu_on: bool, cpu_on: bool) -> tuple[int, int, int]:
    """Split the `ncomp` computed chunks (the last `cold` of them never seen before) into cold,
    capacity and routing misses (chunks pod `idx` lacks but another pod holds in its GPU or CPU
    tier); returns the three counts."""
    if not ncomp:
        return 0, 0, 0
    if ncomp <= cold:
        return cold, 0, 0
    if npods == 1:
        return cold, ncomp - cold, 0
    missed = computed[:ncomp - cold]
    if gpu_on:
        missed = filterfalse(g_in[idx], missed)
    if cpu_on:
        missed = filterfalse(c_in[idx], missed)
    want = set(missed)
    if not want:
        return cold, ncomp - cold, 0
    found: set[int] = set()
    for q in range(npods):
        if q != idx:
            if gpu_on:
                found.update(filter(g_in[q], want))
            if cpu_on:
                found.update(filter(c_in[q], want))
    routing = len(found)
    return cold, ncomp - cold - routing, routing


def add_truth(twin: Twin, requests: pl.DataFrame) -> None:
    """Add the miss-attribution ground truth of a `run` to the twin's pods, from its result frame
    (integer sums, so exactly what `_process` accumulates request by request)."""
    agg = requests.group_by("pod_index").agg(
        requests=pl.len(),
        prompt_tokens=pl.col("prompt_tokens").sum(),
        hit_tokens=(pl.col("gpu_hit_tokens") + pl.col("cpu_hit_tokens") + pl.col("l2_hit_tokens")).sum(),
        cold_tokens=pl.col("cold_tokens").sum(),
        capacity_tokens=pl.col("capacity_tokens").sum(),
        routing_tokens=pl.col("routing_tokens").sum(),
        tail_tokens=pl.col("tail_tokens").sum(),
    )
    for row in agg.iter_rows(named=True):
        t: MissTotals = twin._pods[row.pop("pod_index")].truth
        for name, v in row.items():
            setattr(t, name, getattr(t, name) + int(v))
        t.seen_tokens += int(row["prompt_tokens"] - row["tail_tokens"] - row["cold_tokens"])
