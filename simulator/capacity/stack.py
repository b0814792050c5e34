"""LRU reuse distances of a block-reference stream, in one vectorised pass (exact or SHARDS-sampled).

A stream is a sequence of keys grouped into requests (`starts[r]` is the index of request r's
first reference; len(starts) = requests + 1). A request looks its keys up before it stores any of
them, so the distance of a reference is taken at the start of its request: the number of distinct
keys referenced after the previous reference of the same key and before the request began. An LRU
tier of C keys holds the key at lookup exactly when that distance is < C (Mattson's inclusion
property), so one pass gives the hit count at every capacity at once.

Exact distances: with p the previous reference of key k and s the start of its request,
distance = (s - 1 - p) - #{reuse references t < s whose previous reference lies after p}, a
two-dimensional dominance count answered offline by a wavelet matrix (one stable partition per
bit of the position: O(n log n) element operations in numpy, no Python loop per reference).

Sampled distances (SHARDS, Waldspurger et al., FAST'15): keep the references whose key hashes
below `rate` x 2^64, compute the exact distances of that sub-stream and divide them by `rate`.
The hash is a fixed bijective mix of the key, so a key is either always or never sampled.
"""
from __future__ import annotations

import numpy as np

NEVER = np.int64(1 << 62)  # the distance of a first reference: no capacity holds it
_M1 = np.uint64(0xBF58476D1CE4E5B9)
_M2 = np.uint64(0x94D049BB133111EB)


def previous_reference(keys: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(index of the previous reference of each key, -1 for a first one; the references in key
    order, by position within a key)."""
    n = len(keys)
    prev = np.full(n, -1, dtype=np.int64)
    if n < 2:
        return prev, np.arange(n, dtype=np.int64)
    pos_bits = int(n - 1).bit_length()
    lo, hi = int(keys.min()), int(keys.max())
    if lo >= 0 and hi < (1 << (62 - pos_bits)):  # small keys: one unstable sort of (key, position)
        order = np.argsort((keys.astype(np.int64) << pos_bits) | np.arange(n, dtype=np.int64))
    else:
        order = np.argsort(keys, kind="stable")
    sk = keys[order]
    same = sk[1:] == sk[:-1]
    prev[order[1:][same]] = order[:-1][same]
    return prev, order


def _request_of(starts: np.ndarray, n: int) -> np.ndarray:
    counts = np.diff(starts)
    return np.repeat(np.arange(len(counts), dtype=np.int64), counts)[:n]


def _later_reuses_before(values: np.ndarray, q_before: np.ndarray, q_values: np.ndarray) -> np.ndarray:
    """For each query (T, V): how many of the first T points have a value > V.

    `values`: the points' values in time order (distinct, >= 0). A wavelet matrix over the values,
    one level per bit from the top: each level stably partitions the points by that bit, and every
    query follows its own value's bits down, adding the points in its range whose bit is 1 where
    the query's is 0. All queries move together, so each level is a few numpy passes.
    """
    m, out = len(values), np.zeros(len(q_before), dtype=np.int64)
    if not m or not len(q_before):
        return out
    bits = max(int(max(int(values.max()), int(q_values.max()), 1)).bit_length(), 1)
    dt = np.int32 if m < (1 << 30) and bits < 30 else np.int64  # 2 x positions must fit
    cur = values.astype(dt)
    qv = q_values.astype(dt)
    lo = np.zeros(len(q_before), dtype=dt)
    hi = q_before.astype(dt)
    zeros_before = np.zeros(m + 1, dtype=dt)
    index = np.arange(m, dtype=dt)
    nxt = np.empty_like(cur)
    for level in range(bits - 1, -1, -1):
        bit = (cur >> level) & 1
        np.cumsum(1 - bit, out=zeros_before[1:])
        nz = zeros_before[-1]
        z_lo, z_hi = zeros_before[lo], zeros_before[hi]
        q_one = (qv >> level) & 1
        out += (1 - q_one) * ((hi - lo) - (z_hi - z_lo))
        lo = z_lo + q_one * (nz + lo - 2 * z_lo)
        hi = z_hi + q_one * (nz + hi - 2 * z_hi)
        # stable partition: zeros keep their order first, then the ones
        zb = zeros_before[:-1]
        nxt[zb + bit * (nz + index - 2 * zb)] = cur
        cur, nxt = nxt, cur
    return out


def reuse_distances(keys: np.ndarray, starts: np.ndarray) -> np.ndarray:
    """Exact LRU distance of every reference at the start of its request (int64; NEVER if first).

    `keys`: int64 or uint64 keys in reference order; `starts`: request boundaries (see module doc).
    A key repeated inside one request gets the distance of its first reference there.
    """
    keys = np.asarray(keys)
    n = len(keys)
    starts = np.asarray(starts, dtype=np.int64)
    dist = np.full(n, NEVER, dtype=np.int64)
    if not n:
        return dist
    prev, order = previous_reference(keys)
    s = starts[:-1][_request_of(starts, n)]
    inside = prev >= s  # a repeat inside its own request
    reuse = np.flatnonzero((prev >= 0) & ~inside)  # previous reference before this request began
    # every reuse t (a key referenced at t, previously at prev[t]) is a point; reference i asks
    # how many reuses before its request's start s re-reference something after prev[i]
    is_point = prev >= 0
    points_before = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(is_point, out=points_before[1:])
    nested = _later_reuses_before(prev[is_point], points_before[s[reuse]], prev[reuse])
    dist[reuse] = (s[reuse] - 1 - prev[reuse]) - nested
    if inside.any():  # a repeat takes the distance of the key's first reference in the request
        in_order = inside[order]
        anchor = np.where(in_order, -1, np.arange(n, dtype=np.int64))
        np.maximum.accumulate(anchor, out=anchor)
        dist[order[in_order]] = dist[order[anchor[in_order]]]
    return dist


def key_hash(keys: np.ndarray) -> np.ndarray:
    """A fixed 64-bit mix of the keys (SplitMix64 finaliser), uniform for sampling."""
    with np.errstate(over="ignore"):
        z = np.asarray(keys).astype(np.uint64) + np.uint64(0x9E3779B97F4A7C15)
        z = (z ^ (z >> np.uint64(30))) * _M1
        z = (z ^ (z >> np.uint64(27))) * _M2
        return z ^ (z >> np.uint64(31))


def sample_mask(keys: np.ndarray, rate: float) -> np.ndarray:
    """SHARDS spatial sampling: the references whose key hash is below rate x 2^64."""
    if not 0.0 < rate <= 1.0:
        raise ValueError(f"sample rate: must be in (0, 1], got {rate!r}")
    if rate >= 1.0:
        return np.ones(len(keys), dtype=bool)
    threshold = np.uint64(min(int(rate * 2.0 ** 64), (1 << 64) - 1))
    return key_hash(keys) < threshold


def sampled_reuse_distances(keys: np.ndarray, starts: np.ndarray, rate: float) -> tuple[np.ndarray, np.ndarray]:
    """(positions of the sampled references, their distances rescaled by 1 / rate; NEVER if first)."""
    keys = np.asarray(keys)
    starts = np.asarray(starts, dtype=np.int64)
    keep = sample_mask(keys, rate)
    positions = np.flatnonzero(keep)
    # request boundaries of the sub-stream: how many sampled references precede each start
    cum = np.zeros(len(keys) + 1, dtype=np.int64)
    np.cumsum(keep, out=cum[1:])
    sub = reuse_distances(keys[positions], cum[starts])
    scaled = sub.copy()
    finite = sub != NEVER
    scaled[finite] = np.floor(sub[finite] / rate).astype(np.int64)
    return positions, scaled
