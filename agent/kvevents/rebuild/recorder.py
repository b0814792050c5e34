"""The block-stream recorder: every engine's decoded KV events, per model, in flat columns.

The KV-event manager hands it each applied batch (`record`) and each restart or resync
(`clear`); `arrays(model)` copies one model's rows for the pure rebuild (chains.py). Thread-safe.

Bounds:
- time: rows older than `retain_s` before the newest are dropped;
- memory: beyond `max_refs` block references (every model) the recorder samples by root hash:
  the sample level L rises by one, and only chains whose root (the first block of the prompt they
  extend) has its top L mixed bits zero are kept, now and from then on. The decision depends on
  the hash only, so replicas sampling at the same level keep the same prompts, and a merge takes the
  highest level of its parts (merge.py);
- hostile engines: each engine records at most `engine_refs_per_s` block references a second
  (a token bucket over the agent's clock, holding 10 s); chains beyond it are dropped and counted
  per engine (`capped_refs`), so one engine flooding forged stores cannot crowd out the others.

A chain's root is the root recorded for its parent when the parent is remembered (a map of the
last 2 x ROOT_MEMORY hashes stored, whatever the level: ~100 bytes each, 200 MB at most), else its parent hash (the
prompt's earlier blocks were stored before the recorder saw them, or too long ago), else its first
hash. A prompt whose prefix was stored longer ago than the map remembers is sampled by a later
block than its true root: sampling stays deterministic, but such a prompt may be kept while its
prefix was not (its rebuilt chain then starts at the first block recorded).
"""
from __future__ import annotations

import dataclasses
import threading
import time
from collections.abc import Callable, Iterable

import numpy as np

from agent.kvevents.rebuild.log import CLEARED, MEDIUM_CODE, STORED, ChainArrays, ChainLog
from agent.kvevents.wire import Batch, Cleared, Removed, Stored

BUCKET_S = 10.0  # an engine's token bucket holds this many seconds of its rate
FLUSH_ROWS, FLUSH_HASHES = 4096, 65536  # queued rows / hashes that trigger a flush into the columns
ROOT_MEMORY = 1 << 20  # hashes per generation of the hash -> root map (two generations, ~200 MB at most)
_M1 = np.uint64(0xBF58476D1CE4E5B9)
_M2 = np.uint64(0x94D049BB133111EB)


def mix64(h: np.ndarray) -> np.ndarray:
    """SplitMix64's finaliser (a bijection): spreads block hashes evenly over the hash space."""
    z = np.asarray(h, dtype=np.uint64)
    with np.errstate(over="ignore"):
        z = (z ^ (z >> np.uint64(30))) * _M1
        z = (z ^ (z >> np.uint64(27))) * _M2
    return z ^ (z >> np.uint64(31))


def sampled(roots: np.ndarray, level: int) -> np.ndarray:
    """True where a root is kept at sample level `level` (the first 2**-level of hash space)."""
    if level <= 0:
        return np.ones(len(roots), dtype=bool)
    return (mix64(roots) >> np.uint64(64 - level)) == 0


@dataclasses.dataclass
class EngineStats:
    """What one engine fed the recorder (cumulative)."""

    stored_refs: int = 0
    capped_refs: int = 0  # dropped by the per-engine rate cap
    sampled_out_refs: int = 0  # dropped by hash sampling
    removed_refs: int = 0
    clears: int = 0
    by_medium: dict[str, int] = dataclasses.field(default_factory=dict)  # stored refs per medium
    tokens: float = BUCKET_S  # the rate cap's bucket, in seconds of allowance
    last: float | None = None


class BlockRecorder:
    def __init__(self, *, retain_s: float, max_refs: int, engine_refs_per_s: float, group_idx: int = 0,
                 clock: Callable[[], float] = time.time) -> None:
        self.retain_s, self.max_refs, self.engine_refs_per_s = retain_s, max_refs, engine_refs_per_s
        self.group_idx = group_idx
        self.clock = clock
        self.level = 0
        self._lock = threading.Lock()
        self._logs: dict[str, ChainLog] = {}
        self._roots: dict[str, list[dict[int, int]]] = {}  # model -> [newer, older] hash -> root
        self.engines: dict[tuple[str, str], EngineStats] = {}
        self._newest = float("-inf")

    @classmethod
    def from_settings(cls, spec: object, *, group_idx: int = 0, clock: Callable[[], float] = time.time
                      ) -> BlockRecorder:
        """From `KvEventsSettings.rebuild` (agent.kvevents.settings.RebuildSpec)."""
        return cls(retain_s=spec.retain_s, max_refs=spec.max_refs,  # type: ignore[attr-defined]
                   engine_refs_per_s=spec.engine_refs_per_s, group_idx=group_idx, clock=clock)  # type: ignore[attr-defined]

    # -- feeding ---------------------------------------------------------------------------
    def _stats(self, model: str, engine: str) -> EngineStats:
        st = self.engines.get((model, engine))
        if st is None:
            st = self.engines[(model, engine)] = EngineStats()
        return st

    def _allow(self, st: EngineStats, refs: int) -> bool:
        now = self.clock()
        if st.last is not None:
            st.tokens = min(BUCKET_S, st.tokens + max(now - st.last, 0.0))
        st.last = now
        need = refs / self.engine_refs_per_s
        if need > st.tokens:
            return False
        st.tokens -= need
        return True

    def record(self, model: str, engine: str, batch: Batch) -> None:
        """One applied batch of one engine (`engine`: its key, e.g. the pod name)."""
        with self._lock:
            log = self._logs.get(model)
            if log is None:
                log = self._logs[model] = ChainLog()
            st = self._stats(model, engine)
            eid = log.engine(engine)
            ts = float(batch.ts)
            removed: dict[int, int] = {}
            for ev in batch.events:
                k = type(ev)
                if k is Stored:
                    self._stored(log, st, eid, ts, ev, model)  # type: ignore[arg-type]
                elif k is Removed:
                    code = MEDIUM_CODE.get(ev.medium, 3)  # type: ignore[union-attr]
                    removed[code] = removed.get(code, 0) + len(ev.hashes)  # type: ignore[union-attr]
                elif k is Cleared:
                    self._clear(log, st, eid, ts)
            for code, n in removed.items():
                st.removed_refs += n
                log.pending_removed.append((ts, eid, code, n))
            self._newest = max(self._newest, ts)
            if len(log.pending["ts"]) >= FLUSH_ROWS or len(log.pending_hashes) >= FLUSH_HASHES:
                log.flush()
                self._bound()

    def clear(self, model: str, engine: str, ts: float) -> None:
        """The engine restarted (or its stream could not be trusted): its caches are empty."""
        with self._lock:
            log = self._logs.get(model)
            if log is not None:
                self._clear(log, self._stats(model, engine), log.engine(engine), ts)

    def _clear(self, log: ChainLog, st: EngineStats, eid: int, ts: float) -> None:
        st.clears += 1
        log.add(ts, eid, CLEARED, 0, [], None, 0, 0)

    def _stored(self, log: ChainLog, st: EngineStats, eid: int, ts: float, ev: Stored, model: str) -> None:
        if ev.group is not None and ev.group != self.group_idx:
            return
        hashes = ev.hashes if isinstance(ev.hashes, list) else list(ev.hashes)
        n = len(hashes)
        if n == 0:
            return
        if not self._allow(st, n):
            st.capped_refs += n
            return
        root = self._root(model, hashes, ev.parent)
        if self.level and not sampled(np.array([root], dtype=np.uint64), self.level)[0]:
            st.sampled_out_refs += n
            return
        st.stored_refs += n
        st.by_medium[ev.medium] = st.by_medium.get(ev.medium, 0) + n
        log.add(ts, eid, STORED, MEDIUM_CODE.get(ev.medium, 3), hashes, ev.parent, ev.block_size, root)

    def _root(self, model: str, hashes: list[int], parent: int | None) -> int:
        gens = self._roots.get(model)
        if gens is None:
            gens = self._roots[model] = [{}, {}]
        if parent is None:
            root = hashes[0]
        else:
            root = gens[0].get(parent)
            if root is None:
                root = gens[1].get(parent, parent)
        gens[0].update(dict.fromkeys(hashes, root))
        if len(gens[0]) >= ROOT_MEMORY:  # two generations: a parent is found for a while after its store
            gens[1], gens[0] = gens[0], {}
        return root

    # -- bounds ----------------------------------------------------------------------------
    def _bound(self) -> None:
        cutoff = self._newest - self.retain_s
        for log in self._logs.values():
            if log.chains.size and log.chains.view("ts")[0] < cutoff - 0.1 * self.retain_s:
                log.expire(cutoff)
        while self.refs_locked() > self.max_refs and self.level < 63:
            self.level += 1
            for log in self._logs.values():
                t = log.chains
                keep = (t.view("kind") != STORED) | sampled(t.view("root"), self.level)
                log.keep_chains(keep)

    def refs_locked(self) -> int:
        return sum(log.refs for log in self._logs.values())

    def flush(self) -> None:
        """Move every queued row into the columns (and apply the bounds)."""
        with self._lock:
            for log in self._logs.values():
                log.flush()
            self._bound()

    # -- read-outs -------------------------------------------------------------------------
    def models(self) -> list[str]:
        with self._lock:
            return sorted(self._logs)

    def arrays(self, model: str) -> ChainArrays | None:
        """A copy of one model's rows (None before any)."""
        with self._lock:
            log = self._logs.get(model)
            return None if log is None else log.arrays(self.level)

    def refs(self) -> int:
        with self._lock:
            return self.refs_locked()

    def nbytes(self) -> int:
        """Bytes the recorded rows hold (every model; queued rows flushed first)."""
        with self._lock:
            for log in self._logs.values():
                log.flush()
            return sum(log.nbytes for log in self._logs.values())

    def engine_stats(self, model: str | None = None) -> dict[str, EngineStats]:
        with self._lock:
            return {e: dataclasses.replace(st, by_medium=dict(st.by_medium))
                    for (m, e), st in self.engines.items() if model is None or m == model}

    def forget(self, model: str, engines: Iterable[str]) -> None:
        """Drop the stats of engines that left (their rows age out with `retain_s`)."""
        with self._lock:
            for e in engines:
                self.engines.pop((model, e), None)
