"""One request through the twin, the general engine (`Twin._process`): route, look up GPU -> CPU
-> L2, attribute the misses, update the tiers, queue the prefill, count.

`simulator.fastloop` and the compiled `simulator.kernel_core` run the same steps over a whole
workload and must stay identical to `step` request by request (tests/test_sim_fastpath.py).
The functions take the twin (`simulator.twin.Twin`, not imported: it imports this module) and
read and write its state in place.
"""
from __future__ import annotations

from heapq import heappop, heappush
from itertools import filterfalse, takewhile
from typing import Any

from simulator.twin_events import store_traced

_EMPTY: list[int] = []


def step(
    twin: Any, now: float, prompt: int, out_len: int, chunks: list[int], session: int | None, cold: int = -1,
    fresh: int = 0, blocks: list[int] | None = None,
) -> tuple:
    """The hot path: one request, returned as a row (see `replay.RESULT_SCHEMA`).

    `cold`: how many of the request's chunks never appeared in an earlier request, when the
    caller precomputed it for a whole workload (batch replay); -1 = track it here.
    `fresh`: the length of a suffix of `chunks` the caller knows to be new to the twin (distinct,
    in no earlier request), so resident in no tier: lookups stop before it and stores skip the
    membership checks. 0 = nothing known (always correct).
    `blocks`: the prompt's 512-token block hashes, with an event sink and chunks above 512 tokens:
    the events announce each chunk as its blocks (twin_events.emit_changes).
    """
    pods, router, c = twin._pods, twin._router, twin._chunk
    twin._now = now
    heap, loads = twin._heap, twin._loads
    while heap and heap[0][0] <= now:
        loads[heappop(heap)[2]] -= 1
    est = twin._estimate(chunks, prompt, now) if router.needs_estimate else None
    n = len(chunks)
    known = n - fresh  # nothing gets past chunks[known]: no lookup, no router memory
    idx = router.choose(chunks, session, loads, est, known)
    router.record(idx, chunks)
    pod = pods[idx]
    gpu, cpu = pod.gpu, pod.cpu
    l2 = twin._l2 if prompt >= twin._l2_min else None
    g = len(list(takewhile(gpu._resident.__contains__, chunks))) if gpu is not None else 0
    if g == known or (cpu is None and l2 is None):
        cpu_keys = l2_keys = _EMPTY
        k = g
    else:
        _, cpu_keys, l2_keys, k = twin._lookup(pod, chunks, l2, g)
    computed = chunks[k:] if k else chunks
    n_cpu, n_l2 = len(cpu_keys), len(l2_keys)
    hit = k * c
    computed_tokens = prompt - hit
    tail = prompt - n * c

    cold, capacity, routing = _miss_truth(twin, pod, computed, cold)
    truth = pod.truth
    truth.requests += 1
    truth.prompt_tokens += prompt
    truth.hit_tokens += hit
    truth.cold_tokens += cold * c
    truth.capacity_tokens += capacity * c
    truth.routing_tokens += routing * c
    truth.tail_tokens += tail
    truth.seen_tokens += (n - cold) * c

    if twin._sink is not None:
        l2_evicted = store_traced(twin, pod, chunks, g, cpu_keys, l2_keys, computed, blocks)
    else:
        l2_evicted = _store(twin, pod, chunks, g, k, fresh, cpu_keys, l2_keys, computed)
    l2_write_s = _l2_write(twin, pod, computed, l2_evicted)

    # -- latency -------------------------------------------------------------------------------
    busy = (computed_tokens if computed_tokens > 0 else 1) * twin._prefill_s + twin._overhead_busy_s
    if twin._attention_s:
        busy += max(computed_tokens, 1) * (hit + 0.5 * max(computed_tokens, 1)) * twin._attention_s
    extra = twin._overhead_s
    l2_read_s = 0.0
    if n_cpu:
        busy += n_cpu * twin._cpu_chunk_s
        if not n_l2:
            extra += twin._cpu_fixed_s
    if n_l2:
        l2_read_s = n_l2 * twin._l2_chunk_s
        busy += l2_read_s
        extra += twin._l2_retrieve_s
    free_at = pod.free_at
    start = max(now, free_at)
    pod.free_at = start + busy
    queue = start - now
    ttft = queue + busy + extra
    heappush(heap, (now + ttft + out_len * twin._decode_s, start, idx))
    if twin._load_delay_s:  # the load term: a pure offset on the latency, not on the pods' schedule
        queue += twin._load_delay_s
        ttft += twin._load_delay_s
    loads[idx] += 1
    obs = pod.obs
    obs.ttft_s.append(ttft)
    obs.queue_delay_s.append(queue)
    _count(twin, pod, prompt, out_len, g, n_cpu, n_l2, computed_tokens, l2_read_s)
    return (idx, now, prompt, g * c, n_cpu * c, n_l2 * c, computed_tokens, queue, ttft, l2_read_s, l2_write_s,
            cold * c, capacity * c, routing * c, tail)


def _miss_truth(twin: Any, pod: Any, computed: list[int], cold: int) -> tuple[int, int, int]:
    """Ground truth of the computed full chunks: (cold, capacity, routing) misses, in chunks."""
    pods = twin._pods
    gpu, cpu = pod.gpu, pod.cpu
    capacity = routing = 0
    if not computed:
        return 0, 0, 0
    if cold < 0:
        seen = twin._seen
        seen_missed = seen.intersection(computed)
        cold = len(computed) - len(seen_missed)
        seen.update(computed)
    else:  # never-seen chunks are a suffix of the prompt (chained hashes), hence of `computed`
        seen_missed = computed[:len(computed) - cold]
    if seen_missed:
        if len(pods) > 1:
            if gpu is not None:
                seen_missed = filterfalse(gpu._resident.__contains__, seen_missed)
            if cpu is not None:
                seen_missed = filterfalse(cpu._resident.__contains__, seen_missed)
            want = set(seen_missed)
            if want:
                found: set[int] = set()
                for q in pods:
                    if q is not pod:
                        if q.gpu is not None:
                            found.update(filter(q.gpu._resident.__contains__, want))
                        if q.cpu is not None:
                            found.update(filter(q.cpu._resident.__contains__, want))
                routing = len(found)
            capacity = len(computed) - cold - routing
        else:
            capacity = len(seen_missed)
    return cold, capacity, routing


def _store(twin: Any, pod: Any, chunks: list[int], g: int, k: int, fresh: int, cpu_keys: list[int],
           l2_keys: list[int], computed: list[int]) -> int:
    """Promote hits upwards and write the computed chunks through (no event sink); returns the L2
    evictions. chunks[len - fresh:] are in no tier: the tiers store them in bulk."""
    t, n = pod.totals, len(chunks)
    gpu, cpu = pod.gpu, pod.cpu
    n_cpu, n_l2 = len(cpu_keys), len(l2_keys)
    native = twin._native  # ClusterSpec.native_tiering: vLLM's order and store policy
    if gpu is not None:
        if native:  # the whole prompt, last chunk first: hits are touched, new chunks stored
            evicted = gpu.insert_count(chunks[::-1]) if n else 0
            if evicted:
                t.gpu_evicted_chunks += evicted
        else:
            if g:
                gpu.touch_many(chunks[:g])
            if g < n:
                evicted = gpu.insert_count(chunks[g:] if g else chunks, fresh)
                if evicted:
                    t.gpu_evicted_chunks += evicted
    if cpu is not None:
        if n_cpu and not native:
            cpu.touch_many(cpu_keys)
        if native and n:
            # a connector hit: what it loaded and what follows; none: the whole prompt
            offered = cpu_keys + l2_keys + computed if n_cpu or n_l2 else chunks
            evicted = cpu.insert_count(offered[::-1])
        elif computed or n_l2:
            evicted = cpu.insert_count(l2_keys + computed if n_l2 else computed, fresh)
        else:
            evicted = -1
        if evicted >= 0:
            t.cpu_stored_chunks += n_l2 + n - k
            t.store_requests += 1
            if evicted:
                t.cpu_evicted_chunks += evicted
                t.cpu_evict_events += 1
    l2_evicted = 0
    l2_pool = twin._l2
    if l2_pool is not None:
        if n_l2:
            l2_pool.touch_many(l2_keys)
        if computed:
            l2_evicted = l2_pool.insert_count(computed, fresh)
            if len(l2_pool) > twin._l2_high:
                l2_evicted += len(l2_pool.shrink_to(twin._l2_low))
    return l2_evicted


def _l2_write(twin: Any, pod: Any, computed: list[int], l2_evicted: int) -> float:
    """Count the asynchronous L2 write of the computed chunks; returns its seconds (0: none)."""
    if twin._l2 is None or not computed:
        return 0.0
    t = pod.totals
    lt = twin._l2_totals
    if l2_evicted:
        lt.evicted_chunks += l2_evicted
        lt.eviction_runs += 1
    m = len(computed)
    nbytes = m * twin._chunk_bytes
    l2_write_s = m * twin._w_chunk_s + nbytes * twin._w_byte_s
    lt.write_bytes += nbytes
    lt.write_chunks += m
    lt.write_time_s += l2_write_s
    t.l2_write_bytes += nbytes
    t.l2_write_requests += 1
    pod.obs.l2_write_s.append(l2_write_s)
    if pod.cpu is None:
        t.store_requests += 1
    return l2_write_s


def _count(twin: Any, pod: Any, prompt: int, out_len: int, g: int, n_cpu: int, n_l2: int, computed_tokens: int,
           l2_read_s: float) -> None:
    """The pod's metric counters and the L2 read totals for one request."""
    c = twin._chunk
    t = pod.totals
    t.requests += 1
    t.prompt_tokens += prompt
    t.generation_tokens += out_len
    t.gpu_hit_tokens += g * c
    t.computed_tokens += computed_tokens
    if not twin._connector:
        return
    t.ext_query_tokens += prompt - g * c
    if n_cpu or n_l2:
        t.retrieve_requests += 1
        t.cpu_hit_tokens += n_cpu * c
        t.cpu_hit_chunks += n_cpu
        if n_l2:
            nbytes = n_l2 * twin._chunk_bytes
            pod.obs.l2_read_s.append(l2_read_s)
            lt = twin._l2_totals
            lt.read_bytes += nbytes
            lt.read_chunks += n_l2
            lt.read_time_s += l2_read_s
            t.l2_hit_tokens += n_l2 * c
            t.l2_hit_chunks += n_l2
            t.l2_read_bytes += nbytes
            t.l2_read_chunks += n_l2
            t.l2_read_requests += 1
    else:
        t.zero_hit_lookups += 1
