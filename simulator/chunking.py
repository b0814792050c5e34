"""Chained chunk hashes for any LMCache chunk size, derived from Mooncake's 512-token block hashes.

A Mooncake `hash_ids[i]` identifies the first (i+1) x 512 tokens of a prompt. For a chunk size C
the prompt has `input_length // C` full chunks (a partial last chunk is never stored or reused).
Chunk j is identified by:

- C <= 512 (r = 512 / C sub-chunks per block): block b = j // r and sub-chunk s = j % r. Two
  prompts share chunk j exactly when they share block b (we cannot know finer-grained sharing,
  so the derivation is conservative);
- C > 512 (k = C / 512 blocks per chunk): the hash of the chunk's last block, (j + 1) x k - 1,
  which already covers the whole prefix.

The key `(block_id << 6 | s)` (k-chunks use s = 0) is XOR-ed with a per-chunk-size salt and mixed
with the SplitMix64 finaliser, a bijection on 64-bit integers: distinct (block, sub-chunk) pairs
never collide, and the result is an unsigned 64-bit hash like vLLM's. `chunk_hashes` (scalar, one
request) and `chunk_hash_table` (numpy, a whole workload) give identical values.
"""
from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from contracts.knobs import CHUNK_TOKEN_CHOICES, KnobError

BLOCK_TOKENS = 512
_MASK = (1 << 64) - 1
_M1 = 0xBF58476D1CE4E5B9
_M2 = 0x94D049BB133111EB


def _salt(chunk_tokens: int) -> int:
    return (chunk_tokens * 0x9E3779B97F4A7C15) & _MASK


def _check_chunk(chunk_tokens: int) -> None:
    if chunk_tokens not in CHUNK_TOKEN_CHOICES:
        raise KnobError(
            f"chunk_tokens: invalid value {chunk_tokens!r}; valid choices: {', '.join(map(str, CHUNK_TOKEN_CHOICES))}"
        )


def _mix(z: int) -> int:
    z = ((z ^ (z >> 30)) * _M1) & _MASK
    z = ((z ^ (z >> 27)) * _M2) & _MASK
    return z ^ (z >> 31)


def chunk_hashes(hash_ids: Sequence[int], input_length: int, chunk_tokens: int) -> list[int]:
    """Chained hashes of the full `chunk_tokens`-token chunks of one prompt (pure function)."""
    _check_chunk(chunk_tokens)
    n = input_length // chunk_tokens
    salt = _salt(chunk_tokens)
    if chunk_tokens <= BLOCK_TOKENS:
        r = BLOCK_TOKENS // chunk_tokens
        keys = [((hash_ids[j // r] << 6) | (j % r)) & _MASK for j in range(n)]
    else:
        k = chunk_tokens // BLOCK_TOKENS
        keys = [(hash_ids[(j + 1) * k - 1] << 6) & _MASK for j in range(n)]
    return [_mix(key ^ salt) for key in keys]


def chunk_hash_table(
    hash_ids: Sequence[Sequence[int]] | None,
    input_lengths: Sequence[int] | np.ndarray,
    chunk_tokens: int,
    *,
    flat_ids: np.ndarray | None = None,
    block_offsets: np.ndarray | None = None,
) -> tuple[list[int], list[int]]:
    """Chunk hashes of every request at once: (flat list of hashes, offsets with len = requests + 1)."""
    flat, offsets = chunk_hash_array(hash_ids, input_lengths, chunk_tokens, flat_ids=flat_ids,
                                     block_offsets=block_offsets)
    return flat.tolist(), offsets.tolist()


def chunk_hash_array(
    hash_ids: Sequence[Sequence[int]] | None,
    input_lengths: Sequence[int] | np.ndarray,
    chunk_tokens: int,
    *,
    flat_ids: np.ndarray | None = None,
    block_offsets: np.ndarray | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """Like `chunk_hash_table`, as numpy arrays (uint64 hashes, int64 offsets).

    Request i's chunks are `flat[offsets[i]:offsets[i + 1]]`. Pass `flat_ids` (all block ids
    concatenated) and `block_offsets` (start of each request's blocks, len = requests + 1) to
    skip re-flattening (e.g. straight from a polars List column).
    """
    _check_chunk(chunk_tokens)
    lengths = np.asarray(input_lengths, dtype=np.int64)
    if flat_ids is None or block_offsets is None:
        assert hash_ids is not None, "pass hash_ids, or flat_ids with block_offsets"
        counts = np.fromiter((len(h) for h in hash_ids), dtype=np.int64, count=len(lengths))
        block_offsets = np.zeros(len(lengths) + 1, dtype=np.int64)
        np.cumsum(counts, out=block_offsets[1:])
        flat_ids = np.fromiter((x for h in hash_ids for x in h), dtype=np.int64, count=int(block_offsets[-1]))
    n_chunks = lengths // chunk_tokens
    offsets = np.zeros(len(lengths) + 1, dtype=np.int64)
    np.cumsum(n_chunks, out=offsets[1:])
    total = int(offsets[-1])
    req = np.repeat(np.arange(len(lengths), dtype=np.int64), n_chunks)
    j = np.arange(total, dtype=np.int64) - offsets[:-1][req]
    if chunk_tokens <= BLOCK_TOKENS:
        r = BLOCK_TOKENS // chunk_tokens
        block_pos, sub = j // r, j % r
    else:
        k = chunk_tokens // BLOCK_TOKENS
        block_pos, sub = (j + 1) * k - 1, np.zeros_like(j)
    ids = np.asarray(flat_ids, dtype=np.int64)[block_offsets[:-1][req] + block_pos]
    with np.errstate(over="ignore"):
        z = (ids.astype(np.uint64) << np.uint64(6)) | sub.astype(np.uint64)
        z ^= np.uint64(_salt(chunk_tokens))
        z = (z ^ (z >> np.uint64(30))) * np.uint64(_M1)
        z = (z ^ (z >> np.uint64(27))) * np.uint64(_M2)
        z = z ^ (z >> np.uint64(31))
    return z, offsets
