"""Block-level workload signals from decoded KV-event batches (pure; no sockets, no threads).

`KvSignals` owns one `FleetIndex` per model and the per-engine stream counters. The manager
feeds it decoded batches in order; the agent's scrape loop feeds it vLLM's token counters
(`observe_counters`, or just `observe_prompt_tokens`) so the workload overlap and the corrected
miss split can be computed over a sliding window (see `workload.py`):

    overlap = 1 - (cold tokens (blocks never seen anywhere in the fleet) + tail tokens) / prompt tokens

`snapshot()` returns a frozen, self-contained view for exporters.
"""
from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING

import numpy as np

from agent.kvevents.fleet import BlockSketches
from agent.kvevents.index import CAUSES, DISTANCE_BUCKETS, REUSE_BUCKETS, TIER_NAMES, FleetIndex, IndexLimits
from agent.kvevents.wire import Batch, Cleared, Removed, Stored
from agent.kvevents.workload import EventTotals, OverlapReading, PodCounters, WorkloadWindow

if TYPE_CHECKING:
    from agent.kvevents.rebuild.recorder import BlockRecorder
    from agent.kvevents.store_curve import StoreStream


@dataclasses.dataclass(frozen=True, order=True)
class EngineId:
    """One event stream: a pod, or one data-parallel rank of a pod (each has its own cache)."""

    pod: str
    model: str
    dp_rank: int = 0

    @property
    def key(self) -> str:
        return self.pod if self.dp_rank == 0 else f"{self.pod}/dp{self.dp_rank}"


@dataclasses.dataclass
class StreamStats:
    messages: int = 0
    events: dict[str, int] = dataclasses.field(default_factory=lambda: dict.fromkeys(
        ("BlockStored", "BlockRemoved", "AllBlocksCleared"), 0))
    gaps: int = 0  # times a sequence jump was detected
    missed_messages: int = 0  # messages in those jumps
    replayed_messages: int = 0  # of which recovered through the replay socket
    lost_messages: int = 0  # of which never recovered
    unbuffered_messages: int = 0  # before a late join, older than the engine's replay buffer
    restarts: int = 0
    reconnects: int = 0  # publisher disconnected (a frame over max_message_bytes, or the pod left)
    shed_messages: int = 0  # received but dropped: the queue to the index held queue_bytes
    shed_bytes: int = 0
    rejected: dict[str, int] = dataclasses.field(default_factory=dict)
    last_seq: int | None = None
    last_event_ts: float | None = None


@dataclasses.dataclass(frozen=True)
class EngineSnapshot:
    engine: EngineId
    stream: StreamStats
    miss_blocks: Mapping[str, int]
    miss_tokens: Mapping[str, int]
    external_hit_blocks: int
    external_hit_tokens: int
    rereported_blocks: int
    l2_hit_blocks: int  # of the external hits: read from the shared L2 ("STORAGE" events)
    l2_hit_tokens: int
    stored_blocks: Mapping[str, int]
    removed_blocks: Mapping[str, int]
    unknown_removed_blocks: int
    resident_blocks: Mapping[str, int]  # by tier
    aged_out: int
    clears: int
    reuse_buckets: Mapping[str, tuple[int, ...]]  # medium -> cumulative counts per REUSE_BUCKETS + inf
    reuse_sum: Mapping[str, float]


@dataclasses.dataclass(frozen=True)
class ModelSnapshot:
    model: str
    duplicated_blocks: int
    resident_hashes: int
    overlap: OverlapReading | None
    sketch_bytes: int
    shared_l2_blocks: int = 0  # hashes in the shared L2 ("STORAGE" stores, fleet-resident)


@dataclasses.dataclass(frozen=True)
class KvSnapshot:
    engines: tuple[EngineSnapshot, ...]
    models: tuple[ModelSnapshot, ...]
    taken_at: float


class KvSignals:
    def __init__(self, limits: IndexLimits | None = None, group_idx: int = 0,
                 overlap_window_s: float = 300.0, clock: Callable[[], float] | None = None) -> None:
        import time

        self.limits = limits or IndexLimits()
        self.group_idx = group_idx
        self.overlap_window_s = overlap_window_s
        self.clock = clock or time.time
        self.indexes: dict[str, FleetIndex] = {}
        self.streams: dict[EngineId, StreamStats] = {}
        self._windows: dict[str, WorkloadWindow] = {}
        self.blocks: BlockSketches | None = None  # fleet sketches for sharded agents (fleet.py)
        self.store_stream: StoreStream | None = None  # GPU stores for the CPU capacity curve (store_curve.py)
        self.recorder: BlockRecorder | None = None  # the block stream for the rebuilt workload (rebuild/)

    # -- feeding ---------------------------------------------------------------------------
    def index(self, model: str) -> FleetIndex:
        idx = self.indexes.get(model)
        if idx is None:
            idx = self.indexes[model] = FleetIndex(self.limits, self.group_idx)
        return idx

    def stream(self, engine: EngineId) -> StreamStats:
        st = self.streams.get(engine)
        if st is None:
            st = self.streams[engine] = StreamStats()
            self.index(engine.model).engine(engine.key)
        return st

    def apply(self, engine: EngineId, batch: Batch) -> None:
        st = self.stream(engine)
        st.messages += 1
        st.last_seq = batch.seq
        st.last_event_ts = batch.ts
        ev = st.events
        for e in batch.events:
            k = type(e)
            if k is Stored:
                ev["BlockStored"] += 1
            elif k is Removed:
                ev["BlockRemoved"] += 1
            elif k is Cleared:
                ev["AllBlocksCleared"] += 1
        for reason, n in batch.rejected.items():
            st.rejected[reason] = st.rejected.get(reason, 0) + n
        idx = self.index(engine.model)
        if self.store_stream is not None:
            self._record_stores(engine, batch)
        if self.recorder is not None:
            self.recorder.record(engine.model, engine.key, batch)
        if self.blocks is None:
            idx.apply(engine.key, batch.ts, batch.events)
            return
        if idx.cold_sink is None:
            idx.cold_sink = []
        idx.apply(engine.key, batch.ts, batch.events)
        gpu = [h for e in batch.events if type(e) is Stored and e.medium == "GPU"
               and (e.group is None or e.group == self.group_idx) for h in e.hashes]
        self.blocks.add(engine.model, engine.key, batch.ts, gpu)
        if idx.cold_sink:
            self.blocks.add_cold(engine.model, batch.ts, idx.cold_sink)
            idx.cold_sink.clear()

    def _record_stores(self, engine: EngineId, batch: Batch) -> None:
        stream = self.store_stream
        assert stream is not None
        gpu: list[int] = []
        size = 0
        for e in batch.events:
            if type(e) is Cleared:
                stream.clear_engine(engine.model, engine.key)
                gpu = []
            elif type(e) is Stored and e.medium == "GPU" and (e.group is None or e.group == self.group_idx):
                gpu.extend(e.hashes)
                size = e.block_size or size
        if gpu:
            stream.add(engine.model, engine.key, gpu, size)

    def reject(self, engine: EngineId, reason: str, n: int = 1) -> None:
        st = self.stream(engine)
        st.rejected[reason] = st.rejected.get(reason, 0) + n

    def restart(self, engine: EngineId, ts: float) -> None:
        """The engine's sequence dropped: it restarted and its caches are empty."""
        st = self.stream(engine)
        st.restarts += 1
        if not math.isfinite(ts):
            ts = st.last_event_ts if st.last_event_ts is not None else 0.0
        self.index(engine.model).clear_engine(engine.key, ts)
        if self.recorder is not None:
            self.recorder.clear(engine.model, engine.key, ts)

    def shed(self, engine: EngineId, nbytes: int) -> None:
        st = self.stream(engine)
        st.shed_messages += 1
        st.shed_bytes += nbytes

    def reconnected(self, engine: EngineId) -> None:
        self.stream(engine).reconnects += 1

    def gap(self, engine: EngineId, missed: int) -> None:
        st = self.stream(engine)
        st.gaps += 1
        st.missed_messages += missed

    def replay_result(self, engine: EngineId, recovered: int, lost: int, unbuffered: int = 0) -> None:
        st = self.stream(engine)
        st.replayed_messages += recovered
        st.lost_messages += lost
        st.unbuffered_messages += unbuffered

    def set_caps(self, engine: EngineId, resident: int, history: int) -> None:
        self.stream(engine)
        self.index(engine.model).set_caps(engine.key, resident, history)

    def set_shadow_cap(self, per_model: int) -> None:
        for idx in self.indexes.values():
            idx.set_shadow_cap(per_model)

    def resync(self, engine: EngineId, ts: float) -> None:
        """The stream jumped beyond any plausible gap: what the index holds for the engine can no
        longer be trusted, so it is cleared (not counted as a restart)."""
        st = self.stream(engine)
        if not math.isfinite(ts):
            ts = st.last_event_ts if st.last_event_ts is not None else 0.0
        self.index(engine.model).clear_engine(engine.key, ts)
        if self.recorder is not None:
            self.recorder.clear(engine.model, engine.key, ts)

    def forget(self, engine: EngineId) -> None:
        """The pod left the fleet: drop its residency (its counters go with it)."""
        self.streams.pop(engine, None)
        idx = self.indexes.get(engine.model)
        if idx is not None:
            idx.drop_engine(engine.key)

    def keep_models(self, models: set[str]) -> None:
        """Drop the index (sketch, shadow) of every model no longer watched: the model budget."""
        for m in [m for m, idx in self.indexes.items() if m not in models and not idx.engines]:
            del self.indexes[m]

    # -- prompt tokens and overlap ---------------------------------------------------------
    def event_totals(self, model: str) -> EventTotals:
        """Cumulative miss and L1-hit tokens of one model's events, summed over its engines."""
        idx = self.indexes.get(model)
        if idx is None:
            return EventTotals()
        cold = capacity = routing = l1 = l2 = 0
        by_cap = np.zeros(DISTANCE_BUCKETS)
        by_rout = np.zeros(DISTANCE_BUCKETS)
        for e in idx.engines.values():
            t = e.stats.miss_tokens
            cold, capacity, routing = cold + t["cold"], capacity + t["capacity"], routing + t["routing"]
            l1 += e.stats.external_hit_tokens - e.stats.l2_hit_tokens
            l2 += e.stats.l2_hit_tokens
            by_cap += e.stats.miss_distance["capacity"]
            by_rout += e.stats.miss_distance["routing"]
        return EventTotals(cold, capacity, routing, l1, by_cap, by_rout, l2)

    def observe_counters(self, pod: str, model: str, counters: PodCounters, ts: float | None = None) -> None:
        """Feed one pod's scraped token counters (cumulative; resets are handled)."""
        window = self._windows.get(model)
        if window is None:
            window = self._windows[model] = WorkloadWindow(model, max(self.overlap_window_s, 1.0) * 4)
        window.observe(pod, counters, self.event_totals(model), self.clock() if ts is None else ts)

    def observe_prompt_tokens(self, pod: str, model: str, total: float, ts: float | None = None) -> None:
        """Feed `vllm:prompt_tokens_total` only (no L2 correction, no tail estimate)."""
        self.observe_counters(pod, model, PodCounters(total), ts)

    def overlap_models(self) -> list[str]:
        """The models whose token counters were fed (the ones an overlap can be read for)."""
        return sorted(self._windows)

    def overlap(self, model: str | None = None, window_s: float | None = None) -> OverlapReading | None:
        """Workload signals over the last `window_s` seconds (default: the configured window).
        None when no prompt tokens were observed in the window or the model is unknown; with
        `model=None` the single model watched (None if several)."""
        if model is None:
            if len(self._windows) != 1:
                return None
            model = next(iter(self._windows))
        window = self._windows.get(model)
        if window is None:
            return None
        return window.reading(self.overlap_window_s if window_s is None else window_s)

    # -- read-out --------------------------------------------------------------------------
    def snapshot(self) -> KvSnapshot:
        engines = []
        for eid in sorted(self.streams):
            st = self.streams[eid]
            s = self.index(eid.model).engine(eid.key).stats
            buckets = {}
            for medium, counts in s.reuse_counts.items():
                acc, cum = 0, []
                for c in counts:
                    acc += c
                    cum.append(acc)
                buckets[medium] = tuple(cum)
            engines.append(EngineSnapshot(
                engine=eid, stream=dataclasses.replace(st, events=dict(st.events), rejected=dict(st.rejected)),
                miss_blocks=dict(s.miss_blocks), miss_tokens=dict(s.miss_tokens),
                external_hit_blocks=s.external_hit_blocks, external_hit_tokens=s.external_hit_tokens,
                rereported_blocks=s.rereported_blocks, l2_hit_blocks=s.l2_hit_blocks,
                l2_hit_tokens=s.l2_hit_tokens, stored_blocks=dict(s.stored_blocks),
                removed_blocks=dict(s.removed_blocks), unknown_removed_blocks=s.unknown_removed_blocks,
                resident_blocks={TIER_NAMES[t]: n for t, n in s.resident.items()},
                aged_out=s.aged_out, clears=s.clears, reuse_buckets=buckets, reuse_sum=dict(s.reuse_sum),
            ))
        models = tuple(
            ModelSnapshot(m, idx.duplicated, idx.resident_blocks(), self.overlap(m), idx.sketch.nbytes,
                          len(idx.storage))
            for m, idx in sorted(self.indexes.items())
        )
        return KvSnapshot(tuple(engines), models, self.clock())


def miss_causes() -> tuple[str, ...]:
    return CAUSES


def reuse_bucket_bounds() -> tuple[float, ...]:
    return REUSE_BUCKETS
