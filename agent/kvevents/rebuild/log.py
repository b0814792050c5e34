"""One model's block stream as flat numpy columns (no Python object per block).

Rows are the decoded events of every engine in arrival order:
- a stored chain: `kind` STORED, its medium, `n` hashes at `hashes[off:off + n]` (prefix order),
  the parent of the first (`has_parent`) and the block size in tokens;
- a clear (`AllBlocksCleared`, or a restart seen in the sequence numbers): `kind` CLEARED.

Removals are kept as counts (`removed` rows: ts, engine, medium, blocks; one per medium per
batch): the rebuilt
workload needs what was stored, not what was evicted. Every column grows by doubling (by a quarter beyond a million rows) and is
compacted when its oldest rows expire, so the cost is ~10 bytes a block reference plus ~35 bytes a
chain (measured by bench/rebuild.py). Not thread-safe: the recorder holds the lock.
"""
from __future__ import annotations

import dataclasses

import numpy as np

STORED, CLEARED = 0, 1
MEDIA = ("GPU", "CPU", "STORAGE", "OTHER")
MEDIUM_CODE = {m: i for i, m in enumerate(MEDIA)}
_CHAIN_COLUMNS = {"ts": np.float64, "eng": np.int32, "kind": np.int8, "medium": np.int8, "n": np.int32,
                  "off": np.int64, "parent": np.uint64, "has_parent": np.bool_, "bsize": np.int32}
_REMOVED_COLUMNS = {"ts": np.float64, "eng": np.int32, "medium": np.int8, "n": np.int32}
_PENDING = ("ts", "eng", "kind", "medium", "n", "parent", "has_parent", "bsize")
_INITIAL = 1024
_MOVE = 1 << 20  # references moved per step of a compaction
_M1 = np.uint64(0xBF58476D1CE4E5B9)
_M2 = np.uint64(0x94D049BB133111EB)


def mix64(h: np.ndarray) -> np.ndarray:
    """SplitMix64's finaliser (a bijection): spreads block hashes evenly over the hash space."""
    z = np.asarray(h, dtype=np.uint64)
    with np.errstate(over="ignore"):
        z = (z ^ (z >> np.uint64(30))) * _M1
        z = (z ^ (z >> np.uint64(27))) * _M2
    return z ^ (z >> np.uint64(31))


def sampled(keys: np.ndarray, level: int) -> np.ndarray:
    """True where a key is kept at sample level `level` (the first 2**-level of hash space)."""
    if level <= 0:
        return np.ones(len(keys), dtype=bool)
    return (mix64(keys) >> np.uint64(64 - level)) == 0


def _grown(cap: int) -> int:
    """The next capacity: doubling while small, +25% beyond a million (slack stays under a quarter)."""
    return 2 * cap if cap < 1 << 20 else cap + cap // 4


class _Table:
    """Growable columns of equal length."""

    def __init__(self, columns: dict[str, type]) -> None:
        self.cols = {k: np.empty(_INITIAL, dtype=t) for k, t in columns.items()}
        self.size = 0

    def append(self, values: dict[str, object], count: int) -> None:
        need = self.size + count
        if need > len(next(iter(self.cols.values()))):
            cap = max(need, _grown(len(next(iter(self.cols.values())))))
            for k, a in self.cols.items():
                grown = np.empty(cap, dtype=a.dtype)
                grown[:self.size] = a[:self.size]
                self.cols[k] = grown
        for k, a in self.cols.items():
            a[self.size:need] = values[k]
        self.size = need

    def view(self, name: str) -> np.ndarray:
        return self.cols[name][:self.size]

    def keep(self, mask: np.ndarray) -> None:
        """Keep the rows where `mask` (len == size) is true, in place (the capacity stays)."""
        n = int(mask.sum())
        for a in self.cols.values():
            a[:n] = a[:self.size][mask]
        self.size = n

    @property
    def nbytes(self) -> int:
        return sum(a.nbytes for a in self.cols.values())


@dataclasses.dataclass(frozen=True)
class ChainArrays:
    """A read-only copy of a log's rows (what the pure rebuild works on), oldest first.
    `engines[i]` names engine id i."""

    ts: np.ndarray
    eng: np.ndarray
    kind: np.ndarray
    medium: np.ndarray
    n: np.ndarray
    off: np.ndarray
    parent: np.ndarray
    has_parent: np.ndarray
    bsize: np.ndarray
    hashes: np.ndarray
    engines: tuple[str, ...]
    sample_level: int = 0  # requests kept: key in the first 2**-level of hash space (recorder.py)

    @property
    def refs(self) -> int:
        return int(self.n[self.kind == STORED].sum())


class ChainLog:
    """The rows of one model (see the module doc). New rows wait in Python lists (`pending`) and
    join the columns in one numpy call per column (`flush`), so a row costs a few list appends."""

    def __init__(self, limit: int | None = None) -> None:
        self.limit = limit  # the hash array never grows past this (the recorder's budget + one flush)
        self.chains = _Table(_CHAIN_COLUMNS)
        self.removed = _Table(_REMOVED_COLUMNS)
        self.hashes = np.empty(_INITIAL * 8, dtype=np.uint64)
        self.nhashes = 0
        self.engine_ids: dict[str, int] = {}
        self.pending: dict[str, list] = {k: [] for k in _PENDING}
        self.pending_hashes: list[int] = []
        self.pending_removed: list[tuple[float, int, int, int]] = []

    def add(self, ts: float, eng: int, kind: int, medium: int, hashes: list[int], parent: int | None,
            bsize: int) -> None:
        """Queue one row (a stored chain, or a clear with no hashes)."""
        p = self.pending
        p["ts"].append(ts)
        p["eng"].append(eng)
        p["kind"].append(kind)
        p["medium"].append(medium)
        p["n"].append(len(hashes))
        p["parent"].append(parent or 0)
        p["has_parent"].append(parent is not None)
        p["bsize"].append(bsize)
        self.pending_hashes.extend(hashes)

    def flush(self) -> None:
        p = self.pending
        rows = len(p["ts"])
        if rows:
            n = np.array(p["n"], dtype=np.int64)
            off = np.empty(rows, dtype=np.int64)
            off[0] = self.nhashes
            np.cumsum(n[:-1], out=off[1:])
            off[1:] += self.nhashes
            self.add_hashes(np.array(self.pending_hashes, dtype=np.uint64))
            values = {k: np.array(v, dtype=_CHAIN_COLUMNS[k]) for k, v in p.items()}
            values["off"] = off
            self.chains.append(values, rows)
            for v in p.values():
                v.clear()
            self.pending_hashes.clear()
        if self.pending_removed:
            cols = list(zip(*self.pending_removed, strict=True))
            self.removed.append({k: np.array(c, dtype=_REMOVED_COLUMNS[k]) for k, c in zip(_REMOVED_COLUMNS, cols,
                                                                                           strict=True)},
                                len(self.pending_removed))
            self.pending_removed.clear()

    def engine(self, key: str) -> int:
        eid = self.engine_ids.get(key)
        if eid is None:
            eid = self.engine_ids[key] = len(self.engine_ids)
        return eid

    def add_hashes(self, flat: np.ndarray) -> int:
        """Append hashes; returns the offset of the first."""
        need = self.nhashes + len(flat)
        if need > len(self.hashes):
            cap = _grown(len(self.hashes)) if self.limit is None else min(_grown(len(self.hashes)), self.limit)
            grown = np.empty(max(need, cap), dtype=np.uint64)
            grown[:self.nhashes] = self.hashes[:self.nhashes]
            self.hashes = grown
        at = self.nhashes
        self.hashes[at:need] = flat
        self.nhashes = need
        return at

    @property
    def refs(self) -> int:
        return self.nhashes + len(self.pending_hashes)

    @property
    def nbytes(self) -> int:
        return self.chains.nbytes + self.removed.nbytes + self.hashes.nbytes

    def keep_chains(self, mask: np.ndarray) -> None:
        """Keep the (flushed) chain rows where `mask` is true, with their hashes, compacted in place
        a million references at a time (no second copy of the hashes, whatever their number)."""
        t = self.chains
        n, off = t.view("n").astype(np.int64), t.view("off")
        rows = np.flatnonzero(mask)
        counts = n[rows]
        new_off = np.zeros(len(rows), dtype=np.int64)
        new_off[1:] = np.cumsum(counts)[:-1]
        ends = np.cumsum(counts)
        start = 0
        while start < len(rows):  # chunks of rows covering about a million references each
            stop = max(int(np.searchsorted(ends, (ends[start] - counts[start]) + _MOVE, side="right")), start + 1)
            r = rows[start:stop]
            self.hashes[ranges(new_off[start:stop], counts[start:stop])] = self.hashes[ranges(off[r], counts[start:stop])]
            start = stop
        t.keep(mask)
        t.view("off")[:] = new_off
        self.nhashes = int(counts.sum())

    def expire(self, cutoff: float) -> None:
        """Drop the rows older than `cutoff`."""
        self.flush()
        if self.chains.size and self.chains.view("ts")[0] < cutoff:
            self.keep_chains(self.chains.view("ts") >= cutoff)
        if self.removed.size and self.removed.view("ts")[0] < cutoff:
            self.removed.keep(self.removed.view("ts") >= cutoff)

    def arrays(self, sample_level: int = 0, *, copy: bool = True) -> ChainArrays:
        """The rows as arrays: copies, or views valid until the log changes (`copy=False`)."""
        self.flush()
        t = self.chains
        names = [""] * len(self.engine_ids)
        for k, i in self.engine_ids.items():
            names[i] = k
        cols = {k: t.view(k).copy() if copy else t.view(k) for k in _CHAIN_COLUMNS}
        hashes = self.hashes[:self.nhashes]
        return ChainArrays(**cols, hashes=hashes.copy() if copy else hashes, engines=tuple(names),
                           sample_level=sample_level)


def _ranges(starts: np.ndarray, counts: np.ndarray) -> np.ndarray:
    """Concatenated aranges [starts[i], starts[i] + counts[i]) (int64)."""
    total = int(counts.sum())
    if total == 0:
        return np.zeros(0, dtype=np.int64)
    ends = np.cumsum(counts)
    first = np.repeat(starts - (ends - counts), counts)
    return first + np.arange(total, dtype=np.int64)


ranges = _ranges
