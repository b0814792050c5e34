"""Fleet-wide block signals from mergeable sketches: sharded replicas each sketch their own pods'
KV events; the merged sketch equals the unsharded one register for register, and its overlap is
within the stated bound (3 x 1.04/sqrt(m) x (1 - overlap); target: 2 points) of the exact value
computed from every stored hash, on the twin's event streams (the emulated cluster's engine)."""
from __future__ import annotations

import json
from collections import defaultdict

import numpy as np
import pytest

from agent.collect.shard import shard_of
from agent.kvevents.fleet import BlockSketches, FleetBlocksCollector, merge_states, state_json
from agent.kvevents.hll import HyperLogLog, relative_error
from agent.kvevents.signals import EngineId, KvSignals
from agent.kvevents.wire import Batch, Stored
from contracts import events as ev
from contracts.knobs import Knobs
from simulator.cluster import ClusterSpec
from simulator.synthetic import synthetic
from simulator.twin import Twin


def test_hll_merge_is_the_union_and_the_estimate_is_within_three_standard_errors():
    rng = np.random.default_rng(0)
    for n in (1_000, 50_000, 400_000):
        a_keys = rng.integers(0, 2**63, n, dtype=np.uint64)
        b_keys = np.concatenate([a_keys[: n // 2], rng.integers(0, 2**63, n // 2, dtype=np.uint64)])
        a, b, both = HyperLogLog(), HyperLogLog(), HyperLogLog()
        a.add(a_keys)
        b.add(b_keys)
        both.add(np.concatenate([a_keys, b_keys]))
        assert np.array_equal(a.copy().merge(b).registers, both.registers)
        truth = len(np.unique(np.concatenate([a_keys, b_keys])))
        assert abs(both.estimate() / truth - 1) < 3 * relative_error(16), n
    small = HyperLogLog(10)
    small.add(np.arange(5000, dtype=np.uint64))  # small integers: spread by the mixer first
    assert abs(small.estimate() / 5000 - 1) < 3 * relative_error(10)
    back = HyperLogLog.from_text(16, both.to_text())
    assert np.array_equal(back.registers, both.registers)
    with pytest.raises(ValueError, match="precision"):
        both.merge(small)
    with pytest.raises(ValueError, match="needs 1024 registers"):
        HyperLogLog.from_text(10, both.to_text())


def _twin_streams(preset: str, pods: list[str]) -> list[tuple[str, float, tuple[int, ...]]]:
    stored: list[tuple[str, float, tuple[int, ...]]] = []

    def sink(e: object) -> None:
        if isinstance(e, ev.BlockStored) and e.medium == "GPU":
            stored.append((e.pod, e.ts, e.block_hashes))

    twin = Twin(ClusterSpec(pods=len(pods), pod_names=tuple(pods), gpu_tokens=40_000, cpu_tokens=40_000,
                            l2_tokens=0), Knobs(router="roundrobin", chunk_tokens=256), event_sink=sink)
    for row in synthetic(preset, seed=11, duration_s=120).iter_rows(named=True):
        twin.submit(row)
    return stored


@pytest.mark.parametrize(("preset", "shards"), [("sessions", 2), ("rag", 3)])
def test_sharded_sketches_merge_to_the_unsharded_view_within_the_bound(preset, shards):
    pods = [f"vllm-{i}" for i in range(6)]
    stored = _twin_streams(preset, pods)
    assert len(stored) > 100
    window = 1_000.0  # the whole run
    whole = BlockSketches(window_s=window, clock=lambda: 200.0)
    parts = [BlockSketches(window_s=window, clock=lambda: 200.0) for _ in range(shards)]
    exact: set[int] = set()
    per_pod: dict[str, set[int]] = defaultdict(set)
    for pod, ts, hashes in stored:
        whole.add("m", pod, ts, hashes)
        parts[shard_of(pod, shards)].add("m", pod, ts, hashes)
        exact.update(hashes)
        per_pod[pod].update(hashes)
    stores = sum(len(h) for _, _, h in stored)
    true_overlap = 1 - len(exact) / stores
    true_dup = sum(len(s) for s in per_pod.values()) / len(exact)
    # what travels between replicas is JSON
    states = [json.loads(state_json(p.state())) for p in parts]
    (merged,) = merge_states(states)
    (single,) = merge_states([whole.state()])
    assert merged.distinct_blocks == single.distinct_blocks and merged.stores == single.stores == stores
    bound = 3 * relative_error(16) * (1 - true_overlap)
    assert abs(merged.overlap - true_overlap) <= bound < 0.02
    assert merged.duplication == pytest.approx(true_dup, rel=0.03)
    assert merged.engines == len(pods)
    # one shard's own view is not the fleet's: the merge is what makes the signal right
    (alone,) = merge_states(states[:1])
    assert abs(alone.overlap - true_overlap) > 2 * bound


def test_kv_signals_feed_the_sketches_from_gpu_stores_only():
    sig = KvSignals()
    sig.blocks = BlockSketches(window_s=100.0, clock=lambda: 50.0)
    gpu = Stored([1, 2, 3, 4], None, 16, "GPU", None)
    cpu = Stored([9, 10], None, 16, "CPU", None)
    sig.apply(EngineId("vllm-0", "m"), Batch(b"", 1, 10.0, None, [gpu, cpu], {}))
    sig.apply(EngineId("vllm-1", "m"), Batch(b"", 1, 11.0, None, [Stored([3, 4, 5, 6], None, 16, "GPU", None)], {}))
    (fb,) = merge_states([sig.blocks.state()])
    assert fb.stores == 8 and round(fb.distinct_blocks) == 6 and fb.engines == 2
    assert fb.overlap == pytest.approx(1 - 6 / 8, abs=0.01) and fb.duplication == pytest.approx(8 / 6, rel=0.02)
    # the window: blocks older than the window leave the view
    assert merge_states([sig.blocks.state(window_s=10.0, now=200.0)]) == []


def test_collector_merges_peers_and_leaves_out_a_failing_one(caplog):
    mine, theirs = BlockSketches(clock=lambda: 10.0), BlockSketches(clock=lambda: 10.0)
    mine.add("m", "a", 5.0, [1, 2, 3])
    theirs.add("m", "b", 5.0, [3, 4])

    def fetch(url: str, _timeout: float) -> bytes:
        if url.startswith("http://ok"):
            return state_json(theirs.state())
        if url.startswith("http://junk"):
            return b'{"models": {"m": {"p": 16}}}'
        raise OSError("connection refused")

    col = FleetBlocksCollector(mine.state, ["http://ok:9400", "http://down:9400", "http://junk:9400"], fetch)
    with caplog.at_level("INFO", logger="agent.kvevents.fleet"):
        fams = {f.name: f for f in col.collect()}
        list(col.collect())  # a peer that keeps failing the same way is logged once
    lines = [r.getMessage() for r in caplog.records]
    assert lines == ["fleet block sketches: shard http://down:9400 left out: connection refused",
                     "fleet block sketches: shard http://junk:9400 left out: model 'm': malformed sketch ('registers')"]
    assert fams["tierpilot_kv_fleet_distinct_blocks"].samples[0].value == pytest.approx(4, abs=0.05)
    assert fams["tierpilot_kv_fleet_block_overlap_ratio"].samples[0].value == pytest.approx(0.2, abs=0.01)
    assert {s.labels["state"]: s.value for s in fams["tierpilot_kv_fleet_shards"].samples} == {"ok": 2, "failed": 2}
