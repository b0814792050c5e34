"""The twin's tier updates with an event sink attached: the same stores as `Twin._process`,
announcing each tier's net change per request as BlockStored / BlockRemoved events.

A real engine announces its blocks at the engine's block size whatever the connector's chunk
size. The twin's workloads identify prompts per 512 tokens (Mooncake `hash_ids`), so a chunk above
512 tokens is announced as its 512-token blocks (hashes `chunking.chunk_hashes(hash_ids, length,
512)`, chained to the block before); chunks of 512 tokens or less are announced as themselves."""
from __future__ import annotations

from typing import Any, Protocol

from contracts.events import BlockRemoved, BlockStored, EventSink
from simulator.chunking import BLOCK_TOKENS
from simulator.policies import Policy


class TracedPod(Protocol):
    """What the traced update reads of one pod of the twin (simulator.twin._Pod)."""

    name: str
    totals: Any
    gpu: Policy | None
    cpu: Policy | None


class TracedTwin(Protocol):
    """What the traced update reads of the twin (simulator.twin.Twin): the shared L2 pool and its
    watermarks, the event sink, the current time and the chunk size. A protocol, so this module
    does not import the twin that imports it."""

    _l2: Policy | None
    _l2_high: int
    _l2_low: int
    _sink: EventSink | None
    _now: float
    _chunk: int
    _chunk_blocks: dict[int, tuple[int, ...]]  # the blocks announced for a chunk above 512 tokens
    _native: bool


def store_traced(twin: TracedTwin, pod: TracedPod, chunks: list[int], g: int, cpu_keys: list[int], l2_keys: list[int],
                 computed: list[int], blocks: list[int] | None = None) -> int:
    """The tier updates with an event sink: announce each tier's net change; returns L2 evictions.
    `blocks`: the prompt's 512-token block hashes (chunks above 512 tokens are announced as them)."""
    t, n = pod.totals, len(chunks)
    gpu, cpu = pod.gpu, pod.cpu
    tail = twin._native  # vLLM's native tiering: last chunk first, its store policy (ClusterSpec.native_tiering)
    if gpu is not None:
        if g and not tail:
            gpu.touch_many(chunks[:g])
        if g < n:
            fresh = {h for h in chunks[g:] if h not in gpu}
            evicted = gpu.insert_many(chunks[::-1] if tail else chunks[g:] if g else chunks)
            if evicted:
                t.gpu_evicted_chunks += len(evicted)
            emit_changes(twin, pod.name, chunks, range(g, n), fresh, evicted, gpu, "GPU", blocks)
        elif g and tail:
            gpu.touch_many(chunks[::-1])
    if cpu is not None:
        to_cpu = l2_keys + computed if l2_keys else computed
        if tail and not (cpu_keys or l2_keys):
            to_cpu = chunks  # vLLM: a request without a connector hit offers its whole prompt
        if cpu_keys and not (tail and to_cpu):
            cpu.touch_many(cpu_keys[::-1] if tail else cpu_keys)
        if to_cpu:
            fresh = {h for h in to_cpu if h not in cpu}
            evicted = cpu.insert_many((cpu_keys + to_cpu)[::-1] if tail else to_cpu)
            t.cpu_stored_chunks += len(to_cpu)
            t.store_requests += 1
            if evicted:
                t.cpu_evicted_chunks += len(evicted)
                t.cpu_evict_events += 1
            batch = set(to_cpu)
            emit_changes(twin, pod.name, chunks, [i for i in range(n) if chunks[i] in batch], fresh,
                         evicted, cpu, "CPU", blocks)
    l2_pool = twin._l2
    l2_evicted = 0
    if l2_pool is not None:
        if l2_keys:
            l2_pool.touch_many(l2_keys)
        if computed:
            l2_evicted = len(l2_pool.insert_many(computed))
            if len(l2_pool) > twin._l2_high:
                l2_evicted += len(l2_pool.shrink_to(twin._l2_low))
    return l2_evicted

def emit_changes(twin: TracedTwin, pod: str, chunks: list[int], batch_pos, fresh: set[int], evicted: list[int],
                 tier: Policy, medium: str, blocks: list[int] | None = None) -> None:
    """Announce one request's net change to a tier: removals first, then stores.

    Removed: victims that were resident before the request (one hash per event). Stored: one
    BlockStored per contiguous run of the request's chunks that are resident now and were
    not before (or were evicted and stored again by this request). A chunk stored and evicted
    by the same request is not announced at all. With `blocks` (chunks above 512 tokens) each
    chunk is announced as its 512-token blocks: a removed chunk removes its blocks.
    """
    sink, now, c = twin._sink, twin._now, twin._chunk
    assert sink is not None
    known = twin._chunk_blocks
    gone: set[int] = set()
    for h in evicted:
        if h not in fresh and h not in gone:  # a victim can be re-stored and evicted again in one batch
            sink(BlockRemoved(now, pod, known.get(h, (h,)), medium))
        gone.add(h)
    new_pos = [i for i in batch_pos if chunks[i] in tier and (chunks[i] in fresh or chunks[i] in gone)]
    i = 0
    while i < len(new_pos):
        j = i
        while j + 1 < len(new_pos) and new_pos[j + 1] == new_pos[j] + 1:
            j += 1
        first, last = new_pos[i], new_pos[j]
        if blocks is None:
            parent = chunks[first - 1] if first else None
            sink(BlockStored(now, pod, tuple(chunks[first:last + 1]), parent, c, medium))
        else:
            k = c // BLOCK_TOKENS
            for x in range(first, last + 1):
                known[chunks[x]] = tuple(blocks[x * k:(x + 1) * k])
            parent = blocks[first * k - 1] if first else None
            sink(BlockStored(now, pod, tuple(blocks[first * k:(last + 1) * k]), parent, BLOCK_TOKENS, medium))
        i = j + 1
