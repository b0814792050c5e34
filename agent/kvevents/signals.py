"""Block-level workload signals from decoded KV-event batches (pure; no sockets, no threads).

`KvSignals` owns one `FleetIndex` per model and the per-engine stream counters. The manager
feeds it decoded batches in order; the agent's scrape loop feeds it vLLM's prompt-token counters
(`observe_prompt_tokens`) so the workload overlap can be computed:

    overlap = 1 - cold prompt tokens (blocks never seen anywhere in the fleet) / prompt tokens

over a sliding window. `snapshot()` returns a frozen, self-contained view for exporters.
"""
from __future__ import annotations

import collections
import dataclasses
import math
from collections.abc import Callable, Mapping

from agent.kvevents.index import CAUSES, REUSE_BUCKETS, TIER_NAMES, FleetIndex, IndexLimits
from agent.kvevents.wire import Batch, Cleared, Removed, Stored


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
    restarts: int = 0
    rejected: dict[str, int] = dataclasses.field(default_factory=dict)
    last_seq: int | None = None
    last_event_ts: float | None = None


@dataclasses.dataclass(frozen=True)
class OverlapReading:
    """Workload overlap over `[start, end]` (wall seconds): 1 - cold_tokens / prompt_tokens."""

    model: str
    ratio: float
    prompt_tokens: float
    cold_tokens: float
    start: float
    end: float


@dataclasses.dataclass(frozen=True)
class EngineSnapshot:
    engine: EngineId
    stream: StreamStats
    miss_blocks: Mapping[str, int]
    miss_tokens: Mapping[str, int]
    external_hit_blocks: int
    external_hit_tokens: int
    rereported_blocks: int
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


@dataclasses.dataclass(frozen=True)
class KvSnapshot:
    engines: tuple[EngineSnapshot, ...]
    models: tuple[ModelSnapshot, ...]
    taken_at: float


class _PromptCounter:
    """A cumulative counter scraped from a pod; survives counter resets (pod restarts)."""

    __slots__ = ("last", "total")

    def __init__(self) -> None:
        self.last: float | None = None
        self.total = 0.0

    def update(self, value: float) -> None:
        if self.last is not None:
            self.total += value - self.last if value >= self.last else value
        self.last = value


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
        self._prompt: dict[tuple[str, str], _PromptCounter] = {}
        self._samples: dict[str, collections.deque[tuple[float, float, float]]] = {}

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
        self.index(engine.model).apply(engine.key, batch.ts, batch.events)

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

    def gap(self, engine: EngineId, missed: int) -> None:
        st = self.stream(engine)
        st.gaps += 1
        st.missed_messages += missed

    def replay_result(self, engine: EngineId, recovered: int, lost: int) -> None:
        st = self.stream(engine)
        st.replayed_messages += recovered
        st.lost_messages += lost

    def forget(self, engine: EngineId) -> None:
        """The pod left the fleet: drop its residency (its counters go with it)."""
        self.streams.pop(engine, None)
        idx = self.indexes.get(engine.model)
        if idx is not None:
            idx.drop_engine(engine.key)

    # -- prompt tokens and overlap ---------------------------------------------------------
    def cold_tokens(self, model: str) -> int:
        idx = self.indexes.get(model)
        if idx is None:
            return 0
        return sum(e.stats.miss_tokens["cold"] for e in idx.engines.values())

    def observe_prompt_tokens(self, pod: str, model: str, total: float, ts: float | None = None) -> None:
        """Feed `vllm:prompt_tokens_total` of one pod (cumulative, as scraped)."""
        now = self.clock() if ts is None else ts
        self._prompt.setdefault((pod, model), _PromptCounter()).update(float(total))
        fleet = sum(c.total for (_, m), c in self._prompt.items() if m == model)
        samples = self._samples.setdefault(model, collections.deque())
        samples.append((now, fleet, float(self.cold_tokens(model))))
        horizon = now - max(self.overlap_window_s, 1.0) * 4
        while len(samples) > 2 and samples[1][0] < horizon:
            samples.popleft()

    def overlap(self, model: str | None = None, window_s: float | None = None) -> OverlapReading | None:
        """Workload overlap over the last `window_s` seconds (default: the configured window).
        None when no prompt tokens were observed in the window or the model is unknown."""
        if model is None:
            if len(self._samples) != 1:
                return None
            model = next(iter(self._samples))
        samples = self._samples.get(model)
        if not samples:
            return None
        window = self.overlap_window_s if window_s is None else window_s
        end_ts, end_prompt, end_cold = samples[-1]
        base = samples[0]
        for s in samples:
            if s[0] >= end_ts - window:
                break
            base = s
        d_prompt, d_cold = end_prompt - base[1], end_cold - base[2]
        if d_prompt <= 0:
            return None
        ratio = min(1.0, max(0.0, 1.0 - d_cold / d_prompt))
        return OverlapReading(model, ratio, d_prompt, d_cold, base[0], end_ts)

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
                rereported_blocks=s.rereported_blocks, stored_blocks=dict(s.stored_blocks),
                removed_blocks=dict(s.removed_blocks), unknown_removed_blocks=s.unknown_removed_blocks,
                resident_blocks={TIER_NAMES[t]: n for t, n in s.resident.items()},
                aged_out=s.aged_out, clears=s.clears, reuse_buckets=buckets, reuse_sum=dict(s.reuse_sum),
            ))
        models = tuple(
            ModelSnapshot(m, idx.duplicated, idx.resident_blocks(), self.overlap(m), idx.sketch.nbytes)
            for m, idx in sorted(self.indexes.items())
        )
        return KvSnapshot(tuple(engines), models, self.clock())


def miss_causes() -> tuple[str, ...]:
    return CAUSES


def reuse_bucket_bounds() -> tuple[float, ...]:
    return REUSE_BUCKETS
