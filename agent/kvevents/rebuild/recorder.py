"""The block-stream recorder: every engine's decoded KV events, per model, in flat columns.

The KV-event manager hands it each applied batch (`record`) and each restart or resync
(`clear`); `arrays(model)` copies one model's rows for the pure rebuild (chains.py). Thread-safe.

Bounds:
- time: rows older than `retain_s` before the newest are dropped;
- memory: beyond `max_refs` block references (every model) the recorder compacts by request hash:
  at sample level L it keeps the requests whose key (the first block the request stored) has its
  top L mixed bits zero, with every row their chains descend from, and the newest quarter of the
  rows (a later request may descend from them); when that leaves more than 3/4 of `max_refs`, L
  rises by one. The decision depends on hashes only, so replicas at the same level keep the same
  requests, and a merge takes the highest level of its parts (merge.py). A request whose prefix
  was dropped before it arrived (an unsampled prompt's, older than the newest quarter) is rebuilt
  from the blocks still held: sampling can shorten a chain, never invent one;
- hostile engines: each engine records at most `engine_refs_per_s` block references a second
  (a token bucket over the agent's clock, holding 10 s); chains beyond it are dropped and counted
  per engine (`capped_refs`), so one engine flooding forged stores cannot crowd out the others.
"""
from __future__ import annotations

import dataclasses
import threading
import time
from collections.abc import Callable, Iterable

from agent.kvevents.rebuild.chains import sample_mask
from agent.kvevents.rebuild.log import CLEARED, MEDIUM_CODE, STORED, ChainArrays, ChainLog
from agent.kvevents.wire import Batch, Cleared, Removed, Stored

BUCKET_S = 10.0  # an engine's token bucket holds this many seconds of its rate
FLUSH_ROWS, FLUSH_HASHES = 4096, 65536  # queued rows / hashes that trigger a flush into the columns
COMPACT_TO = 0.75  # a compaction that leaves more than this share of max_refs raises the sample level
PROTECT_DIV = 4  # the newest 1/PROTECT_DIV of the rows survive a compaction (later requests descend from them)
@dataclasses.dataclass
class EngineStats:
    """What one engine fed the recorder (cumulative)."""

    stored_refs: int = 0
    capped_refs: int = 0  # dropped by the per-engine rate cap
    removed_refs: int = 0
    clears: int = 0
    by_medium: dict[str, int] = dataclasses.field(default_factory=dict)  # stored refs per medium
    tokens: float = BUCKET_S  # the rate cap's bucket, in seconds of allowance
    last: float | None = None


class BlockRecorder:
    def __init__(self, *, retain_s: float, max_refs: int, engine_refs_per_s: float, join_s: float = 1.0,
                 group_idx: int = 0, clock: Callable[[], float] = time.time) -> None:
        self.retain_s, self.max_refs, self.engine_refs_per_s = retain_s, max_refs, engine_refs_per_s
        self.join_s = join_s
        self.sampled_out_refs = 0
        self.group_idx = group_idx
        self.clock = clock
        self.level = 0
        self._lock = threading.Lock()
        self._logs: dict[str, ChainLog] = {}
        self.engines: dict[tuple[str, str], EngineStats] = {}
        self._newest = float("-inf")

    @classmethod
    def from_settings(cls, spec: object, *, group_idx: int = 0, clock: Callable[[], float] = time.time
                      ) -> BlockRecorder:
        """From `KvEventsSettings.rebuild` (agent.kvevents.settings.RebuildSpec)."""
        return cls(retain_s=spec.retain_s, max_refs=spec.max_refs,  # type: ignore[attr-defined]
                   engine_refs_per_s=spec.engine_refs_per_s, join_s=spec.join_s,  # type: ignore[attr-defined]
                   group_idx=group_idx, clock=clock)

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
                log = self._logs[model] = ChainLog(self.max_refs + FLUSH_HASHES)
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
        log.add(ts, eid, CLEARED, 0, [], None, 0)

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
        st.stored_refs += n
        st.by_medium[ev.medium] = st.by_medium.get(ev.medium, 0) + n
        log.add(ts, eid, STORED, MEDIUM_CODE.get(ev.medium, 3), hashes, ev.parent, ev.block_size)

    # -- bounds ----------------------------------------------------------------------------
    def _bound(self) -> None:
        cutoff = self._newest - self.retain_s
        for log in self._logs.values():
            if log.chains.size and log.chains.view("ts")[0] < cutoff - 0.1 * self.retain_s:
                log.expire(cutoff)
        if self.refs_locked() <= self.max_refs:
            return
        self._compact()  # the rows recorded since the last compaction, at the current level
        while self.refs_locked() > COMPACT_TO * self.max_refs and self.level < 63:
            self.level += 1
            self._compact()

    def _compact(self) -> None:
        for log in self._logs.values():
            log.flush()
            arr = log.arrays(self.level, copy=False)
            protect = len(arr.ts) - len(arr.ts) // PROTECT_DIV
            before = log.refs
            log.keep_chains(sample_mask(arr, self.level, join_s=self.join_s, protect_from=protect))
            self.sampled_out_refs += before - log.refs

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
