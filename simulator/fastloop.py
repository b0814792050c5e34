"""The batch replay loop with the common tier policies written out (no per-chunk method calls).

`Twin._process` is the general engine: one method call per request, one per tier operation.
For a whole workload with no event sink, the tuner's usual settings (GPU LRU, CPU and L2 LRU or
FIFO, any router but `kvaware`) run here instead: one loop over the requests keeps every tier's
set, recency log and stale counts in locals and does the common cases inline (prefix lookups,
hits, bulk stores of chunks new to the workload, evictions of a log stretch without stale
entries); the rare cases (a stale entry among the victims, a re-stored resident chunk, L2
watermark shrinks) call the policy's own methods, which work on the same state. The results are
identical to `_process` request by request (tests/test_sim_fastpath.py; docs/twin.md).

Only what `replay` reports is kept up to date: per-request rows, evictions, the L2 pool's
counters and the miss-attribution ground truth (pods' metric counters and latency samples are
not filled: nothing reads them after a batch replay).
"""
from __future__ import annotations

from bisect import bisect_left
from collections import _count_elements  # type: ignore[attr-defined]
from collections.abc import Callable
from heapq import heappop, heappush
from itertools import filterfalse, islice, takewhile
from typing import TYPE_CHECKING

import polars as pl

from simulator.counters import MissTotals
from simulator.policies import FIFO, LRU
from simulator.router import PrefixAwareRouter, RoundRobinRouter, SessionRouter

if TYPE_CHECKING:
    from simulator.twin import Twin

_EMPTY: list[int] = []
_LOG_TYPES = (LRU, FIFO)


def supports(twin: Twin) -> bool:
    """Whether `run` models this twin exactly (otherwise use `Twin._process`)."""
    if twin._sink is not None or twin._native:
        return False
    if not isinstance(twin._router, (PrefixAwareRouter, RoundRobinRouter, SessionRouter)):
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
    pods = twin._pods
    npods = len(pods)
    router = twin._router
    c = twin._chunk
    heap, loads = twin._heap, twin._loads
    # tiers: policy, resident set, recency log, stale counts, capacity, "hits move it" (LRU)
    gpus = [p.gpu for p in pods]
    cpus = [p.cpu for p in pods]
    gpu_on = gpus[0] is not None
    cpu_on = cpus[0] is not None
    g_res = [g._resident if g is not None else None for g in gpus]
    c_res = [p._resident if p is not None else None for p in cpus]
    g_log = [g._log if g is not None else None for g in gpus]
    c_log = [p._log if p is not None else None for p in cpus]
    g_stale = [g._stale if g is not None else None for g in gpus]
    c_stale = [p._stale if p is not None else None for p in cpus]
    g_cap = gpus[0].capacity if gpu_on else 0
    c_cap = cpus[0].capacity if cpu_on else 0
    c_lru = cpu_on and type(cpus[0]) is LRU
    l2p = twin._l2
    l2_on = l2p is not None
    if l2_on:
        l_res, l_log, l_stale, l_cap = l2p._resident, l2p._log, l2p._stale, l2p.capacity
        l_lru = type(l2p) is LRU
        in_l2_all = l_res.__contains__
    l2_high, l2_low, l2_min = twin._l2_high, twin._l2_low, twin._l2_min
    g_in = [s.__contains__ if s is not None else None for s in g_res]
    c_in = [s.__contains__ if s is not None else None for s in c_res]
    g_ev = [0] * npods
    c_ev = [0] * npods
    free_at = [p.free_at for p in pods]
    # routers
    prefix = isinstance(router, PrefixAwareRouter)
    rr = isinstance(router, RoundRobinRouter)
    if prefix:
        mem = router._seen
        mem_in = [s.__contains__ for s in mem]
        ratio, slack = router.settings.prefix_load_ratio, router.settings.prefix_load_slack
        last = router._last
    if rr:
        nxt = router._next
    choose = router.choose
    # latency constants
    prefill_s, overhead_s, decode_s = twin._prefill_s, twin._overhead_s, twin._decode_s
    attention_s, overhead_busy_s = twin._attention_s, twin._overhead_busy_s
    load_delay_s = twin._load_delay_s
    cpu_chunk_s, l2_chunk_s, l2_retrieve_s = twin._cpu_chunk_s, twin._l2_chunk_s, twin._l2_retrieve_s
    cpu_fixed_s = twin._cpu_fixed_s
    w_chunk_s, w_byte_s, chunk_bytes = twin._w_chunk_s, twin._w_byte_s, twin._chunk_bytes
    l2_evicted_total = l2_runs = 0
    read_bytes = read_chunks = write_bytes = write_chunks = 0
    read_time = write_time = 0
    rows: list[tuple] = []
    append = rows.append
    total = len(times)
    step = max(total // 200, 1)
    now = twin._now
    for i in range(total):
        now = times[i]
        prompt = prompts[i]
        chunks = flat[offsets[i]:offsets[i + 1]]
        cold = colds[i]
        fresh = freshes[i]
        while heap and heap[0][0] <= now:
            loads[heappop(heap)[2]] -= 1
        n = len(chunks)
        known = n - fresh
        # -- route ---------------------------------------------------------------------------------
        if prefix:
            if known:
                cap = min(loads) * ratio + slack
                head, last_known = chunks[0], chunks[known - 1]
                back = None
                idx, best_len, best_load = -1, -1, 0
                for q in range(npods):
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
            else:  # nothing remembered anywhere: the first least-loaded pod (always under the cap)
                idx = loads.index(min(loads))
                best_len = 0
            last = (idx, best_len)
            mem[idx].update(chunks[best_len:] if best_len else chunks)
        elif rr:
            idx = nxt
            nxt = (idx + 1) % npods
        else:
            idx = choose(chunks, sessions[i], loads, None, known)
        # -- lookup: GPU prefix, then CPU / L2 runs ------------------------------------------------
        l2 = l2_on and prompt >= l2_min
        if gpu_on:
            g = len(list(takewhile(g_in[idx], chunks))) if known else 0
        else:
            g = 0
        cpu_keys = l2_keys = _EMPTY
        k = g
        if g != known and (cpu_on or l2):
            rest = chunks[g:] if g else chunks
            if not l2:
                a = len(list(takewhile(c_in[idx], rest)))
                if a:
                    cpu_keys = rest[:a]
                    k = g + a
            elif not cpu_on:
                b = len(list(takewhile(in_l2_all, rest)))
                if b:
                    l2_keys = rest[:b]
                    k = g + b
            else:
                in_cpu = c_in[idx]
                m = len(rest)
                j = 0
                cpu_keys = []
                l2_keys = []
                while j < m:
                    a = len(list(takewhile(in_cpu, islice(rest, j, None)))) if j else len(list(takewhile(in_cpu, rest)))
                    if a:
                        cpu_keys += rest[j:j + a]
                        j += a
                        if j >= m:
                            break
                    b = len(list(takewhile(in_l2_all, islice(rest, j, None))))
                    if not b:
                        break
                    run_ = rest[j:j + b]
                    if any(map(in_cpu, run_)):
                        run_ = run_[:list(map(in_cpu, run_)).index(True)]
                    l2_keys += run_
                    j += len(run_)
                k = g + j
        computed = chunks[k:] if k else chunks
        ncomp = n - k
        n_cpu, n_l2 = len(cpu_keys), len(l2_keys)
        # -- miss attribution ----------------------------------------------------------------------
        capacity = routing = 0
        if not ncomp:
            cold = 0
        elif ncomp > cold:
            seen_missed = computed[:ncomp - cold]
            if npods > 1:
                if gpu_on:
                    seen_missed = filterfalse(g_in[idx], seen_missed)
                if cpu_on:
                    seen_missed = filterfalse(c_in[idx], seen_missed)
                want = set(seen_missed)
                if want:
                    found: set[int] = set()
                    for q in range(npods):
                        if q != idx:
                            if gpu_on:
                                found.update(filter(g_in[q], want))
                            if cpu_on:
                                found.update(filter(c_in[q], want))
                    routing = len(found)
                capacity = ncomp - cold - routing
            else:
                capacity = ncomp - cold
        # -- tier updates (inline LRU/FIFO; rare cases through the policy methods) -----------------
        if gpu_on:
            if g:
                keys = chunks[:g]
                g_log[idx] += keys
                _count_elements(g_stale[idx], keys)
            if g < n:
                keys = chunks[g:] if g else chunks
                split = n - g - fresh
                s = g_res[idx]
                if split and not s.isdisjoint(keys[:split] if fresh else keys):
                    ev = gpus[idx].insert_count(keys, fresh)
                else:
                    size = len(s)
                    s.update(keys)
                    log = g_log[idx]
                    if len(s) - size == n - g:
                        log += keys
                    else:
                        log += dict.fromkeys(keys)
                    ev = len(s) - g_cap
                    if ev > 0:
                        p = gpus[idx]
                        lo = p._lo
                        st = g_stale[idx]
                        w = log[lo:lo + ev]
                        if st and not st.keys().isdisjoint(w):
                            if len(st) == 1:  # one hot key, typically a head every prompt shares
                                ((k1, n1),) = st.items()
                                occ = w.count(k1)
                            if len(st) != 1 or occ > n1:
                                p._drop(ev)
                            else:  # only stale entries of it here: the window leaves, then `occ` more
                                if occ == n1:
                                    del st[k1]
                                else:
                                    st[k1] = n1 - occ
                                s.difference_update(w)
                                s.add(k1)
                                lo += ev
                                w = log[lo:lo + occ]
                                if st and k1 in w:
                                    p._lo = lo
                                    p._drop(occ)
                                else:
                                    s.difference_update(w)
                                    lo += occ
                                    if lo > 4096 and lo > len(log) >> 1:
                                        del log[:lo]
                                        lo = 0
                                    p._lo = lo
                        else:
                            s.difference_update(w)
                            lo += ev
                            if lo > 4096 and lo > len(log) >> 1:
                                del log[:lo]
                                lo = 0
                            p._lo = lo
                if ev > 0:
                    g_ev[idx] += ev
        if cpu_on:
            if n_cpu and c_lru:
                c_log[idx] += cpu_keys
                _count_elements(c_stale[idx], cpu_keys)
            if ncomp or n_l2:
                keys = l2_keys + computed if n_l2 else computed
                m = len(keys)
                split = m - fresh
                s = c_res[idx]
                if split and not s.isdisjoint(keys[:split] if fresh else keys):
                    ev = cpus[idx].insert_count(keys, fresh)
                else:
                    size = len(s)
                    s.update(keys)
                    log = c_log[idx]
                    if len(s) - size == m:
                        log += keys
                    else:
                        log += dict.fromkeys(keys)
                    ev = len(s) - c_cap
                    if ev > 0:
                        p = cpus[idx]
                        lo = p._lo
                        st = c_stale[idx]
                        w = log[lo:lo + ev]
                        if st and not st.keys().isdisjoint(w):
                            p._drop(ev)
                        else:
                            s.difference_update(w)
                            lo += ev
                            if lo > 4096 and lo > len(log) >> 1:
                                del log[:lo]
                                lo = 0
                            p._lo = lo
                if ev > 0:
                    c_ev[idx] += ev
        l2_write_s = 0.0
        if l2_on:
            if n_l2 and l_lru:
                l_log += l2_keys
                _count_elements(l_stale, l2_keys)
            if ncomp:
                split = ncomp - fresh
                if split and not l_res.isdisjoint(computed[:split] if fresh else computed):
                    ev = l2p.insert_count(computed, fresh)
                else:
                    size = len(l_res)
                    l_res.update(computed)
                    if len(l_res) - size == ncomp:
                        l_log += computed
                    else:
                        l_log += dict.fromkeys(computed)
                    ev = len(l_res) - l_cap
                    if ev > 0:
                        lo = l2p._lo
                        w = l_log[lo:lo + ev]
                        if l_stale and not l_stale.keys().isdisjoint(w):
                            l2p._drop(ev)
                        else:
                            l_res.difference_update(w)
                            lo += ev
                            if lo > 4096 and lo > len(l_log) >> 1:
                                del l_log[:lo]
                                lo = 0
                            l2p._lo = lo
                    else:
                        ev = 0
                if len(l_res) > l2_high:
                    ev += len(l2p.shrink_to(l2_low))
                if ev:
                    l2_evicted_total += ev
                    l2_runs += 1
                nbytes = ncomp * chunk_bytes
                l2_write_s = ncomp * w_chunk_s + nbytes * w_byte_s
                write_bytes += nbytes
                write_chunks += ncomp
                write_time += l2_write_s
        # -- latency -------------------------------------------------------------------------------
        computed_tokens = prompt - k * c
        busy = (computed_tokens if computed_tokens > 0 else 1) * prefill_s + overhead_busy_s
        if attention_s:
            busy += max(computed_tokens, 1) * (k * c + 0.5 * max(computed_tokens, 1)) * attention_s
        extra = overhead_s
        l2_read_s = 0.0
        if n_cpu:
            busy += n_cpu * cpu_chunk_s
            if not n_l2:
                extra += cpu_fixed_s
        if n_l2:
            l2_read_s = n_l2 * l2_chunk_s
            busy += l2_read_s
            extra += l2_retrieve_s
            read_bytes += n_l2 * chunk_bytes
            read_chunks += n_l2
            read_time += l2_read_s
        fa = free_at[idx]
        start = now if now >= fa else fa  # noqa: FURB136 (max() is a call; this is the hot loop)
        free_at[idx] = start + busy
        queue = start - now
        ttft = queue + busy + extra
        heappush(heap, (now + ttft + outputs[i] * decode_s, start, idx))
        if load_delay_s:  # the load term (ClusterSpec.load_delay_s), as in Twin._process
            queue += load_delay_s
            ttft += load_delay_s
        loads[idx] += 1
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
    for q, p in enumerate(pods):
        p.free_at = free_at[q]
        p.totals.gpu_evicted_chunks += g_ev[q]
        p.totals.cpu_evicted_chunks += c_ev[q]
    lt = twin._l2_totals
    lt.evicted_chunks += l2_evicted_total
    lt.eviction_runs += l2_runs
    lt.read_bytes += read_bytes
    lt.read_chunks += read_chunks
    lt.read_time_s += read_time
    lt.write_bytes += write_bytes
    lt.write_chunks += write_chunks
    lt.write_time_s += write_time
    return rows


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
