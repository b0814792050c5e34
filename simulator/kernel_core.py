"""The batch replay loop compiled with numba, over dense chunk ids.

Same model, step for step, as `simulator.fastloop` (and so as `Twin._process`): route, look up
GPU -> CPU -> L2, attribute the misses, update the tiers, queue the prefill. The tiers are
`simulator.kernel_tiers` (slot-pool linked lists); the router memory is a per-pod byte column, the
in-flight requests a binary heap of arrays. The arithmetic of the latency model is written in the
same order as in `Twin._process`, so every float is bit for bit the same.

`simulator.kernel` prepares the arrays, runs `run_range` and writes the state back to the twin.
"""
from __future__ import annotations

import numba as nb

from simulator.kernel_tiers import evict, has, new_tiers, store, tier_order, touch  # noqa: F401 (kernel.py: new_tiers, tier_order)

_JIT = {"cache": True, "nogil": True}

# indices into the `cfg` float array and the `icfg` int array of run_range
F_RATIO, F_SLACK, F_PREFILL, F_OVERHEAD, F_DECODE, F_ATTN, F_OVER_BUSY, F_LOAD_DELAY = range(8)
F_CPU_CHUNK, F_L2_CHUNK, F_L2_RETRIEVE, F_W_CHUNK, F_W_BYTE, F_CPU_FIXED = range(8, 14)
I_PODS, I_CHUNK, I_ROUTER, I_GPU_CAP, I_CPU_CAP, I_L2_CAP, I_CPU_LRU, I_L2_LRU = range(8)
I_L2_HIGH, I_L2_LOW, I_L2_MIN, I_CHUNK_BYTES = range(8, 12)
ROUTER_PREFIX, ROUTER_RR, ROUTER_SESSION = 0, 1, 2
# indices into `st` (int64 state) and `fst` (float state)
S_NEXT, S_LAST_POD, S_LAST_LEN, S_HEAP_N, S_STAMP = range(5)
S_L2_EVICTED, S_L2_RUNS, S_READ_BYTES, S_READ_CHUNKS, S_WRITE_BYTES, S_WRITE_CHUNKS = range(5, 11)
FS_NOW, FS_READ_TIME, FS_WRITE_TIME = range(3)


@nb.njit(**_JIT)
def _least_loaded(loads):
    best = 0
    for q in range(1, len(loads)):
        if loads[q] < loads[best]:
            best = q
    return best


@nb.njit(**_JIT)
def _route_prefix(flat, o, n, known, mem, loads, ratio, slack):
    """PrefixAwareRouter.choose (longest remembered prefix under the load cap) and record."""
    if known:
        cap = loads.min() * ratio + slack
        first, last_known = flat[o], flat[o + known - 1]
        idx, best_len, best_load = -1, -1, 0
        for q in range(len(loads)):
            load = loads[q]
            if load > cap:
                continue
            if not mem[first, q]:
                m = 0
            elif mem[last_known, q]:
                m = known
            else:  # bisect_left on the reversed known prefix, where membership ascends
                lo, hi = 0, known
                while lo < hi:
                    mid = (lo + hi) // 2
                    if not mem[flat[o + known - 1 - mid], q]:
                        lo = mid + 1
                    else:
                        hi = mid
                m = known - lo
            if m > best_len or (m == best_len and load < best_load):
                idx, best_len, best_load = q, m, load
    else:
        idx, best_len = _least_loaded(loads), 0
    for j in range(o + best_len, o + n):
        mem[flat[j], idx] = 1
    return idx, best_len


@nb.njit(**_JIT)
def _lookup(tiers, flat, o, n, known, q, pods, gpu_on, cpu_on, l2, ckeys, lkeys):
    """(GPU prefix, CPU hits, L2 hits, first computed index); the hit keys go to ckeys/lkeys."""
    g = 0
    if gpu_on and known:
        while g < n and has(tiers, flat[o + g], q):
            g += 1
    nc = nl = 0
    k = g
    if g != known and (cpu_on or l2):
        c_t, l_t = pods + q, 2 * pods
        while k < n:
            key = flat[o + k]
            if cpu_on and has(tiers, key, c_t):
                ckeys[nc] = key
                nc += 1
            elif l2 and has(tiers, key, l_t):
                lkeys[nl] = key
                nl += 1
            else:
                break
            k += 1
    return g, nc, nl, k


@nb.njit(**_JIT)
def _routing_misses(tiers, flat, a, b, q, pods, gpu_on, cpu_on, stamp, sid):
    """Distinct keys of flat[a:b] in neither of pod q's private tiers but in another pod's."""
    found = 0
    for j in range(a, b):
        key = flat[j]
        if (gpu_on and has(tiers, key, q)) or (cpu_on and has(tiers, key, pods + q)) or stamp[key] == sid:
            continue
        stamp[key] = sid
        for r in range(pods):
            if r != q and ((gpu_on and has(tiers, key, r)) or (cpu_on and has(tiers, key, pods + r))):
                found += 1
                break
    return found


@nb.njit(**_JIT)
def _heap_pop(h_end, h_start, h_pod, n):
    """Remove the root of the binary min-heap (by end time) of n entries; returns n - 1."""
    n -= 1
    e, s, p = h_end[n], h_start[n], h_pod[n]
    i = 0
    while True:
        c = 2 * i + 1
        if c >= n:
            break
        if c + 1 < n and h_end[c + 1] < h_end[c]:
            c += 1
        if h_end[c] >= e:
            break
        h_end[i], h_start[i], h_pod[i] = h_end[c], h_start[c], h_pod[c]
        i = c
    h_end[i], h_start[i], h_pod[i] = e, s, p
    return n


@nb.njit(**_JIT)
def _heap_push(h_end, h_start, h_pod, n, e, s, p):
    i = n
    while i:
        parent = (i - 1) // 2
        if h_end[parent] <= e:
            break
        h_end[i], h_start[i], h_pod[i] = h_end[parent], h_start[parent], h_pod[parent]
        i = parent
    h_end[i], h_start[i], h_pod[i] = e, s, p
    return n + 1


@nb.njit(**_JIT)
def _update_tiers(tiers, flat, o, n, g, k, fresh, q, ckeys, nc, lkeys, nl, buf, icfg, g_ev, c_ev, st):
    """Promote hits and write the computed chunks through GPU, CPU and L2 (fastloop's order);
    returns the L2 write count (the computed chunks when L2 is on, else 0)."""
    pods = icfg[I_PODS]
    gpu_on, cpu_on, l2_on = icfg[I_GPU_CAP] > 0, icfg[I_CPU_CAP] > 0, icfg[I_L2_CAP] > 0
    ncomp = n - k
    if gpu_on:
        for j in range(o, o + g):
            touch(tiers, q, flat[j])
        if g < n:
            g_ev[q] += store(tiers, flat, o + g, o + n, n - g - fresh, q, icfg[I_GPU_CAP], True)
    if cpu_on:
        c_lru = icfg[I_CPU_LRU] != 0
        if nc and c_lru:
            for j in range(nc):
                touch(tiers, pods + q, ckeys[j])
        if ncomp or nl:
            buf[:nl] = lkeys[:nl]
            buf[nl:nl + ncomp] = flat[o + k:o + n]
            m = nl + ncomp
            c_ev[q] += store(tiers, buf, 0, m, m - fresh, pods + q, icfg[I_CPU_CAP], c_lru)
    if not l2_on:
        return 0
    lt = 2 * pods
    l_lru = icfg[I_L2_LRU] != 0
    if nl and l_lru:
        for j in range(nl):
            touch(tiers, lt, lkeys[j])
    if ncomp:
        ev = store(tiers, flat, o + k, o + n, ncomp - fresh, lt, icfg[I_L2_CAP], l_lru)
        size = tiers[6]
        if size[lt] > icfg[I_L2_HIGH]:
            over = size[lt] - icfg[I_L2_LOW]
            if over > 0:
                evict(tiers, lt, over)
                ev += over
        if ev:
            st[S_L2_EVICTED] += ev
            st[S_L2_RUNS] += 1
    return ncomp


@nb.njit(**_JIT)
def run_range(lo, hi, times, prompts, outputs, flat, offsets, colds, freshes, sess_pod, cfg, icfg, tiers, mem,
              stamp, loads, free_at, heap, g_ev, c_ev, st, fst, ckeys, lkeys, buf, out_i, out_f):
    """Replay requests lo..hi-1. out_i columns: pod, prompt, gpu/cpu/l2 hit, computed, cold, capacity,
    routing, tail tokens; out_f: time, queue, ttft, l2 read, l2 write seconds."""
    pods, c, router = icfg[I_PODS], icfg[I_CHUNK], icfg[I_ROUTER]
    gpu_on, cpu_on, l2_on = icfg[I_GPU_CAP] > 0, icfg[I_CPU_CAP] > 0, icfg[I_L2_CAP] > 0
    h_end, h_start, h_pod = heap
    chunk_bytes = icfg[I_CHUNK_BYTES]
    for i in range(lo, hi):
        now = times[i]
        prompt = prompts[i]
        o = offsets[i]
        n = offsets[i + 1] - o
        cold, fresh = colds[i], freshes[i]
        hn = st[S_HEAP_N]
        while hn and h_end[0] <= now:
            loads[h_pod[0]] -= 1
            hn = _heap_pop(h_end, h_start, h_pod, hn)
        known = n - fresh
        if router == ROUTER_PREFIX:
            q, best_len = _route_prefix(flat, o, n, known, mem, loads, cfg[F_RATIO], cfg[F_SLACK])
            st[S_LAST_POD], st[S_LAST_LEN] = q, best_len
        elif router == ROUTER_RR:
            q = st[S_NEXT]
            st[S_NEXT] = (q + 1) % pods
        else:
            q = sess_pod[i] if sess_pod[i] >= 0 else _least_loaded(loads)
        l2 = l2_on and prompt >= icfg[I_L2_MIN]
        g, nc, nl, k = _lookup(tiers, flat, o, n, known, q, pods, gpu_on, cpu_on, l2, ckeys, lkeys)
        ncomp = n - k
        capacity = routing = 0
        if not ncomp:
            cold = 0
        elif ncomp > cold:
            if pods > 1:
                st[S_STAMP] += 1
                routing = _routing_misses(tiers, flat, o + k, o + n - cold, q, pods, gpu_on, cpu_on, stamp,
                                          st[S_STAMP])
            capacity = ncomp - cold - routing
        written = _update_tiers(tiers, flat, o, n, g, k, fresh, q, ckeys, nc, lkeys, nl, buf, icfg, g_ev, c_ev, st)
        l2_write_s = 0.0
        if written:
            nbytes = written * chunk_bytes
            l2_write_s = written * cfg[F_W_CHUNK] + nbytes * cfg[F_W_BYTE]
            st[S_WRITE_BYTES] += nbytes
            st[S_WRITE_CHUNKS] += written
            fst[FS_WRITE_TIME] += l2_write_s
        # latency, as Twin._process computes it
        computed_tokens = prompt - k * c
        busy = (computed_tokens if computed_tokens > 0 else 1) * cfg[F_PREFILL] + cfg[F_OVER_BUSY]
        if cfg[F_ATTN]:
            x = max(computed_tokens, 1)
            busy += x * (k * c + 0.5 * x) * cfg[F_ATTN]
        extra = cfg[F_OVERHEAD]
        l2_read_s = 0.0
        if nc:
            busy += nc * cfg[F_CPU_CHUNK]
            if not nl:
                extra += cfg[F_CPU_FIXED]
        if nl:
            l2_read_s = nl * cfg[F_L2_CHUNK]
            busy += l2_read_s
            extra += cfg[F_L2_RETRIEVE]
            st[S_READ_BYTES] += nl * chunk_bytes
            st[S_READ_CHUNKS] += nl
            fst[FS_READ_TIME] += l2_read_s
        fa = free_at[q]
        start = max(now, fa)
        free_at[q] = start + busy
        queue = start - now
        ttft = queue + busy + extra
        st[S_HEAP_N] = _heap_push(h_end, h_start, h_pod, hn, now + ttft + outputs[i] * cfg[F_DECODE], start, q)
        if cfg[F_LOAD_DELAY]:
            queue += cfg[F_LOAD_DELAY]
            ttft += cfg[F_LOAD_DELAY]
        loads[q] += 1
        oi, of = out_i[i], out_f[i]
        oi[0], oi[1], oi[2], oi[3], oi[4] = q, prompt, g * c, nc * c, nl * c
        oi[5], oi[6], oi[7], oi[8], oi[9] = computed_tokens, cold * c, capacity * c, routing * c, prompt - n * c
        of[0], of[1], of[2], of[3], of[4] = now, queue, ttft, l2_read_s, l2_write_s
        fst[FS_NOW] = now
