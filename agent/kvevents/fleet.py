"""Fleet-wide block signals that are not sums, from mergeable sketches the shards export.

With sharded agents each replica follows the KV events of its own pods only, so a block stored
on pod A (shard 0) and again on pod B (shard 1) is new to both shards. Sums (stored blocks,
prompt tokens) add up across shards; distinct counts do not. Each replica therefore keeps, per
model and per time slot, a HyperLogLog of the block hashes stored on the GPU tier (hll.py), the
number of such stores, and the sum over its engines of each engine's distinct blocks (a small
HyperLogLog per engine; an engine lives on one shard, so these sums add up). It serves them on
`GET /kv/sketch?window_s=S`; any replica (the leader's tuner, dashboards) merges its own and its
peers' answers (register-wise maximum, exact for the union) into:

  distinct blocks    D = |union of the stored hashes over the window|           (HLL estimate)
  block overlap      1 - D / S, S = block stores in the window: the share of stores whose
                     block the fleet had already stored in the window (cross-pod reuse included)
  duplication        (sum over engines of their distinct blocks) / D: on how many engines an
                     average block was stored in the window (1 = no cross-pod duplication)

Error bound: D has relative standard error e = 1.04 / sqrt(2^p) (0.41% at p = 16); the overlap
error is (1 - overlap) x (D's relative error), so below 3e = 1.2 percentage points with 99.7%
confidence, whatever the fleet size. Duplication carries D's error plus the per-engine sketches'
(p = 12: 1.6% each, averaging out over engines). Tested against exact sets on the twin's streams
(tests/test_kv_fleet_sketch.py). Memory: 64 KiB per model per slot, 4 KiB per engine per slot.

The drift detector's `reuse_ratio` needs one more sketch (fleet_overlap.py): the hashes this
shard's index counted as cold misses, per finer slot (a quarter slot), kept for the window and
`COLD_HISTORY_WINDOWS` windows before it (64 KiB per model per quarter slot that saw a cold miss).
"""
from __future__ import annotations

import json
import logging
import math
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np
from prometheus_client.core import GaugeMetricFamily, Metric

from agent.kvevents.hll import DEFAULT_P, HyperLogLog
from contracts.jsonsafe import dumps as json_dumps

ENGINE_P = 12
log = logging.getLogger(__name__)


FLUSH_HASHES = 16_384  # hashes buffered per slot before one vectorised sketch update
COLD_HISTORY_WINDOWS = 3  # cold sketches kept before the window, in windows
COLD_SLOTS_PER_SLOT = 4  # cold sketch slots per block sketch slot (15 s with the default 300 s window)


@dataclass
class _Slot:
    fleet: HyperLogLog
    stores: int
    engines: dict[str, HyperLogLog]
    pending: dict[str, list[int]]
    pending_n: int = 0


@dataclass
class _ColdSlot:
    """The hashes this shard's index counted as cold misses in one slot (fleet_overlap.py)."""

    sketch: HyperLogLog
    blocks: int = 0
    pending: list[int] = field(default_factory=list)

    def flush(self) -> None:
        if self.pending:
            self.sketch.add(np.asarray(self.pending, dtype=np.uint64))
            self.pending = []


class BlockSketches:
    """Per model, a ring of time slots of sketches. Pure state; the caller serialises calls."""

    def __init__(self, window_s: float = 300.0, slots: int = 5, p: int = DEFAULT_P, engine_p: int = ENGINE_P,
                 clock: Callable[[], float] | None = None, cold_history_s: float | None = None) -> None:
        import time

        if window_s <= 0 or slots < 1:
            raise ValueError("window_s must be positive and slots at least 1")
        self.window_s = window_s
        self.slot_s = window_s / slots
        self.p = p
        self.engine_p = engine_p
        self.clock = clock or time.time
        # cold sketches are kept this long before the window too: a block another shard saw
        # first up to this long before the window is not fleet-cold (fleet_overlap.py)
        self.cold_history_s = COLD_HISTORY_WINDOWS * window_s if cold_history_s is None else cold_history_s
        # finer slots for the cold sketches: their span must match a counter reading's closely
        self.cold_slot_s = self.slot_s / COLD_SLOTS_PER_SLOT
        self._models: dict[str, dict[int, _Slot]] = {}
        self._cold: dict[str, dict[int, _ColdSlot]] = {}

    def _slot(self, model: str, ts: float) -> _Slot:
        slots = self._models.setdefault(model, {})
        key = math.floor(ts / self.slot_s)
        slot = slots.get(key)
        if slot is None:
            slot = slots[key] = _Slot(HyperLogLog(self.p), 0, {}, {})
            self._prune(slots, key)
        return slot

    def add(self, model: str, engine: str, ts: float, hashes: Sequence[int]) -> None:
        """Buffer one message's stored hashes; the sketches take them in large vectorised
        batches (numpy's per-call cost would otherwise dominate small messages)."""
        if len(hashes) == 0:
            return
        slot = self._slot(model, ts)
        slot.stores += len(hashes)
        slot.pending.setdefault(engine, []).extend(hashes)
        slot.pending_n += len(hashes)
        if slot.pending_n >= FLUSH_HASHES:
            self._flush(slot)

    def add_cold(self, model: str, ts: float, hashes: Sequence[int]) -> None:
        """Buffer the hashes this shard's index counted as cold misses (never seen on its pods):
        merged across shards, their union is the fleet's cold set (fleet_overlap.py)."""
        if len(hashes) == 0:
            return
        slots = self._cold.setdefault(model, {})
        key = math.floor(ts / self.cold_slot_s)
        slot = slots.get(key)
        if slot is None:
            slot = slots[key] = _ColdSlot(HyperLogLog(self.p))
            keep = math.ceil((self.window_s + self.cold_history_s) / self.cold_slot_s) + 1
            for k in [k for k in slots if k <= key - keep]:
                del slots[k]
        slot.blocks += len(hashes)
        slot.pending.extend(hashes)
        if len(slot.pending) >= FLUSH_HASHES:
            slot.flush()

    def _flush(self, slot: _Slot) -> None:
        for engine, hashes in slot.pending.items():
            arr = np.asarray(hashes, dtype=np.uint64)
            slot.fleet.add(arr)
            eng = slot.engines.get(engine)
            if eng is None:
                eng = slot.engines[engine] = HyperLogLog(self.engine_p)
            eng.add(arr)
        slot.pending = {}
        slot.pending_n = 0

    def _prune(self, slots: dict[int, _Slot], newest: int) -> None:
        keep = math.ceil(self.window_s / self.slot_s) + 1
        for k in [k for k in slots if k <= newest - keep]:
            del slots[k]

    def state(self, window_s: float | None = None, now: float | None = None) -> dict:
        """This replica's mergeable view of the last `window_s` seconds (whole slots), as JSON."""
        window_s = self.window_s if window_s is None else window_s
        now = self.clock() if now is None else now
        first = math.floor((now - window_s) / self.slot_s) + 1
        models = {}
        for model, slots in self._models.items():
            chosen = [s for k, s in slots.items() if k >= first]
            if not chosen:
                continue
            for s in chosen:
                self._flush(s)
            fleet = HyperLogLog(self.p)
            engines: dict[str, HyperLogLog] = {}
            for s in chosen:
                fleet.merge(s.fleet)
                for name, h in s.engines.items():
                    engines[name] = engines[name].merge(h) if name in engines else h.copy()
            models[model] = {"p": self.p, "registers": fleet.to_text(), "stores": sum(s.stores for s in chosen),
                             "engine_distinct_sum": sum(h.estimate() for h in engines.values()),
                             "engines": len(engines)}
        return {"window_s": window_s, "models": models}

    def cold_state(self, model: str, since: float, until: float) -> dict:
        """The hashes this shard counted cold over [since, until] (whole slots: one HyperLogLog
        and the exact count) and over the `cold_history_s` before it (fleet_overlap.py)."""
        first, last = math.floor(since / self.cold_slot_s), math.floor(until / self.cold_slot_s)
        inside, before = HyperLogLog(self.p), HyperLogLog(self.p)
        blocks = 0
        horizon = first - math.ceil(self.cold_history_s / self.cold_slot_s)
        for k, s in self._cold.get(model, {}).items():
            if not horizon <= k <= last:
                continue
            s.flush()
            if k >= first:
                inside.merge(s.sketch)
                blocks += s.blocks
            else:
                before.merge(s.sketch)
        return {"p": self.p, "registers": inside.to_text(), "blocks": blocks, "before_registers": before.to_text()}


@dataclass(frozen=True)
class FleetBlocks:
    model: str
    distinct_blocks: float
    stores: int
    overlap: float | None
    duplication: float | None
    engines: int


def merge_states(states: Iterable[Mapping]) -> list[FleetBlocks]:
    """Merge shards' `state()` answers (ValueError on a malformed one)."""
    acc: dict[str, tuple[HyperLogLog, int, float, int]] = {}
    for st in states:
        models = st.get("models") if isinstance(st, Mapping) else None
        if not isinstance(models, Mapping):
            raise ValueError("sketch state without `models`")  # noqa: TRY004 - bad input, one error kind
        for model, m in models.items():
            try:
                h = HyperLogLog.from_text(int(m["p"]), str(m["registers"]))
                stores, dsum, engines = int(m["stores"]), float(m["engine_distinct_sum"]), int(m["engines"])
            except (KeyError, TypeError) as exc:
                raise ValueError(f"model {model!r}: malformed sketch ({exc})") from None
            if model in acc:
                h0, s0, d0, e0 = acc[model]
                acc[model] = (h0.merge(h), s0 + stores, d0 + dsum, e0 + engines)
            else:
                acc[model] = (h, stores, dsum, engines)
    out = []
    for model, (h, stores, dsum, engines) in sorted(acc.items()):
        d = h.estimate()
        overlap = None if stores <= 0 else min(1.0, max(0.0, 1.0 - d / stores))
        dup = None if d <= 0 else max(1.0, dsum / d)
        out.append(FleetBlocks(model, d, stores, overlap, dup, engines))
    return out


def state_json(state: dict) -> bytes:
    return json_dumps(state, separators=(",", ":")).encode()


class FleetBlocksCollector:
    """`tierpilot_kv_fleet_*` from this replica's sketches merged with its peers'.

    `local()` gives this replica's state; `fetch(url, timeout)` reads a peer's
    `/kv/sketch`. A peer that fails is left out (counted in `tierpilot_kv_fleet_shards{state}`)."""

    collector_name = "kv_fleet_blocks"  # the `collector` label of tierpilot_collector_up

    def __init__(self, local: Callable[[], dict], peers: Sequence[str] = (),
                 fetch: Callable[[str, float], bytes] | None = None, timeout_s: float = 5.0,
                 window_s: float = 300.0) -> None:
        self.local = local
        self.peers = tuple(p.rstrip("/") for p in peers)
        self.fetch = fetch
        self.timeout_s = timeout_s
        self.window_s = window_s
        self._problems: dict[str, str | None] = {}

    def read(self) -> tuple[list[FleetBlocks], int, int]:
        states = [self.local()]
        failed = 0
        for peer in self.peers:
            try:
                assert self.fetch is not None
                doc = json.loads(self.fetch(f"{peer}/kv/sketch?window_s={self.window_s:g}", self.timeout_s))
                merge_states([doc])  # validates before it joins the merge
                states.append(doc)
            except Exception as exc:  # noqa: BLE001 - any peer fault leaves that peer out of this read
                failed += 1
                self._note(peer, str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__)
            else:
                self._note(peer, None)
        return merge_states(states), 1 + len(self.peers) - failed, failed

    def _note(self, peer: str, problem: str | None) -> None:
        """One log line when a peer starts failing (or fails differently), one when it answers again."""
        if self._problems.get(peer) == problem:
            return
        if problem is not None:
            log.warning("fleet block sketches: shard %s left out: %s", peer, problem)
        else:
            log.info("fleet block sketches: shard %s answers again", peer)
        self._problems[peer] = problem

    def describe(self) -> list[Metric]:
        return []

    def collect(self) -> Iterator[Metric]:
        blocks, ok, failed = self.read()
        distinct = GaugeMetricFamily("tierpilot_kv_fleet_distinct_blocks",
                                     "Distinct blocks stored on the GPU tier fleet-wide over the window "
                                     "(HyperLogLog union of every shard).", labels=["model"])
        overlap = GaugeMetricFamily("tierpilot_kv_fleet_block_overlap_ratio",
                                    "Share of block stores whose block the fleet had already stored in the "
                                    "window, 0..1 (1 - distinct / stores).", labels=["model"])
        dup = GaugeMetricFamily("tierpilot_kv_fleet_duplication_ratio",
                                "Engines an average distinct block was stored on in the window (1 = none "
                                "duplicated across pods).", labels=["model"])
        for b in blocks:
            distinct.add_metric([b.model], b.distinct_blocks)
            if b.overlap is not None:
                overlap.add_metric([b.model], b.overlap)
            if b.duplication is not None:
                dup.add_metric([b.model], b.duplication)
        shards = GaugeMetricFamily("tierpilot_kv_fleet_shards", "Shards whose sketches were merged (ok) or "
                                   "left out of the last read (failed).", labels=["state"])
        shards.add_metric(["ok"], ok)
        shards.add_metric(["failed"], failed)
        yield from (distinct, overlap, dup, shards)
