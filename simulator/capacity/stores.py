"""The CPU tier's curve from the GPU's block-store events alone (vLLM KV events, or the twin's).

LMCache is asked only for what the GPU does not hold, and every chunk the GPU stores is one LMCache
stores or is hit on (docs/twin.md, "Capacity curves"). So a pod's stream of GPU `BlockStored`
events is, up to the chunks the GPU still held past its prefix hit (stored nowhere, so never
announced), the reference stream of that pod's CPU buffer: its LRU curve says what a CPU buffer of
N GiB would have hit, from live events, without knowing the prompts. A pod's stores at one instant
(one engine step; one request in the twin) are looked up together. The GPU's own curve is not in
the events: a GPU hit publishes nothing.
"""
from __future__ import annotations

from collections.abc import Iterable

import numpy as np

from contracts.events import BlockStored
from simulator.capacity.curves import TierCurve, _prefix_max
from simulator.capacity.stack import NEVER, reuse_distances


def cpu_curve_from_stores(events: Iterable[object], *, chunk_tokens: int, kv_bytes_per_token: int,
                          current_chunks: int = 0) -> TierCurve:
    """The CPU curve of the GPU stores in `events` (other events are skipped). Hit ratio = hit
    tokens / stored tokens.

    Blocks of another size than `chunk_tokens` (vLLM's 16-token blocks against LMCache's chunks)
    are counted in chunks: a distance of d blocks is d x block_size / chunk_tokens chunks."""
    pods: dict[str, int] = {}
    hashes: list[int] = []
    pod_of: list[int] = []
    batch_of: list[int] = []
    block_tokens = chunk_tokens
    last: tuple[int, float] | None = None
    batches = 0
    for ev in events:
        if not isinstance(ev, BlockStored) or ev.medium != "GPU" or not ev.block_hashes:
            continue
        pod = pods.setdefault(ev.pod, len(pods))
        block_tokens = ev.block_size
        if last != (pod, ev.ts):  # another lookup: another pod or another instant
            batches += 1
            last = (pod, ev.ts)
        m = len(ev.block_hashes)
        hashes.extend(ev.block_hashes)
        pod_of.extend([pod] * m)
        batch_of.extend([batches - 1] * m)
    return cpu_curve_from_arrays(np.array(hashes, dtype=np.uint64), np.array(pod_of, dtype=np.int64),
                                 np.array(batch_of, dtype=np.int64), block_tokens=block_tokens,
                                 chunk_tokens=chunk_tokens, kv_bytes_per_token=kv_bytes_per_token,
                                 current_chunks=current_chunks)


def cpu_curve_from_arrays(hashes: np.ndarray, engines: np.ndarray, batches: np.ndarray, *, block_tokens: int,
                          chunk_tokens: int, kv_bytes_per_token: int, current_chunks: int = 0) -> TierCurve:
    """The same from arrays: per stored block its hash, its engine (small int) and its lookup
    (batch id, non-decreasing in time order)."""
    n_pods = int(engines.max()) + 1 if len(engines) else 1
    n_batches = len(np.unique(batches)) if len(batches) else 0
    if not len(hashes):
        return TierCurve("cpu", chunk_tokens, kv_bytes_per_token, n_pods, 0, 0, 0, current_chunks, 1.0,
                         np.zeros(0, dtype=np.int64), np.zeros(0))
    _, ids = np.unique(hashes.astype(np.uint64), return_inverse=True)
    # each engine's stream on its own (stable by engine keeps time order), keys distinct per engine
    order = np.argsort(engines, kind="stable")
    keys = ids.reshape(-1)[order].astype(np.int64) * n_pods + engines[order]
    b = batches[order]
    new = np.ones(len(b), dtype=bool)
    new[1:] = (b[1:] != b[:-1]) | (engines[order][1:] != engines[order][:-1])
    seg = np.cumsum(new) - 1
    starts = np.concatenate([np.flatnonzero(new), [len(b)]]).astype(np.int64)
    dist = reuse_distances(keys, starts)
    pm = _prefix_max(dist, seg)
    pm = pm[pm != NEVER]
    if block_tokens != chunk_tokens:
        pm = pm * block_tokens // chunk_tokens
    levels, counts = np.unique(pm, return_counts=True)
    per_chunk = block_tokens / chunk_tokens  # hits are counted in chunks of `chunk_tokens`
    stored_tokens = len(keys) * block_tokens
    return TierCurve("cpu", chunk_tokens, kv_bytes_per_token, n_pods, n_batches, stored_tokens, stored_tokens,
                     current_chunks, 1.0, levels, np.cumsum(counts).astype(np.float64) * per_chunk)
