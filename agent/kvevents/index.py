"""The fleet block index: which engines (pods, or pod + data-parallel rank) hold each block hash
on which tier, what each engine removed recently, and which hashes the fleet has ever seen.

Everything here is in-memory and single-threaded; the manager serialises calls. Memory is
bounded by `IndexLimits`: per-engine residency and removal history are two-generation
approximate-LRU maps (a full young generation becomes old and the previous old one is dropped),
and "ever seen" is a fixed-size generational Bloom filter (`SeenSketch`).

Miss attribution for a block stored on the GPU tier (`medium` "GPU") of engine E, first match:
  1. already resident on E's GPU            -> re-report, not counted as a miss
  2. resident on a lower tier of E (CPU...) -> external hit (loaded from LMCache or E's CPU tier),
                                               not a miss; an L2 hit when that CPU copy was promoted
                                               from the shared L2 (see below)
  3. resident on another engine             -> routing miss
  4. removed from E earlier (any tier)      -> capacity miss
  5. never seen anywhere in the fleet       -> cold miss
  6. seen, but held nowhere now             -> capacity miss (the fleet had it and lost it)
Blocks stored on other tiers (CPU offload copies) update residency but are never misses.

vLLM's native tiering publishes its CPU tier as `medium` "CPU" (per engine) and its fs tier as
"STORAGE". The fs tier's directory is shared by the engines (a Curvine mount), so a STORAGE block
is fleet-resident: it is kept once per model (`storage`), not per engine, and never makes an engine
a holder. vLLM reads a block from the fs tier into the engine's CPU tier first (a promotion: a CPU
store of a hash the engine does not hold on its GPU but the shared L2 does), then loads it onto the
GPU: that GPU store counts as an L2 hit, as the engine's `chunk_hits{tier="1:fs"}` does. A block in
the shared L2 stored on a GPU without a promotion was computed (its file was gone, e.g. evicted by
the mount's quota without an event): a miss, attributed as above.
"""
from __future__ import annotations

import bisect
from collections.abc import Iterator

import numpy as np

from agent.kvevents.index_state import (
    CAUSES,
    CPU,
    DISTANCE_BUCKETS,
    FAR,
    GPU,
    PROMOTED,
    REUSE_BUCKETS,
    STORAGE,
    TIER_NAMES,
    EngineState,
    EngineStats,
    IndexLimits,
    TwoGenMap,
    bump,
    distance_bucket,
    tier_bit,
)
from agent.kvevents.sketch import SeenSketch
from agent.kvevents.wire import Cleared, Event, Removed, Stored

__all__ = ["CAUSES", "CPU", "DISTANCE_BUCKETS", "GPU", "REUSE_BUCKETS", "STORAGE", "TIER_NAMES", "EngineState",
           "EngineStats", "FleetIndex", "IndexLimits", "TwoGenMap", "distance_bucket", "tier_bit"]

_SKETCH_CHUNK = 16_384  # hashes per sketch call: a 3 MB message of hashes would need ~200 MB at once


class FleetIndex:
    """Block index of one model across all its engines."""

    def __init__(self, limits: IndexLimits | None = None, group_idx: int = 0) -> None:
        self.limits = limits or IndexLimits()
        self.group_idx = group_idx
        self.sketch = SeenSketch(self.limits.seen_capacity, self.limits.seen_fp_rate,
                                 self.limits.seen_generations)
        self.holders: dict[int, int] = {}  # hash -> bitmask of engines holding it (any tier)
        # Shadow of the shared L2's recency: the fleet-wide order number of each hash's last GPU
        # store that was not an L1 hit (computed or read from L2: exactly what touches L2).
        self.l2_shadow = TwoGenMap(self.limits.shadow_l2)
        self.l2_seq = 0
        self.storage = TwoGenMap(self.limits.storage_blocks)  # hashes in the shared L2 (fs tier)
        self.duplicated = 0  # hashes held by >= 2 engines
        # when a list: the hashes of every cold miss are appended (a sharded agent sketches them,
        # agent/kvevents/fleet.py); None (the default) costs nothing
        self.cold_sink: list[int] | None = None
        self.engines: dict[str, EngineState] = {}
        self._free_positions: list[int] = []

    # -- engines ---------------------------------------------------------------------------
    def engine(self, name: str) -> EngineState:
        st = self.engines.get(name)
        if st is None:
            pos = self._free_positions.pop() if self._free_positions else len(self.engines)
            st = self.engines[name] = EngineState(pos, name, self.limits)
        return st

    def set_caps(self, name: str, resident: int, history: int) -> None:
        """Resize one engine's residency and history caps (its share of the pod and fleet budgets);
        shrinking ages out the oldest entries at once."""
        st = self.engine(name)
        st.resident.half, st.history.half = max(1, resident // 2), max(1, history // 2)
        while len(st.resident) > resident:
            dropped, st.resident.old, st.resident.young = st.resident.old, st.resident.young, {}
            self._aged(st, dropped)
        while len(st.history) > history:
            st.history.old, st.history.young = st.history.young, {}

    def set_shadow_cap(self, cap: int) -> None:
        """Resize the L2 shadow (this model's share of the fleet's)."""
        sh = self.l2_shadow
        sh.half = max(1, cap // 2)
        while len(sh) > cap:
            sh.old, sh.young = sh.young, {}

    def drop_engine(self, name: str) -> None:
        """Forget an engine (its pod is gone): its blocks stop counting as resident."""
        st = self.engines.pop(name, None)
        if st is not None:
            self._release_all(st)
            self._free_positions.append(st.bit.bit_length() - 1)

    # -- residency bookkeeping -------------------------------------------------------------
    def _unhold(self, h: int, bit: int) -> None:
        mask = self.holders.get(h, 0)
        if not mask & bit:
            return
        if mask.bit_count() == 2:
            self.duplicated -= 1
        mask &= ~bit
        if mask:
            self.holders[h] = mask
        else:
            del self.holders[h]

    def _hold(self, h: int, bit: int) -> None:
        mask = self.holders.get(h, 0)
        if mask & bit:
            return
        if mask.bit_count() == 1:
            self.duplicated += 1
        self.holders[h] = mask | bit

    def _aged(self, st: EngineState, dropped: dict[int, object]) -> None:
        resident = st.stats.resident
        for h, mask in dropped.items():
            self._unhold(h, st.bit)
            for tb in TIER_NAMES:
                if mask & tb:  # type: ignore[operator]
                    resident[tb] = resident.get(tb, 0) - 1
        st.stats.aged_out += len(dropped)

    def _release_all(self, st: EngineState) -> None:
        for h in st.resident:
            self._unhold(h, st.bit)
        st.resident.clear()
        st.stats.resident = {}

    # -- applying events -------------------------------------------------------------------
    def apply(self, engine: str, ts: float, events: list[Event]) -> None:
        st = self.engine(engine)
        group = self.group_idx
        # Consecutive events of one kind and medium (and block size) are applied as one run: the
        # per-hash work is in order, so the result is the same as event by event (vLLM emits one
        # BlockRemoved per evicted block, and a step's prefills as several BlockStored).
        runs: list[tuple[type | None, str, int, list[int]]] = []
        run: list[int] = []
        run_kind: type | None = None  # kind of the open run, None when none is open
        run_medium, run_size = "", 0
        stored: list[int] = []  # one vectorised sketch pass per message for all stored hashes
        for ev in events:
            kind = type(ev)
            if kind is Cleared or (ev.group is not None and ev.group != group):  # type: ignore[union-attr]
                runs.append((kind if kind is Cleared else None, "", 0, []))  # None: another group's event
                run_kind = None
                continue
            if kind is Stored:
                stored += ev.hashes  # type: ignore[union-attr]
                size = ev.block_size  # type: ignore[union-attr]
            else:
                size = 0
            medium = ev.medium  # type: ignore[union-attr]
            if kind is run_kind and medium == run_medium and size == run_size:
                run += ev.hashes  # type: ignore[union-attr]
            else:
                run = list(ev.hashes)  # type: ignore[union-attr]  # a copy: the event stays as decoded
                runs.append((kind, medium, size, run))
                run_kind, run_medium, run_size = kind, medium, size
        seen: Iterator[bool] = iter(self._seen_flags(stored).tolist() if stored else ())
        for kind, medium, size, hashes in runs:
            if kind is Removed:
                self._removed(st, ts, medium, hashes)
            elif kind is Stored:
                self._stored(st, ts, medium, size, hashes, seen)
            elif kind is Cleared:
                self.clear_engine(engine, ts)
            else:
                st.stats.other_group_events += 1

    def _seen_flags(self, stored: list[int]) -> np.ndarray:
        """The sketch's "seen before this message" of each stored hash; adds them all."""
        arr = np.fromiter(stored, dtype=np.uint64, count=len(stored))
        if len(arr) <= _SKETCH_CHUNK:
            return self.sketch.check_and_add(arr)
        # bounded temporaries (k probes x 8 bytes per hash), same answers as one call
        parts = range(0, len(arr), _SKETCH_CHUNK)
        flags = np.concatenate([self.sketch.contains(arr[i:i + _SKETCH_CHUNK]) for i in parts])
        for i in parts:
            self.sketch.check_and_add(arr[i:i + _SKETCH_CHUNK])
        return flags

    def _stored(self, st: EngineState, ts: float, medium: str, block_size: int, hashes: list[int],
                seen: Iterator[bool]) -> None:
        """A run of stores of one medium; consumes one `seen` flag per hash."""
        stats = st.stats
        tb = tier_bit(medium)
        bump(stats.stored_blocks, medium, len(hashes))
        if tb == GPU:
            size = block_size if block_size > 0 else stats.block_size
            if block_size > 0:
                stats.block_size = block_size
            self._stored_gpu(st, ts, size, hashes, seen)
        elif tb == STORAGE:  # the shared L2: resident for the fleet, not for this engine
            for h in hashes:
                next(seen)
                self.storage.put(h, True)
        else:
            self._stored_lower(st, tb, hashes, seen)

    def _stored_lower(self, st: EngineState, tb: int, hashes: list[int], seen: Iterator[bool]) -> None:
        # A copy on a lower tier of the engine (CPU offload): residency only, never a miss.
        storage = self.storage
        promote = tb == CPU and len(storage) > 0  # a CPU store may be a read from the shared L2
        res = st.resident
        ry, ro, half = res.young, res.old, res.half
        holders, bit = self.holders, st.bit
        added = 0
        for h, _ in zip(hashes, seen):  # consumes one flag per hash, like next(seen)
            mask = ry.get(h)
            if mask is None:
                mask = ro.pop(h, 0)
            if not mask & tb:
                added += 1
            if not mask:
                held = holders.get(h, 0)
                if held.bit_count() == 1:
                    self.duplicated += 1
                holders[h] = held | bit
            if promote and not mask & (GPU | tb) and storage.get(h) is not None:
                mask |= PROMOTED  # read back from the shared L2 into this engine's CPU tier
            ry[h] = mask | tb
            if len(ry) >= half:
                dropped, res.old, res.young = ro, ry, {}
                ro, ry = res.old, res.young
                self._aged(st, dropped)
        st.stats.resident[tb] = st.stats.resident.get(tb, 0) + added

    def _stored_gpu(self, st: EngineState, ts: float, size: int, hashes: list[int],
                    seen: Iterator[bool]) -> None:
        # Hot path, counted in bytecodes: the two-generation maps and distance_bucket are inlined;
        # `room` / `sroom` are half - len(young) of the residency / L2 shadow maps, kept by counting.
        stats, res, hist, holders, bit = st.stats, st.resident, st.history, self.holders, st.bit
        ry, ro, half, hy, ho = res.young, res.old, res.half, hist.young, hist.old
        others = ~bit
        cold = capacity = routing = l2_hits = rereported = 0
        shadow = self.l2_shadow
        sy, so, shalf, seq = shadow.young, shadow.old, shadow.half, self.l2_seq
        room, sroom = half - len(ry), shalf - len(sy)
        cold_sink = self.cold_sink
        cap_dist, rout_dist = stats.miss_distance["capacity"], stats.miss_distance["routing"]
        reused: list[object] = []  # the removals of re-stored hashes, observed in order below
        for h, was_seen in zip(hashes, seen):  # consumes one flag per hash, like next(seen)
            mask = ry.get(h)
            if mask is None:
                mask = ro.pop(h, 0)
                room -= 1  # a new key in ry
            if h in hy:  # a hash is in one generation at most
                removed = True
                reused.append(hy.pop(h))
            elif h in ho:
                removed = True
                reused.append(ho.pop(h))
            else:
                removed = False
            if mask & GPU:
                rereported += 1
            elif mask:
                if mask & PROMOTED:
                    l2_hits += 1
                    mask &= ~PROMOTED
            else:
                last = sy.get(h)
                if last is None:  # popping is the put's
                    last = so.pop(h, None)
                    sroom -= 1  # a new key in sy
                if last is None:
                    bucket = FAR
                else:  # distance_bucket(seq - last)
                    d = seq - last
                    bucket = d if d < 4 else 4 * d.bit_length() + ((d >> (d.bit_length() - 3)) & 3) - 8
                held = holders.get(h, 0)
                if held & others:
                    routing += 1
                    rout_dist[bucket] += size
                elif removed or was_seen:
                    capacity += 1
                    cap_dist[bucket] += size
                else:
                    cold += 1
                    if cold_sink is not None:
                        cold_sink.append(h)
                sy[h] = seq  # inlined TwoGenMap.put; a dropped generation simply ages out
                seq += 1
                if sroom <= 0:
                    shadow.old, shadow.young = sy, {}
                    so, sy, sroom = sy, shadow.young, shalf
                if held and held.bit_count() == 1:
                    self.duplicated += 1
                holders[h] = held | bit
            ry[h] = mask | GPU
            if room <= 0:
                dropped, res.old, res.young = ro, ry, {}
                ro, ry, room = res.old, res.young, half
                self._aged(st, dropped)
        self.l2_seq = seq
        if reused:
            self._observe_reuse(stats, reused, ts)
        added = len(hashes) - rereported  # each hash not on the GPU yet is added: a hit or a miss
        external = added - cold - capacity - routing
        stats.resident[GPU] = stats.resident.get(GPU, 0) + added
        stats.rereported_blocks += rereported
        stats.external_hit_blocks += external
        stats.external_hit_tokens += external * size
        stats.l2_hit_blocks += l2_hits
        stats.l2_hit_tokens += l2_hits * size
        for cause, n in (("cold", cold), ("capacity", capacity), ("routing", routing)):
            stats.miss_blocks[cause] += n
            stats.miss_tokens[cause] += n * size

    @staticmethod
    def _observe_reuse(stats: EngineStats, removals: list[object], ts: float) -> None:
        """Reuse distances of blocks stored again at `ts`, each (tier bit, removal time), in the
        order they were stored."""
        reuse_counts, reuse_sum, left = stats.reuse_counts, stats.reuse_sum, bisect.bisect_left
        for tb, removed_ts in removals:  # type: ignore[misc]
            medium = TIER_NAMES[tb]
            dist = max(0.0, ts - removed_ts)
            counts = reuse_counts.get(medium)
            if counts is None:
                counts = reuse_counts[medium] = [0] * (len(REUSE_BUCKETS) + 1)
                reuse_sum[medium] = 0.0
            counts[left(REUSE_BUCKETS, dist)] += 1  # buckets are "<= bound"
            reuse_sum[medium] += dist

    def _removed(self, st: EngineState, ts: float, medium: str, hashes: list[int]) -> None:
        # Hot path: the two-generation maps and `_unhold` are inlined.
        stats = st.stats
        tb = tier_bit(medium)
        bump(stats.removed_blocks, medium, len(hashes))
        if tb == STORAGE:
            for h in hashes:
                if self.storage.pop(h) is None:
                    stats.unknown_removed_blocks += 1
            return
        res, hist = st.resident, st.history
        ry, ro = res.young, res.old
        hy, ho, hhalf = hist.young, hist.old, hist.half
        holders, bit = self.holders, st.bit
        clear = ~(tb | PROMOTED) if tb == CPU else ~tb
        gpu = tb == GPU
        removal = (tb, ts)
        unknown = gone = 0
        for h in hashes:
            mask = ry.get(h)
            in_young = mask is not None
            if not in_young:
                mask = ro.get(h, 0)
            if not mask & tb:
                unknown += 1
            else:
                gone += 1
                mask &= clear
                if mask:
                    (ry if in_young else ro)[h] = mask
                else:
                    del (ry if in_young else ro)[h]
                    held = holders.get(h, 0)
                    if held & bit:
                        if held.bit_count() == 2:
                            self.duplicated -= 1
                        held &= ~bit
                        if held:
                            holders[h] = held
                        else:
                            del holders[h]
            # inlined TwoGenMap.put: a GPU removal wins (what a re-store pays for)
            if gpu or (h not in hy and h not in ho):
                if h in ho:
                    del ho[h]
                hy[h] = removal
                if len(hy) >= hhalf:
                    hist.old, hist.young = hy, {}
                    ho, hy = hy, hist.young
        stats.unknown_removed_blocks += unknown
        stats.resident[tb] = stats.resident.get(tb, 0) - gone

    def clear_engine(self, engine: str, ts: float) -> None:
        """AllBlocksCleared or a detected restart: the engine holds nothing any more. Its GPU
        blocks enter the removal history, so storing them again counts as a capacity miss."""
        st = self.engine(engine)
        for h, mask in list(st.resident.items()):
            if mask & GPU:  # type: ignore[operator]
                st.history.put(h, (GPU, ts))
        self._release_all(st)
        st.stats.clears += 1

    # -- read-outs -------------------------------------------------------------------------
    def resident_blocks(self) -> int:
        return len(self.holders)
