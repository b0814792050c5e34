"""Rebuilt chains -> the twin's workload frame (`simulator.records.WORKLOAD_SCHEMA`).

The twin identifies a prompt by one chained id per 512 tokens (`hash_ids`) and derives its chunk
hashes for any chunk size from them (`simulator.chunking`). The events carry one hash per engine
block of B tokens. 512-token id j is taken from the engine block holding token 512 x j:
- B <= 512 (vLLM's 16-token blocks, LMCache chunks of 256): id j is the hash of the first block of
  the j-th 512 tokens. Two prompts then share id j exactly when they share that block; where they
  part later inside the same 512 tokens the twin sees them share more than they do (up to 511
  tokens per prompt), and sharing finer than 512 tokens is replayed at 512;
- B > 512 (1,024 or 2,048-token chunks): the B / 512 ids of one block are its hash for the last
  and a mix of it for the others, so a replay at chunk size B matches the engine's blocks exactly,
  and one at a finer chunk size sees sharing only in whole B-token blocks.

`input_length` is the whole blocks' tokens plus, when the counters allow it, the pod's mean
partial last block (history.py): the partial block itself is never hashed, so which prompts have
longer tails is invisible (at most B - 1 tokens a prompt). Where that tail reaches past the last
512-token id, the prompt gets ids of its own for it (`TAIL_HASH_BASE` up: a partial block is never
stored, so it is shared with nothing), so every prompt's ids cover its length as the twin expects.
"""
from __future__ import annotations

import numpy as np
import polars as pl

from agent.kvevents.rebuild.chains import Rebuilt
from agent.kvevents.rebuild.log import mix64
from simulator.chunking import BLOCK_TOKENS
from simulator.records import PLACEMENT_COLUMN, WORKLOAD_SCHEMA

TAIL_HASH_BASE = 1 << 62  # ids of partial last blocks: never shared, apart from every stored block
TAIL_IDS = 64  # at most this many tail ids a request (a tail is under one engine block)


def block_ids(r: Rebuilt, default_block: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(flat 512-token ids as int64, offsets, input lengths) of every rebuilt request."""
    bsize = np.where(r.block_size > 0, r.block_size, default_block).astype(np.int64)
    lengths = r.lengths.astype(np.int64)
    tokens = lengths * bsize
    nids = -(-tokens // BLOCK_TOKENS)
    offsets = np.zeros(r.requests + 1, dtype=np.int64)
    np.cumsum(nids, out=offsets[1:])
    req = np.repeat(np.arange(r.requests, dtype=np.int64), nids)
    j = np.arange(int(offsets[-1]), dtype=np.int64) - offsets[:-1][req]
    b = bsize[req]
    block = (BLOCK_TOKENS * j) // b
    h = r.flat[r.offsets[:-1][req] + block]
    # B > 512: the 512-token ids inside one block before its last get a mix of its hash
    last_in_block = (BLOCK_TOKENS * (j + 1) >= (block + 1) * b) | (b <= BLOCK_TOKENS)
    inner = ~last_in_block
    if inner.any():
        k = (j - (block * b) // BLOCK_TOKENS + 1).astype(np.uint64)
        with np.errstate(over="ignore"):
            h = np.where(inner, mix64(h ^ (k * np.uint64(0x9E3779B97F4A7C15))), h)
    return h.view(np.int64), offsets, tokens


def covered(ids: np.ndarray, offsets: np.ndarray, lengths: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(ids, offsets) with each request's 512-token ids extended to cover `lengths` tokens: the ids
    past its stored blocks are its own (`TAIL_HASH_BASE` + request x `TAIL_IDS` + k)."""
    have = np.diff(offsets)
    extra = np.clip(-(-lengths // BLOCK_TOKENS) - have, 0, TAIL_IDS)
    if not extra.any():
        return ids, offsets
    total = have + extra
    out_off = np.zeros(len(total) + 1, dtype=np.int64)
    np.cumsum(total, out=out_off[1:])
    req = np.repeat(np.arange(len(total), dtype=np.int64), total)
    k = np.arange(int(out_off[-1]), dtype=np.int64) - out_off[:-1][req]
    stored = k < have[req]
    out = np.empty(int(out_off[-1]), dtype=np.int64)
    out[stored] = ids[offsets[:-1][req[stored]] + k[stored]]
    out[~stored] = TAIL_HASH_BASE + req[~stored] * TAIL_IDS + (k[~stored] - have[req[~stored]])
    return out, out_off


def to_frame(r: Rebuilt, *, output_tokens: int, default_block: int = 16, tails: np.ndarray | None = None
             ) -> pl.DataFrame:
    """The rebuilt requests as a workload frame (arrival order; `timestamp_ms` from their ts), with
    the engine that served each (`PLACEMENT_COLUMN`, engines numbered densely: each its own cache).
    `tails`: tokens added to each prompt past its whole blocks (an estimate: see history.py)."""
    if r.requests == 0:
        return pl.DataFrame(schema=WORKLOAD_SCHEMA)
    ids, offsets, tokens = block_ids(r, default_block)
    lengths = tokens if tails is None else tokens + np.asarray(tails, dtype=np.int64)
    ids, offsets = covered(ids, offsets, lengths)
    req = np.repeat(np.arange(r.requests, dtype=np.int64), np.diff(offsets))
    lists = (pl.DataFrame({"req": req, "h": ids}).group_by("req", maintain_order=True)
             .agg(pl.col("h")).sort("req"))
    hash_col = pl.Series("hash_ids", [[]] * r.requests, dtype=pl.List(pl.Int64()))
    if lists.height == r.requests:
        hash_col = lists["h"].alias("hash_ids")
    else:  # a request of zero blocks has no row in the group-by
        full = pl.DataFrame({"req": np.arange(r.requests, dtype=np.int64)}).join(lists, on="req", how="left")
        hash_col = full["h"].fill_null(pl.lit([], dtype=pl.List(pl.Int64()))).alias("hash_ids")
    frame = pl.DataFrame({
        "timestamp_ms": np.floor(r.ts * 1000.0).astype(np.int64),
        "input_length": lengths,
        "output_length": np.full(r.requests, output_tokens, dtype=np.int64),
        "hash_ids": hash_col.cast(pl.List(pl.Int64())),
        "session_id": pl.Series([None] * r.requests, dtype=pl.Int64()),
        "phase": np.zeros(r.requests, dtype=np.int32),
        PLACEMENT_COLUMN: np.unique(r.eng, return_inverse=True)[1].astype(np.int32),
    }, schema={**WORKLOAD_SCHEMA, PLACEMENT_COLUMN: pl.Int32()})
    return frame.sort("timestamp_ms", maintain_order=True)
