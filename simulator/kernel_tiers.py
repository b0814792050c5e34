"""The twin's LRU/FIFO tiers for the compiled replay (`simulator.kernel_core`), numba.

Every tier is a doubly linked list of slots from its own pool (its capacity plus the widest
prompt: a store may overfill it before evicting), over the workload's dense chunk ids
(0 .. n_ids - 1). Tier t is pod q's GPU for t = q, its CPU for t = pods + q, the shared L2 for
t = 2 pods. `tiers` is the tuple of `new_tiers`:

    0 slot_of[key, t]  the slot of key in tier t (0: never stored there)
    1 skey[slot]       the key a slot holds (-1: free)
    2, 3 sprev, snext  the list links (0: none; slot 0 is never used); snext also links free slots
    4, 5 head, tail    per tier: the oldest and the most recent slot
    6 size             per tier: resident keys
    7 free             per tier: the first free slot

A key is resident in tier t while its slot there still holds it, so an eviction frees the
victim's slot without touching the victim's row of `slot_of`, and one row per key holds its place
in every tier. A hit moves the slot to the tail; eviction pops the head (an OrderedDict's
move_to_end / popitem(last=False)).
"""
from __future__ import annotations

import numba as nb
import numpy as np

_JIT = {"cache": True, "nogil": True}
_INLINE = {**_JIT, "inline": "always"}  # numba-level inlining: no tuple of arrays passed per call (3x faster)


@nb.njit(**_INLINE)
def _unlink(tiers, t, s):
    sprev, snext, head, tail = tiers[2], tiers[3], tiers[4], tiers[5]
    p = sprev[s]
    n = snext[s]
    if p:
        snext[p] = n
    else:
        head[t] = n
    if n:
        sprev[n] = p
    else:
        tail[t] = p


@nb.njit(**_INLINE)
def _push(tiers, t, s):
    sprev, snext, head, tail = tiers[2], tiers[3], tiers[4], tiers[5]
    last = tail[t]
    sprev[s] = last
    snext[s] = 0
    if last:
        snext[last] = s
    else:
        head[t] = s
    tail[t] = s


@nb.njit(**_INLINE)
def has(tiers, k, t):
    """Whether key k is resident in tier t: its slot still holds it (an evicted key's row is left
    as it was, so eviction touches only the tier's own pool)."""
    s = tiers[0][k, t]
    return s != 0 and tiers[1][s] == k


@nb.njit(**_INLINE)
def _add(tiers, t, k):
    """Key k becomes tier t's most recent key (it was not resident)."""
    slot_of, skey, snext, size, free = tiers[0], tiers[1], tiers[3], tiers[6], tiers[7]
    s = free[t]
    free[t] = snext[s]
    skey[s] = k
    slot_of[k, t] = s
    _push(tiers, t, s)
    size[t] += 1


@nb.njit(**_INLINE)
def touch(tiers, t, k):
    """A hit: move the key to the most recent end (LRU)."""
    s = tiers[0][k, t]
    if tiers[5][t] != s:
        _unlink(tiers, t, s)
        _push(tiers, t, s)


@nb.njit(**_INLINE)
def evict(tiers, t, over):
    """Evict the `over` oldest keys of tier t; their slots go back to the tier's free list."""
    skey, snext, head, size, free = tiers[1], tiers[3], tiers[4], tiers[6], tiers[7]
    for _ in range(over):
        s = head[t]
        _unlink(tiers, t, s)
        skey[s] = -1
        snext[s] = free[t]
        free[t] = s
    size[t] -= over


@nb.njit(**_JIT)
def _bulk(tiers, keys, a, b, t, cap):
    """Store keys[a:b], none resident: a repeated key keeps its first position, then the oldest
    keys leave (the batch's own first keys too when the batch exceeds the tier). Returns evictions."""
    size = tiers[6]
    for j in range(a, b):
        k = keys[j]
        if not has(tiers, k, t):
            _add(tiers, t, k)
    over = size[t] - cap
    if over > 0:
        evict(tiers, t, over)
        return over
    return 0


@nb.njit(**_JIT)
def store(tiers, keys, a, b, split, t, cap, lru):
    """`Policy.insert_count(keys[a:b], fresh=b - a - split)` for LRU (lru) or FIFO: the first `split`
    keys key by key when one of them is resident (a resident key is a hit), the rest in bulk."""
    size = tiers[6]
    hit = False
    for j in range(a, a + split):
        if has(tiers, keys[j], t):
            hit = True
            break
    if not hit:
        return _bulk(tiers, keys, a, b, t, cap)
    ev = 0
    for j in range(a, a + split):
        k = keys[j]
        if has(tiers, k, t):
            if lru:
                touch(tiers, t, k)
        else:
            if size[t] >= cap:
                evict(tiers, t, 1)
                ev += 1
            _add(tiers, t, k)
    if a + split < b:
        ev += _bulk(tiers, keys, a + split, b, t, cap)
    return ev


@nb.njit(**_JIT)
def new_tiers(n_ids, pool):
    """Empty tiers: pool[t] slots for tier t (its capacity plus the widest prompt, at least 1)."""
    n = len(pool)
    total = 1 + pool.sum()  # slot 0 is "none"
    snext = np.zeros(total, np.int32)
    free = np.zeros(n, np.int64)
    s = 1
    for t in range(n):
        free[t] = s
        for j in range(pool[t] - 1):
            snext[s + j] = s + j + 1
        s += pool[t]
    return (np.zeros((n_ids, n), np.int32), np.full(total, -1, np.int64), np.zeros(total, np.int32), snext,
            np.zeros(n, np.int64), np.zeros(n, np.int64), np.zeros(n, np.int64), free)


@nb.njit(**_JIT)
def tier_order(tiers, t):
    """Tier t's resident keys, oldest first."""
    skey, snext, head, size = tiers[1], tiers[3], tiers[4], tiers[6]
    out = np.empty(size[t], dtype=np.int64)
    s = head[t]
    for j in range(size[t]):
        out[j] = skey[s]
        s = snext[s]
    return out
