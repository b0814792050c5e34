"""A workload frame as the batch replay reads it (pure): the checked frame, its per-request columns
and every request's chunk hashes, and `StreamCache`, which keeps them across replays of one frame.

The trials of a search replay the same stream with different knobs: the columns are the same for
every trial and the chunk hashes the same for every trial of one chunk size, so a search computes
them once per chunk size instead of once per trial (on an hour of a 16-pod fleet, about a quarter
of a trial).
"""
from __future__ import annotations

import dataclasses

import numpy as np
import polars as pl

from simulator.chunking import chunk_hash_array
from simulator.records import check_workload


def workload_chunks(
    workload: pl.DataFrame, chunk_tokens: int, *, dense: bool = False
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """All chunk hashes of a (checked, arrival-ordered) workload frame.

    Returns arrays: (flat hashes (int64 ids when dense, else uint64), offsets per request, cold chunks per request, fresh suffix
    per request). A request's cold chunks are those whose hash appears for the first time in the
    workload. Its fresh suffix is its cold count when those chunks are exactly the last ones of
    the prompt (always so with chained hashes), else 0: the engine may then treat them as resident
    nowhere and remembered by no router. `dense`: replace each hash by a small integer (0 .. number
    of distinct hashes - 1, in order of first appearance; equal hashes get equal ids): the twin
    only compares hashes, and small ints hash and compare faster. Not for runs whose events or
    resident sets must show real hashes.
    """
    counts = workload["hash_ids"].list.len().to_numpy()
    block_offsets = np.zeros(len(counts) + 1, dtype=np.int64)
    np.cumsum(counts, out=block_offsets[1:])
    flat_ids = workload["hash_ids"].explode().drop_nulls().to_numpy()
    flat, offsets = chunk_hash_array(
        None, workload["input_length"].to_numpy(), chunk_tokens, flat_ids=flat_ids, block_offsets=block_offsets
    )
    if dense:
        flat, first = _first_seen_ids(flat)
    else:
        first = pl.Series(flat, dtype=pl.UInt64).is_first_distinct().to_numpy()
    cum = np.zeros(len(first) + 1, dtype=np.int64)
    np.cumsum(first, out=cum[1:])
    cold = cum[offsets[1:]] - cum[offsets[:-1]]
    suffix = cum[offsets[1:]] - cum[offsets[1:] - cold] == cold
    fresh = np.where(suffix, cold, 0)
    return flat, offsets, cold, fresh


def _first_seen_ids(flat: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(Each hash replaced by the rank of its first appearance: 0, 1, 2, ... in workload order;
    whether each position is the first appearance of its hash).

    Chunks of one prompt get neighbouring ids, so they sit in neighbouring slots of the tiers'
    sets (small ints hash to themselves): about a sixth less time in the replay loop than ids in
    hash order.
    """
    first = np.zeros(len(flat), dtype=bool)
    if not len(flat):
        return flat.astype(np.int64), first
    order = np.argsort(flat)
    s = flat[order]
    new_value = np.empty(len(s), dtype=bool)
    new_value[0] = True
    np.not_equal(s[1:], s[:-1], out=new_value[1:])
    group = np.cumsum(new_value) - 1  # value rank, in sorted order
    first_pos = np.minimum.reduceat(order, np.flatnonzero(new_value))  # where each value first appears
    first[first_pos] = True
    rank = np.cumsum(first) - 1  # at a first appearance: how many distinct values came before
    out = np.empty(len(flat), dtype=np.int64)
    out[order] = rank[first_pos][group]
    return out, first


@dataclasses.dataclass(frozen=True)
class Stream:
    """A checked workload frame and its per-request columns as Python lists (what the replay loops read)."""

    frame: pl.DataFrame
    times: list[float]  # arrival, seconds
    prompts: list[int]
    outputs: list[int]
    sessions: list[int | None]


def stream_of(workload: pl.DataFrame) -> Stream:
    frame = check_workload(workload)
    times = [ms / 1000.0 for ms in frame["timestamp_ms"].to_list()]  # exactly as Twin.submit does
    return Stream(frame, times, frame["input_length"].to_list(), frame["output_length"].to_list(),
                  frame["session_id"].to_list())


class StreamCache:
    """The stream and chunk hashes of the last workload frame replayed, kept for the next replay of
    that same frame object (per chunk size and id kind: at most the six chunk sizes times two).

    Nothing here is mutated by a replay, so sharing it leaves every result as a fresh computation
    would. A different frame object (even an equal one) starts the cache afresh; the cache holds
    the frame, so the identity check cannot be fooled by a recycled id. Not thread-safe."""

    def __init__(self) -> None:
        self._workload: pl.DataFrame | None = None
        self._stream: Stream | None = None
        self._chunks: dict[tuple[int, bool], tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]] = {}
        self.hits = 0
        self.misses = 0

    def stream(self, workload: pl.DataFrame) -> Stream:
        if self._workload is not workload or self._stream is None:
            stream = stream_of(workload)  # raises on a bad frame before the cache changes
            self._workload, self._stream, self._chunks = workload, stream, {}
        return self._stream

    def chunks(self, workload: pl.DataFrame, chunk_tokens: int, *,
               dense: bool) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """`workload_chunks(stream(workload).frame, chunk_tokens, dense=dense)`, computed once."""
        frame = self.stream(workload).frame
        key = (chunk_tokens, dense)
        got = self._chunks.get(key)
        if got is None:
            self.misses += 1
            got = self._chunks[key] = workload_chunks(frame, chunk_tokens, dense=dense)
        else:
            self.hits += 1
        return got
