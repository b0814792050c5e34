"""Requests rebuilt from the recorded block stream (pure numpy over `ChainArrays`).

A request is what one engine stored on its GPU for one prompt, plus the ancestors of the first
stored block: vLLM hashes blocks as a chain (each hash covers the whole prefix), so the parent of a
stored run names the prefix the engine already held, and that prefix was stored earlier (by this
engine or another: a hash is the same prefix wherever it appears). Following parent links through
the recorded hashes gives each request's whole chain, root first.

Rows become requests as follows:
- every GPU `BlockStored` row (of the indexed KV-cache group) starts a request;
- a row whose parent is the last block of an earlier row of the same engine, stored at most
  `join_s` before, continues that request (chunked prefill, decode blocks);
- of two rows of one engine with the same timestamp, the first is dropped when its chain is a
  prefix of the second's (one prompt stored in two runs around a block that was still resident).

The pointer chases are done by pointer jumping (log of the chain depth vectorised passes), so the
cost is a sort of the hashes plus linear passes, whatever the number of requests.
"""
from __future__ import annotations

import dataclasses

import numpy as np

from agent.kvevents.rebuild.log import MEDIUM_CODE, STORED, ChainArrays, ranges, sampled

GPU = MEDIUM_CODE["GPU"]


@dataclasses.dataclass(frozen=True)
class Rebuilt:
    """Rebuilt requests, in arrival order: request i's chain is `flat[offsets[i]:offsets[i + 1]]`
    (uint64, root first); `own` counts the blocks it stored itself (the rest were cached)."""

    ts: np.ndarray
    eng: np.ndarray
    block_size: np.ndarray
    own: np.ndarray
    flat: np.ndarray
    offsets: np.ndarray
    engines: tuple[str, ...]

    @property
    def requests(self) -> int:
        return len(self.ts)

    @property
    def lengths(self) -> np.ndarray:
        return np.diff(self.offsets)

    @property
    def keys(self) -> np.ndarray:
        """Each request's sampling key: the first block it stored (its own blocks end its chain)."""
        return self.flat[self.offsets[1:] - np.maximum(self.own, 1)]

    def chain(self, i: int) -> np.ndarray:
        return self.flat[self.offsets[i]:self.offsets[i + 1]]

    def take(self, keep: np.ndarray) -> Rebuilt:
        """The requests where `keep` (bool, per request) holds."""
        idx = np.flatnonzero(keep)
        lengths = self.lengths[idx]
        offsets = np.zeros(len(idx) + 1, dtype=np.int64)
        np.cumsum(lengths, out=offsets[1:])
        flat = self.flat[ranges(self.offsets[:-1][idx], lengths)]
        return Rebuilt(self.ts[idx], self.eng[idx], self.block_size[idx], self.own[idx], flat, offsets, self.engines)


def empty(engines: tuple[str, ...] = ()) -> Rebuilt:
    z = np.zeros(0, dtype=np.int64)
    return Rebuilt(np.zeros(0), z.astype(np.int32), z.astype(np.int32), z, np.zeros(0, dtype=np.uint64),
                   np.zeros(1, dtype=np.int64), engines)


def _path_sums(val: np.ndarray, ptr: np.ndarray) -> np.ndarray:
    """sum of `val` along each row's pointer path (itself included); ptr -1 ends a path."""
    val, ptr = val.copy(), ptr.copy()
    while True:
        live = ptr >= 0
        if not live.any():
            return val
        val[live] += val[ptr[live]]
        nxt = np.full_like(ptr, -1)
        nxt[live] = ptr[ptr[live]]
        ptr = nxt


def _path_roots(ptr: np.ndarray) -> np.ndarray:
    """The last row of each row's pointer path (itself when it has no pointer)."""
    root = np.where(ptr >= 0, ptr, np.arange(len(ptr)))
    while True:
        nxt = np.where(ptr[root] >= 0, ptr[root], root)
        if np.array_equal(nxt, root):
            return root
        root = nxt


@dataclasses.dataclass(frozen=True)
class _Rows:
    """The GPU stored rows with their ancestry: `anc` (row holding the parent, -1 when unknown),
    `anc_pos` (the parent's position in it) and `prefix` (blocks before the row's own)."""

    idx: np.ndarray  # row numbers in the ChainArrays
    ts: np.ndarray
    eng: np.ndarray
    n: np.ndarray
    off: np.ndarray
    bsize: np.ndarray
    anc: np.ndarray
    anc_pos: np.ndarray
    prefix: np.ndarray


def gpu_rows(arr: ChainArrays, group_rows: np.ndarray | None = None) -> _Rows:
    sel = (arr.kind == STORED) & (arr.medium == GPU) & (arr.n > 0)
    if group_rows is not None:
        sel &= group_rows
    idx = np.flatnonzero(sel)
    n, off = arr.n[idx].astype(np.int64), arr.off[idx]
    pos = ranges(off, n)
    keys = arr.hashes[pos]
    row_of = np.repeat(np.arange(len(idx), dtype=np.int64), n)
    at_in_row = pos - np.repeat(off, n)
    order = np.argsort(keys, kind="stable")
    sorted_keys = keys[order]
    parent = arr.parent[idx]
    i = np.searchsorted(sorted_keys, parent, side="left")
    hit = arr.has_parent[idx] & (i < len(sorted_keys))
    hit[hit] = sorted_keys[i[hit]] == parent[hit]
    anc = np.full(len(idx), -1, dtype=np.int64)
    anc_pos = np.zeros(len(idx), dtype=np.int64)
    first = order[i[hit]]  # the earliest occurrence (stable sort)
    anc[hit], anc_pos[hit] = row_of[first], at_in_row[first]
    anc[anc >= np.arange(len(idx))] = -1  # only an earlier row can be an ancestor
    val = np.where(anc >= 0, anc_pos + 1, 0)
    prefix = _path_sums(val, anc)  # blocks before c's own = (anc_pos[c] + 1) + prefix[anc[c]]
    return _Rows(idx, arr.ts[idx], arr.eng[idx], n, off, arr.bsize[idx], anc, anc_pos, prefix)


def _materialise(arr: ChainArrays, rows: _Rows, reps: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The full chains of rows `reps`: (flat uint64, offsets)."""
    lengths = rows.prefix[reps] + rows.n[reps]
    offsets = np.zeros(len(reps) + 1, dtype=np.int64)
    np.cumsum(lengths, out=offsets[1:])
    flat = np.empty(int(offsets[-1]), dtype=np.uint64)
    req = np.arange(len(reps), dtype=np.int64)
    cur, take = reps, rows.n[reps]
    while len(cur):
        dest = offsets[:-1][req] + rows.prefix[cur]
        flat[ranges(dest, take)] = arr.hashes[ranges(rows.off[cur], take)]
        nxt = rows.anc[cur]
        live = nxt >= 0
        take = rows.anc_pos[cur][live] + 1
        cur, req = nxt[live], req[live]
    return flat, offsets


def _groups(rows: _Rows, join_s: float) -> np.ndarray:
    """The first row of each row's request (module doc: continuations within `join_s`)."""
    a = rows.anc
    tail = (a >= 0) & (rows.anc_pos == rows.n[np.maximum(a, 0)] - 1)
    joins = tail & (rows.eng == rows.eng[np.maximum(a, 0)]) & (rows.ts - rows.ts[np.maximum(a, 0)] <= join_s)
    join_to = np.where(joins, a, -1)
    # one continuation per row: a second child of the same tail starts a request of its own
    targets = join_to[joins]
    _, first = np.unique(targets, return_index=True)
    single = np.zeros(len(targets), dtype=bool)
    single[first] = True
    jidx = np.flatnonzero(joins)
    join_to[jidx[~single]] = -1
    return _path_roots(join_to)


def request_keys(arr: ChainArrays, rows: _Rows, group: np.ndarray) -> np.ndarray:
    """Each GPU row's sampling key: the first block its request stored."""
    return arr.hashes[rows.off[group]]


def sample_mask(arr: ChainArrays, level: int, *, join_s: float, protect_from: int) -> np.ndarray:
    """Rows kept at sample level `level`: GPU stores of requests whose key (first stored block) is in
    range, with every row their chains descend from; other stores whose first block is in range;
    clears; and every row from `protect_from` on (recent rows a later request may descend from).
    Engine by engine (a stored block's parent is on the same engine's GPU, stored by that engine),
    so the working memory is one engine's rows, not the fleet's."""
    keep = (arr.kind != STORED) | (np.arange(len(arr.kind)) >= protect_from)
    other = (arr.kind == STORED) & (arr.medium != GPU)
    if other.any():
        keep[other] |= sampled(arr.hashes[arr.off[other]], level)
    gpu = np.flatnonzero((arr.kind == STORED) & (arr.medium == GPU) & (arr.n > 0))
    order = gpu[np.argsort(arr.eng[gpu], kind="stable")]
    bounds = np.flatnonzero(np.diff(arr.eng[order])) + 1
    for part in np.split(order, bounds) if len(order) else []:
        keep[part] = _engine_mask(_subset(arr, part), level, join_s, keep[part])
    return keep


def _subset(arr: ChainArrays, idx: np.ndarray) -> ChainArrays:
    """Rows `idx` of `arr` (their hashes stay where they are)."""
    cols = {f.name: getattr(arr, f.name)[idx] for f in dataclasses.fields(arr)
            if f.name not in ("hashes", "engines", "sample_level")}
    return ChainArrays(**cols, hashes=arr.hashes, engines=arr.engines, sample_level=arr.sample_level)


def _engine_mask(sub: ChainArrays, level: int, join_s: float, protected: np.ndarray) -> np.ndarray:
    rows = gpu_rows(sub)
    group = _groups(rows, join_s)
    mine = sampled(request_keys(sub, rows, group), level) | protected
    while True:  # the ancestors of what is kept
        up = rows.anc[mine & (rows.anc >= 0)]
        up = up[~mine[up]]
        if not len(up):
            return mine
        mine[up] = True


def rebuild(arr: ChainArrays, since: float, until: float, *, join_s: float) -> Rebuilt:
    """The requests that arrived in [since, until] (see the module doc)."""
    rows = gpu_rows(arr)
    m = len(rows.idx)
    if m == 0:
        return empty(arr.engines)
    c = np.arange(m)
    group = _groups(rows, join_s)
    last = np.full(m, -1, dtype=np.int64)
    np.maximum.at(last, group, c)
    own = np.zeros(m, dtype=np.int64)
    np.add.at(own, group, rows.n)
    firsts = np.flatnonzero(group == c)
    arrive = rows.ts[firsts]
    inside = (arrive >= since) & (arrive <= until)
    if arr.sample_level:  # rows kept only as another request's prefix are no request of their own
        inside &= sampled(arr.hashes[rows.off[firsts]], arr.sample_level)
    firsts = firsts[inside]
    reps = last[firsts]
    flat, offsets = _materialise(arr, rows, reps)
    out = Rebuilt(rows.ts[firsts], rows.eng[firsts], rows.bsize[reps], own[firsts], flat, offsets, arr.engines)
    return _drop_split_runs(out)


def _drop_split_runs(r: Rebuilt) -> Rebuilt:
    """Drop a request whose chain is a prefix of the next request of the same engine stored at the
    same timestamp (the twin and vLLM store one prompt in two runs around a resident block)."""
    if r.requests < 2:
        return r
    order = np.lexsort((np.arange(r.requests), r.ts, r.eng))
    a, b = order[:-1], order[1:]
    la, lb = r.lengths[a], r.lengths[b]
    cand = (r.eng[a] == r.eng[b]) & (r.ts[a] == r.ts[b]) & (la <= lb) & (la > 0)
    if not cand.any():
        return r
    ia, ib = a[cand], b[cand]
    same = r.flat[r.offsets[ia] + r.lengths[ia] - 1] == r.flat[r.offsets[ib] + r.lengths[ia] - 1]
    drop = np.zeros(r.requests, dtype=bool)
    drop[ia[same]] = True
    if not drop.any():
        return r
    own = r.own.copy()
    np.add.at(own, ib[same], r.own[ia[same]])
    r = dataclasses.replace(r, own=own)
    return r.take(~drop)
