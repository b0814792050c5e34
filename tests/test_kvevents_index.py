"""Exact signal values on hand-built event streams (no sockets)."""
from __future__ import annotations

import numpy as np
import pytest

from agent.kvevents import index as index_module
from agent.kvevents.index import FleetIndex, IndexLimits, TwoGenMap
from agent.kvevents.signals import EngineId, KvSignals
from agent.kvevents.sketch import SeenSketch, _mix
from agent.kvevents.wire import Batch, Cleared, Removed, Stored

A, B = EngineId("a", "m"), EngineId("b", "m")


def gpu(*hashes: int, size: int = 16, group: int | None = 0) -> Stored:
    return Stored(list(hashes), None, size, "GPU", group)


def cpu(*hashes: int, size: int = 16) -> Stored:
    return Stored(list(hashes), None, size, "CPU", None)


def rm(*hashes: int, medium: str = "GPU") -> Removed:
    return Removed(list(hashes), medium, 0)


def feed(sig: KvSignals, engine: EngineId, ts: float, *events: object, seq: int = 0) -> None:
    sig.apply(engine, Batch(b"", seq, ts, 0, list(events), {}))  # type: ignore[arg-type]


def snap_engine(sig: KvSignals, engine: EngineId):
    return next(e for e in sig.snapshot().engines if e.engine == engine)


def test_miss_attribution_cold_capacity_routing_and_external_hits() -> None:
    sig = KvSignals()
    feed(sig, A, 1.0, gpu(1, 2, 3))  # cold x3
    feed(sig, B, 2.0, gpu(1, 2, 4))  # routing x2 (on a), cold x1
    feed(sig, A, 3.0, rm(3), cpu(3))  # 3 leaves a's GPU, offloaded to a's CPU
    feed(sig, A, 4.0, gpu(3))  # loaded back from CPU: external hit, not a miss
    feed(sig, A, 5.0, rm(2), rm(1))
    feed(sig, A, 9.0, gpu(2))  # removed here but resident on b: routing wins
    feed(sig, B, 10.0, rm(4))
    feed(sig, A, 11.0, gpu(4))  # removed on b, held nowhere: capacity (fleet lost it)
    feed(sig, B, 12.0, rm(1))
    feed(sig, A, 15.0, gpu(1))  # removed from a at 5.0, held nowhere: capacity
    feed(sig, A, 16.0, gpu(1))  # already on a's GPU: re-report
    a, b = snap_engine(sig, A), snap_engine(sig, B)
    assert a.miss_blocks == {"cold": 3, "capacity": 2, "routing": 1}
    assert a.miss_tokens == {"cold": 48, "capacity": 32, "routing": 16}
    assert b.miss_blocks == {"cold": 1, "capacity": 0, "routing": 2}
    assert (a.external_hit_blocks, a.external_hit_tokens, a.rereported_blocks) == (1, 16, 1)
    assert a.stored_blocks == {"GPU": 8, "CPU": 1} and a.removed_blocks == {"GPU": 3}
    assert a.resident_blocks == {"GPU": 4, "CPU": 1}  # GPU: 1 2 3 4; CPU: 3
    assert b.resident_blocks == {"GPU": 1}  # 2
    m = sig.snapshot().models[0]
    assert m.duplicated_blocks == 1  # hash 2 on a and b
    assert m.resident_hashes == 4  # 1 2 3 4


def test_resident_counts_exactly() -> None:
    sig = KvSignals()
    feed(sig, A, 1.0, gpu(1, 2), cpu(2, 3))
    feed(sig, A, 2.0, rm(2, medium="CPU"), rm(9))  # 9 was never seen: unknown removal
    e = snap_engine(sig, A)
    assert e.resident_blocks == {"GPU": 2, "CPU": 1}
    assert e.unknown_removed_blocks == 1


def test_reuse_distance_histogram() -> None:
    sig = KvSignals()
    feed(sig, A, 0.0, gpu(1, 2))
    feed(sig, A, 1.0, rm(1), rm(2))
    feed(sig, A, 1.05, gpu(1))  # 0.05 s after removal -> bucket le=0.1
    feed(sig, A, 8.0, gpu(2))  # 7 s -> bucket le=10
    feed(sig, A, 9.0, cpu(5))
    feed(sig, A, 10.0, rm(5, medium="CPU"))
    feed(sig, A, 40.0, gpu(5))  # 30 s since the CPU removal -> le=30 (edge is inclusive)
    e = snap_engine(sig, A)
    gpu_cum = e.reuse_buckets["GPU"]
    # bounds: .01 .1 .5 1 5 10 30 60 300 900 3600 14400 86400 +Inf (cumulative)
    assert gpu_cum == (0, 1, 1, 1, 1, 2, 2, 2, 2, 2, 2, 2, 2, 2)
    assert e.reuse_sum["GPU"] == pytest.approx(7.05)
    assert e.reuse_buckets["CPU"] == (0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1)
    assert e.miss_blocks["capacity"] == 3


def test_clear_and_restart_empty_the_engine() -> None:
    sig = KvSignals()
    feed(sig, A, 1.0, gpu(1, 2))
    feed(sig, B, 1.5, gpu(1))
    feed(sig, A, 2.0, Cleared())
    a = snap_engine(sig, A)
    assert a.resident_blocks == {} and a.clears == 1
    assert sig.snapshot().models[0].duplicated_blocks == 0
    feed(sig, A, 3.0, gpu(2))  # held before the clear: capacity, distance 1 s
    sig.restart(B, 4.0)
    feed(sig, A, 5.0, gpu(1))  # b restarted, so 1 is nowhere: capacity on a (it was cleared there)
    a, b = snap_engine(sig, A), snap_engine(sig, B)
    assert a.miss_blocks == {"cold": 2, "capacity": 2, "routing": 0}
    assert b.stream.restarts == 1 and b.resident_blocks == {}
    assert a.reuse_buckets["GPU"][3] == 1  # le=1.0 holds the 1 s distance


def test_other_kv_cache_groups_are_not_indexed() -> None:
    sig = KvSignals(group_idx=0)
    feed(sig, A, 1.0, gpu(1, group=1), gpu(2, group=None), gpu(3, group=0))
    e = snap_engine(sig, A)
    assert e.miss_blocks["cold"] == 2
    assert sig.index("m").engines["a"].stats.other_group_events == 1


def test_block_size_zero_uses_the_engine_block_size() -> None:
    sig = KvSignals()
    feed(sig, A, 1.0, gpu(1, size=32), Stored([2], None, 0, "GPU", 0))
    assert snap_engine(sig, A).miss_tokens["cold"] == 64


def test_models_are_indexed_separately() -> None:
    sig = KvSignals()
    feed(sig, EngineId("a", "m1"), 1.0, gpu(1))
    feed(sig, EngineId("b", "m2"), 2.0, gpu(1))  # same hash, other model: cold again
    snap = sig.snapshot()
    assert [e.miss_blocks["cold"] for e in snap.engines] == [1, 1]
    assert [m.duplicated_blocks for m in snap.models] == [0, 0]


def test_overlap_from_prompt_counters_with_reset_and_window() -> None:
    sig = KvSignals(overlap_window_s=100.0)
    sig.observe_prompt_tokens("a", "m", 0, ts=0.0)
    sig.observe_prompt_tokens("b", "m", 0, ts=0.0)
    feed(sig, A, 1.0, gpu(1, 2, 3, 4))  # 64 cold tokens
    sig.observe_prompt_tokens("a", "m", 200, ts=50.0)
    sig.observe_prompt_tokens("b", "m", 56, ts=50.0)
    r = sig.overlap("m")
    assert r is not None and r.prompt_tokens == 256 and r.cold_tokens == 64 and r.ratio == 0.75
    feed(sig, B, 60.0, gpu(5))  # 16 cold
    sig.observe_prompt_tokens("b", "m", 40, ts=120.0)  # counter reset (pod restarted): +40, not -16
    r = sig.overlap("m")  # window [20, 120]: base sample at t=0 is the last one before 20 -> all
    assert r is not None and (r.prompt_tokens, r.cold_tokens) == (296, 80)
    r = sig.overlap("m", window_s=60.0)  # base = last sample before t=60, i.e. t=50
    assert r is not None and (r.prompt_tokens, r.cold_tokens) == (40, 16) and r.ratio == pytest.approx(0.6)
    assert sig.overlap("other") is None
    assert KvSignals().overlap() is None


def test_two_generation_map_ages_out_the_oldest() -> None:
    m = TwoGenMap(4)  # two generations of 2
    for k in range(1, 4):
        m.put(k, k)
    assert m.get(1) == 1 and m.get(3) == 3  # young={3}, old={1,2}
    m.put(1, 10)  # refresh 1 -> young={} after rotation: old={3,1}, 2 dropped
    assert m.get(2) is None and m.get(1) == 10 and len(m) == 2


def test_resident_cap_ages_out_and_keeps_holders_consistent() -> None:
    idx = FleetIndex(IndexLimits(resident_per_engine=4, history_per_engine=4, seen_capacity=1000))
    idx.apply("a", 1.0, [gpu(1, 2, 3, 4, 5, 6)])
    assert len(idx.engines["a"].resident) <= 4
    assert idx.engines["a"].stats.aged_out >= 2
    assert set(idx.holders) == set(idx.engines["a"].resident)
    assert sum(idx.engines["a"].stats.resident.values()) == len(idx.engines["a"].resident)


def test_sketch_false_positive_rate_and_ageing() -> None:
    sk = SeenSketch(capacity=20_000, fp_rate=0.001, generations=2)
    first = np.arange(1, 20_001, dtype=np.uint64)
    assert not sk.check_and_add(first).any()
    assert sk.contains(first).all()  # no false negatives
    probe = np.arange(10**9, 10**9 + 100_000, dtype=np.uint64)
    assert sk.contains(probe).mean() < 0.002
    assert sk.rotations == 1  # the full generation became the old one
    sk.check_and_add(np.arange(50_000, 70_000, dtype=np.uint64))  # fills the next: the first is dropped
    assert sk.rotations == 2
    assert sk.contains(first).mean() < 0.01
    assert sk.nbytes == 2 * sk.bits // 8


def test_the_sketch_sets_the_double_hashing_bits_of_each_mixed_hash() -> None:
    """The compiled probes are the splitmix64 double hashing computed here with numpy: bit
    (h1 + j * h2) mod 2**64 of the filter for j < k, so its answers do not depend on how it runs."""
    sk = SeenSketch(capacity=300, fp_rate=0.01, generations=2)
    rng = np.random.default_rng(5)
    hashes = np.concatenate([rng.integers(0, 2**64 - 1, 200, dtype=np.uint64, endpoint=True),
                             np.array([0, 1, 2**63, 2**64 - 1], dtype=np.uint64)])
    hashes = np.concatenate([hashes, hashes[:50]])  # repeats inside one call
    assert not sk.check_and_add(hashes).any()  # repeats report the state before the call
    h = _mix(hashes)
    h1, h2 = h & np.uint64(0xFFFFFFFF), (h >> np.uint64(32)) | np.uint64(1)
    pos = (h1[:, None] + np.arange(sk.k, dtype=np.uint64)[None, :] * h2[:, None]) & np.uint64(sk.bits - 1)
    expected = np.zeros(sk.bits // 8, dtype=np.uint8)
    np.bitwise_or.at(expected, (pos >> np.uint64(3)).astype(np.intp).ravel(),
                     (np.uint8(1) << (pos & np.uint64(7)).astype(np.uint8)).ravel())
    assert sk.rotations == 0
    assert np.array_equal(sk._gens[-1], expected)
    assert sk.contains(hashes).all()


@pytest.mark.parametrize("generations", [1, 2, 3])
def test_check_and_add_answers_as_probing_every_generation_before_adding(generations: int) -> None:
    """The one-call probe-and-fill of the young generation (older ones probed only for hashes it
    lacks) answers exactly as probing every generation first and adding afterwards, through
    rotations and with repeats inside a call."""
    from agent.kvevents.sketch import _add, _or_had

    fast = SeenSketch(capacity=500, fp_rate=0.01, generations=generations)
    ref = SeenSketch(capacity=500, fp_rate=0.01, generations=generations)
    rng = np.random.default_rng(generations)
    for _ in range(60):
        batch = rng.integers(0, 3_000, rng.integers(1, 120), dtype=np.uint64)  # repeats across and within
        got = fast.check_and_add(batch)
        seen = np.zeros(batch.shape[0], dtype=bool)
        for gen in ref._gens:
            had = np.zeros(batch.shape[0], dtype=bool)
            _or_had(gen, batch, ref._mask, ref.k, had)  # from all False: every hash probed
            seen |= had
        young_had = had
        _add(ref._gens[-1], batch, ref._mask, ref.k)
        ref._young_count += int(batch.shape[0] - np.count_nonzero(young_had))
        if ref._young_count >= ref.capacity:
            ref._rotate()
        assert np.array_equal(got, seen)
        assert fast.rotations == ref.rotations and fast._young_count == ref._young_count
        assert all(np.array_equal(a, b) for a, b in zip(fast._gens, ref._gens, strict=True))
    assert fast.rotations >= 2


def test_caps_resize_and_shrink_at_once() -> None:
    idx = FleetIndex(IndexLimits(resident_per_engine=1000, history_per_engine=1000, seen_capacity=1000))
    idx.apply("a", 1.0, [gpu(*range(1, 400))])
    idx.set_caps("a", 100, 100)  # its share of the pod/fleet budget shrank
    assert len(idx.engines["a"].resident) <= 100
    assert set(idx.holders) == set(idx.engines["a"].resident)
    assert sum(idx.engines["a"].stats.resident.values()) == len(idx.engines["a"].resident)
    idx.apply("a", 2.0, [gpu(*range(1000, 1400))])
    assert len(idx.engines["a"].resident) <= 100


def test_a_huge_message_gives_the_sketch_answers_of_one_call(monkeypatch: pytest.MonkeyPatch) -> None:
    def run() -> dict[str, int]:
        idx = FleetIndex(IndexLimits(resident_per_engine=4, history_per_engine=4, seen_capacity=200_000))
        hashes = [h * 0x9E3779B97F4A7C15 & (2**64 - 1) for h in range(1, 40_001)]
        idx.apply("a", 1.0, [gpu(*hashes[:20_000])])
        idx.apply("a", 2.0, [gpu(*hashes, *hashes[:100])])  # 40,100 hashes: chunked sketch calls
        return dict(idx.engines["a"].stats.miss_blocks)

    chunked = run()
    monkeypatch.setattr(index_module, "_SKETCH_CHUNK", 10**9)
    assert chunked == run()
    assert chunked["cold"] == 40_000 and chunked["capacity"] >= 19_990
