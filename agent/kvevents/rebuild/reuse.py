"""How far back a pod's requests reach for the prefixes they reuse (pure numpy).

A request that stored nothing repeats a prompt its pod still holds (fill.py), but which one is not
in the events. The requests that stored something show how far back the pod's reuses reach: a
rebuilt request's cached prefix (its chain less the blocks it stored) was last seen some number of
the pod's requests before it. `reach_draws` draws distances from those, so a synthesised repeat
reaches back as far as the pod's visible reuses of prompts about as long, neither only to the
latest few requests (which overstates how small a cache would hit them) nor uniformly over all.
"""
from __future__ import annotations

import numpy as np

from agent.kvevents.rebuild.chains import Rebuilt
from agent.kvevents.rebuild.log import ranges

MIN_REUSES = 8  # fewer visible reuses at least half as long as the repeats: every reuse counts
RECENT_SOURCES = 16  # without any visible reuse: one of the pod's this many latest requests


def reuse_distances(r: Rebuilt, mine: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """For the requests `mine` of one pod (arrival order), each whose cached prefix was in an earlier
    one of them: (the cached prefix's blocks, how many of `mine` back its last occurrence was)."""
    lengths = r.lengths[mine]
    cached = lengths - r.own[mine]
    q = np.flatnonzero(cached > 0)
    if not len(q):
        return np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64)
    hashes = r.flat[ranges(r.offsets[:-1][mine], lengths)]
    uniq, rank = np.unique(hashes, return_inverse=True)
    n = len(mine) + 1
    keys = np.sort(rank.astype(np.int64) * n + np.repeat(np.arange(len(mine), dtype=np.int64), lengths))
    qrank = np.searchsorted(uniq, r.flat[r.offsets[:-1][mine[q]] + cached[q] - 1]).astype(np.int64)
    at = np.searchsorted(keys, qrank * n + q, side="left") - 1  # the last occurrence before request q
    found = (at >= 0) & (keys[np.maximum(at, 0)] // n == qrank)
    prev = keys[np.maximum(at, 0)] % n
    return cached[q[found]], (q - prev)[found]


def reach_draws(r: Rebuilt, mine: np.ndarray, blocks: float | None, rng: np.random.Generator,
                shape: tuple[int, int]) -> np.ndarray:
    """Distances (in the pod's requests, >= 1) for repeats of about `blocks` blocks each: drawn from
    the pod's visible reuses of at least `blocks` / 2 blocks (all of its reuses when fewer than
    MIN_REUSES are), else uniform over the latest RECENT_SOURCES."""
    cached, dist = reuse_distances(r, mine)
    if blocks is not None and (cached >= blocks / 2).sum() >= MIN_REUSES:
        dist = dist[cached >= blocks / 2]
    if not len(dist):
        return 1 + (rng.random(shape) * RECENT_SOURCES).astype(np.int64)
    return dist[(rng.random(shape) * len(dist)).astype(np.int64)]
