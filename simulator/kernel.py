"""The compiled batch replay (`simulator.kernel_core`, numba): the arrays in, the twin's state out.

`supports(twin)` tells whether it models the twin exactly: what `simulator.fastloop` covers (no
event sink; GPU LRU; CPU and L2 LRU or FIFO; any router but `kvaware`) on a twin that has served
nothing yet (a batch replay's), with numba importable. `run` replays the whole workload and
leaves the twin as `Twin._process` would: tiers (resident keys in recency order), router memory,
in-flight requests, pod queues, eviction and L2 counters. Pods' metric counters and latency
samples are not filled, as in `fastloop` (nothing reads them after a batch replay).

The first call in a process compiles the kernel (a few seconds) or loads it from numba's cache
beside this module (about a second).
"""
from __future__ import annotations

import heapq
from collections.abc import Callable
from typing import TYPE_CHECKING

import numpy as np

from simulator import fastloop
from simulator.policies import LRU
from simulator.router import PlacedRouter, PrefixAwareRouter, RoundRobinRouter

if TYPE_CHECKING:
    from simulator.twin import Twin

_MASK = (1 << 64) - 1
_core = None


def _load():
    """The compiled module, or None when numba is not installed."""
    global _core
    if _core is None:
        try:
            from simulator import kernel_core
        except ImportError:
            _core = False
        else:
            _core = kernel_core
    return _core or None


def supports(twin: Twin) -> bool:
    if not fastloop.supports(twin) or _load() is None:
        return False
    tiers = [p.gpu for p in twin._pods] + [p.cpu for p in twin._pods] + [twin._l2]
    router = twin._router
    fresh_router = not isinstance(router, PrefixAwareRouter) or not any(router._seen)
    return (twin._now == 0.0 and not twin._heap and not any(twin._loads) and fresh_router
            and all(t is None or not len(t) for t in tiers) and all(p.free_at == 0.0 for p in twin._pods)
            and (not isinstance(router, (RoundRobinRouter, PlacedRouter)) or router._next == 0))


def _session_pods(sessions: list[int | None], pods: int) -> np.ndarray:
    """SessionRouter's fixed pod per session id (-1: no session, the least-loaded pod)."""
    return np.array([-1 if s is None else ((((s & _MASK) * 0x9E3779B97F4A7C15) & _MASK) >> 32) % pods
                     for s in sessions], dtype=np.int64)


def _fixed_pods(router, sessions: list[int | None], pods: int, total: int) -> np.ndarray:
    """Each request's pod, for the routers that fix it before the run (-1: the least-loaded pod):
    SessionRouter's per session id, PlacedRouter's as given (it must cover every request)."""
    if isinstance(router, PlacedRouter):
        if len(router.placement) < total:
            raise ValueError(f"placement: covers {len(router.placement)} requests, not {total}")
        return np.asarray(router.placement[:total], dtype=np.int64)
    return _session_pods(sessions, pods)


def _config(twin: Twin) -> tuple[np.ndarray, np.ndarray]:
    core = _core
    router = twin._router
    kind = (core.ROUTER_PREFIX if isinstance(router, PrefixAwareRouter)
            else core.ROUTER_RR if isinstance(router, RoundRobinRouter) else core.ROUTER_SESSION)
    rs = twin.cluster.router
    cfg = np.array([rs.prefix_load_ratio, rs.prefix_load_slack, twin._prefill_s, twin._overhead_s, twin._decode_s,
                    twin._attention_s, twin._overhead_busy_s, twin._load_delay_s, twin._cpu_chunk_s,
                    twin._l2_chunk_s, twin._l2_retrieve_s, twin._w_chunk_s, twin._w_byte_s,
                    twin._cpu_fixed_s], dtype=np.float64)
    pod0, l2 = twin._pods[0], twin._l2
    icfg = np.array([len(twin._pods), twin._chunk, kind,
                     pod0.gpu.capacity if pod0.gpu is not None else 0,
                     pod0.cpu.capacity if pod0.cpu is not None else 0,
                     l2.capacity if l2 is not None else 0,
                     pod0.cpu is not None and type(pod0.cpu) is LRU,
                     l2 is not None and type(l2) is LRU,
                     twin._l2_high, twin._l2_low, twin._l2_min, twin._chunk_bytes], dtype=np.int64)
    return cfg, icfg


def run(
    twin: Twin,
    times: list[float],
    prompts: list[int],
    outputs: list[int],
    flat: np.ndarray,
    offsets: np.ndarray,
    colds: np.ndarray,
    freshes: np.ndarray,
    sessions: list[int | None],
    progress: Callable[[int, int], None] | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """Replay every request on a fresh twin (`supports`); returns (int columns, float columns) of
    the rows: pod index, prompt, GPU/CPU/L2 hit, computed, cold, capacity, routing, tail tokens;
    time, queue delay, TTFT, L2 read and L2 write seconds."""
    core = _load()
    pods = len(twin._pods)
    total = len(times)
    n_ids = int(flat.max()) + 1 if len(flat) else 0
    widest = int(np.diff(offsets).max()) if total else 0
    cfg, icfg = _config(twin)
    caps = [icfg[core.I_GPU_CAP]] * pods + [icfg[core.I_CPU_CAP]] * pods + [icfg[core.I_L2_CAP]]
    tiers = core.new_tiers(n_ids, np.array([c + widest if c else 1 for c in caps], np.int64))
    prefix = icfg[core.I_ROUTER] == core.ROUTER_PREFIX
    mem = np.zeros((n_ids if prefix else 0, pods), np.uint8)
    heap = (np.empty(total, np.float64), np.empty(total, np.float64), np.empty(total, np.int64))
    st, fst = np.zeros(16, np.int64), np.zeros(4, np.float64)
    loads, free_at = np.zeros(pods, np.int64), np.zeros(pods, np.float64)
    g_ev, c_ev = np.zeros(pods, np.int64), np.zeros(pods, np.int64)
    sess = _fixed_pods(twin._router, sessions, pods, total) if icfg[core.I_ROUTER] == core.ROUTER_SESSION \
        else np.zeros(0, np.int64)
    out_i, out_f = np.empty((total, 10), np.int64), np.empty((total, 5), np.float64)
    args = (np.asarray(times, np.float64), np.asarray(prompts, np.int64), np.asarray(outputs, np.int64), flat,
            offsets, colds, freshes, sess, cfg, icfg, tiers, mem, np.zeros(n_ids, np.int64), loads, free_at, heap,
            g_ev, c_ev, st, fst, np.empty(widest, np.int64), np.empty(widest, np.int64), np.empty(widest, np.int64),
            out_i, out_f)
    if progress is None:
        core.run_range(0, total, *args)
    else:  # the same calls as the Python loops: after request i for every i % step == 0
        step = max(total // 200, 1)
        done = 0
        for i in range(0, total, step):
            core.run_range(done, i + 1, *args)
            done = i + 1
            progress(i, total)
        core.run_range(done, total, *args)
    if total:
        twin._now = float(fst[core.FS_NOW])
    _write_back(twin, core, total > 0, tiers, mem, st, fst, loads, free_at, heap, g_ev, c_ev)
    if isinstance(twin._router, PlacedRouter):
        twin._router._next = total
    return out_i, out_f


def _write_back(twin: Twin, core, served: bool, tiers, mem, st, fst, loads, free_at, heap, g_ev, c_ev) -> None:
    pods = twin._pods
    npods = len(pods)
    router = twin._router
    if isinstance(router, PrefixAwareRouter):
        if served:
            router._last = (int(st[core.S_LAST_POD]), int(st[core.S_LAST_LEN]))
        for q, seen in enumerate(router._seen):
            seen.update(np.flatnonzero(mem[:, q]).tolist())
    elif isinstance(router, RoundRobinRouter):
        router._next = int(st[core.S_NEXT])
    tier_objs = [p.gpu for p in pods] + [p.cpu for p in pods] + [twin._l2]
    for t, tier in enumerate(tier_objs):
        if tier is not None:
            keys = core.tier_order(tiers, t).tolist()
            tier._resident = set(keys)
            tier._log = keys
            tier._lo = 0
            tier._stale = {}
    n = int(st[core.S_HEAP_N])
    h_end, h_start, h_pod = heap
    twin._heap = list(zip(h_end[:n].tolist(), h_start[:n].tolist(), h_pod[:n].tolist(), strict=True))
    heapq.heapify(twin._heap)
    twin._loads[:] = loads.tolist()
    for q in range(npods):
        p = pods[q]
        p.free_at = float(free_at[q])
        p.totals.gpu_evicted_chunks += int(g_ev[q])
        p.totals.cpu_evicted_chunks += int(c_ev[q])
    lt = twin._l2_totals
    lt.evicted_chunks += int(st[core.S_L2_EVICTED])
    lt.eviction_runs += int(st[core.S_L2_RUNS])
    lt.read_bytes += int(st[core.S_READ_BYTES])
    lt.read_chunks += int(st[core.S_READ_CHUNKS])
    lt.read_time_s += float(fst[core.FS_READ_TIME])
    lt.write_bytes += int(st[core.S_WRITE_BYTES])
    lt.write_chunks += int(st[core.S_WRITE_CHUNKS])
    lt.write_time_s += float(fst[core.FS_WRITE_TIME])
