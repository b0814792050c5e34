"""Hit-ratio-versus-capacity curves: exact reuse distances, and every checked point against a
full twin replay at that capacity."""
from __future__ import annotations

import itertools

import numpy as np
import pytest

from contracts.knobs import Knobs
from simulator.capacity import (
    NEVER,
    capacity_candidates,
    knee_gib,
    priced_optimum_gib,
    reuse_distances,
    sampled_reuse_distances,
    steady_state,
    tier_curves,
)
from simulator.cluster import ClusterSpec
from simulator.policies import LRU
from simulator.replay import replay
from simulator.workload import synthetic


def _lru_hits(keys: np.ndarray, starts: np.ndarray, capacity: int) -> np.ndarray:
    """Per reference: resident in an LRU of `capacity` at the start of its request (the twin's LRU)."""
    tier, out = LRU(capacity), np.zeros(len(keys), dtype=bool)
    for a, b in itertools.pairwise(starts):
        batch = keys[a:b].tolist()
        out[a:b] = [k in tier for k in batch]
        tier.insert_many(batch)
    return out


def test_reuse_distances_match_an_lru_at_every_capacity():
    rng = np.random.default_rng(4)
    for _ in range(12):
        universe = int(rng.integers(8, 120))
        sizes = rng.integers(1, 8, int(rng.integers(1, 80)))  # a prompt's chunks are distinct
        keys = np.concatenate([rng.choice(universe, size=s, replace=False) for s in sizes])
        starts = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)
        dist = reuse_distances(keys, starts)
        for cap in (1, 2, 5, 17, 60):
            np.testing.assert_array_equal(dist < cap, _lru_hits(keys, starts, cap))
    assert reuse_distances(np.array([7, 7, 8, 7]), np.array([0, 1, 2, 3, 4]))[0] == NEVER


def test_sampled_distances_rescale_and_keep_whole_keys():
    rng = np.random.default_rng(5)
    n = 300_000  # a drifting working set: reuse at every distance up to ~12k keys
    keys = (np.arange(n) // 20 + rng.integers(0, 12_000, n)).astype(np.int64)
    starts = np.arange(0, len(keys) + 1, 10)
    pos, dist = sampled_reuse_distances(keys, starts, 0.1)
    assert np.isin(keys, keys[pos]).sum() == len(pos)  # a key is sampled at every reference or never
    assert 0.07 < len(np.unique(keys[pos])) / len(np.unique(keys)) < 0.13
    exact = reuse_distances(keys, starts)
    for cap in (1000, 4000, 8000, 12_000):  # the hit ratio at each capacity, estimated from 10%
        assert (dist < cap).mean() == pytest.approx((exact < cap).mean(), abs=0.02)


@pytest.fixture(scope="module")
def rag():
    return synthetic("rag", seed=3, duration_s=150)


def _ratio(workload, cluster, knobs, tier):
    return replay(workload, cluster, knobs).summary()["tiers"][tier]["hit_ratio"]


@pytest.mark.parametrize("router", ["roundrobin", "prefixaware"])
def test_cpu_and_gpu_curves_match_replays(rag, router):
    knobs = Knobs(router=router)
    cluster = ClusterSpec(pods=2, l2_tokens=0)
    curves = tier_curves(rag, cluster, knobs)
    c = knobs.chunk_tokens
    cpu, gpu = curves["cpu"], curves["gpu"]
    assert cpu.current_gib == pytest.approx(5.0, abs=0.01)
    assert cpu.hit_ratio(5.0) == 0.0  # the default buffer, smaller than the GPU pool, never hits
    assert _ratio(rag, cluster, knobs, "cpu") == 0.0
    assert cpu.hit_ratio(gpu.current_gib / 2) < 0.01  # a buffer under the GPU pool adds little
    assert cpu.hit_ratio(48.0) > 0.03
    checked = 0
    for chunks in (600, 1100, 1800, 2800):
        got = _ratio(rag, ClusterSpec(pods=2, l2_tokens=0, cpu_tokens=chunks * c), knobs, "cpu")
        assert cpu.hit_ratio_at(chunks) == pytest.approx(got, abs=0.01)
        checked += got > 0
    assert checked >= 3
    for chunks in (100, 400):
        got = _ratio(rag, ClusterSpec(pods=2, l2_tokens=0, gpu_tokens=chunks * c), knobs, "gpu")
        assert gpu.hit_ratio_at(chunks) == pytest.approx(got, abs=0.01)


def test_l2_curve_matches_replays(rag):
    knobs = Knobs(cpu_gib=0.0, l2_min_prompt_tokens=1500)
    cluster = ClusterSpec(pods=2)
    l2 = tier_curves(rag, cluster, knobs)["l2"]
    c = knobs.chunk_tokens
    for chunks in (300, 1500, 6000):
        got = _ratio(rag, ClusterSpec(pods=2, l2_tokens=chunks * c), knobs, "l2")
        assert got > 0
        assert l2.hit_ratio_at(chunks) == pytest.approx(got, abs=0.01)


def test_candidates_and_steady_state(rag):
    knobs = Knobs()
    curves = tier_curves(rag, ClusterSpec(pods=2, l2_tokens=0), knobs)
    cpu = curves["cpu"]
    knee = knee_gib(cpu, 64.0)
    assert knee is not None and 5.0 < knee <= cpu.max_useful_gib
    free = priced_optimum_gib(cpu, 0.0, 64.0)
    assert free == pytest.approx(cpu.max_useful_gib, abs=0.25)
    assert priced_optimum_gib(cpu, 1000.0, 64.0) == 0.0  # memory too dear: the smallest buffer
    assert priced_optimum_gib(cpu, 0.0, 8.0) == 0.0  # within the headroom nothing hits
    cands = capacity_candidates(cpu, memory_ms_per_gib=0.0, headroom_gib=64.0)
    assert knee in cands and free in cands and all(0 <= x <= 64 for x in cands)
    est = steady_state(cpu, 48.0)
    assert est.current_hit_ratio == 0.0 and est.hit_ratio == pytest.approx(cpu.hit_ratio(48.0))
    assert est.ttft_saving_s > 0 and est.memory_delta_gib == pytest.approx(2 * (48.0 - 5.0))
    assert steady_state(cpu, 5.0).ttft_saving_s == 0.0
    assert est.net_gain_s(0.0) > 0 > est.net_gain_s(1000.0)


def test_curve_export_is_valid_exposition(rag):
    import shutil
    import subprocess

    from prometheus_client import CollectorRegistry, generate_latest

    from simulator.capacity.table import curve_points, curve_table
    from tuners.metrics import TunerMetrics

    curves = tier_curves(rag, ClusterSpec(pods=2, l2_tokens=0), Knobs())
    points = curve_points(curves, cap_gib={"cpu": 64.0})
    assert all(g <= 64.0 for g, _ in points["cpu"]) and (5.0, 0.0) in points["cpu"]
    metrics = TunerMetrics(target="llm/vllm")
    metrics.set_capacity_curves({**points, "gpu": [(1.0, float("nan")), (-1.0, 0.5)]})  # bad points dropped
    registry = CollectorRegistry()
    registry.register(metrics)
    text = generate_latest(registry).decode()
    assert 'tierpilot_tier_capacity_hit_ratio{capacity_gib="5",target="llm/vllm",tier="cpu"} 0.0' in text
    assert 'tier="gpu"' not in text
    got = registry.get_sample_value("tierpilot_tier_capacity_hit_ratio",
                                    {"target": "llm/vllm", "tier": "cpu", "capacity_gib": "48"})
    assert got == pytest.approx(curves["cpu"].hit_ratio(48.0))
    promtool = shutil.which("promtool") or "/usr/bin/promtool"
    result = subprocess.run([promtool, "check", "metrics"], input=text, capture_output=True, text=True, check=False)
    assert result.returncode == 0, result.stdout + result.stderr
    lines = curve_table(curves)
    assert max(map(len, lines)) <= 80 and any(line.startswith("cpu") and "*" in line for line in lines)


def test_replay_cli_shows_the_curves(tmp_path):
    import json

    from click.testing import CliRunner

    from agent.cli import main

    args = ["replay", "--workload", "rag", "--duration", "60", "--pods", "2"]
    res = CliRunner().invoke(main, [*args, "--plot", str(tmp_path / "r.png")], catch_exceptions=False,
                             env={"COLUMNS": "80"})
    assert res.exit_code == 0, res.output
    assert "What if each tier held N GiB" in res.output and "5.00*" in res.output
    rows = [line for line in res.output.splitlines() if line.split()[:1] in (["CPU"], ["L2"], ["GPU"])]
    assert len(rows) >= 15 and max(map(len, rows)) <= 80
    assert (tmp_path / "r.png").stat().st_size > 0
    doc = json.loads(CliRunner().invoke(main, [*args, "--json"], catch_exceptions=False).output)
    cpu = doc["capacity_curves"]["cpu"]
    assert cpu["current_gib"] == pytest.approx(5.0, abs=0.01) and cpu["per_pod"] is True
    assert {"capacity_gib", "hit_ratio", "prompt_share"} <= set(cpu["points"][0])


def test_demo_report_draws_the_curves(rag, tmp_path):
    from contracts.knobs import DEFAULT_KNOBS
    from emulator.cluster.timeline import Recorder
    from emulator.demo.report import write_report

    curves = tier_curves(rag, ClusterSpec(pods=2, l2_tokens=0), Knobs())
    path = write_report(tmp_path, Recorder(), title_facts={}, phase_starts=[0.0], final_config=DEFAULT_KNOBS.to_dict(),
                        partial=False, capacity_curves=curves, host_memory_gib=96.0)
    text = path.read_text()
    assert "## Capacity curves: what if the CPU buffer were N GiB" in text and "![Capacity curves]" in text
    assert "cpu      5.00*      0.000" in text
    assert (tmp_path / "capacity_curves.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_cpu_curve_from_the_gpu_store_events_matches_the_workload_curve(rag):
    from simulator.capacity.stores import cpu_curve_from_stores

    knobs, cluster = Knobs(), ClusterSpec(pods=2, l2_tokens=0)
    events: list = []
    run = replay(rag, cluster, knobs, event_sink=events.append)
    cpu = tier_curves(rag, cluster, knobs, run=run)["cpu"]
    stores = cpu_curve_from_stores(events, chunk_tokens=knobs.chunk_tokens,
                                   kv_bytes_per_token=run.capacities.kv_bytes_per_token)
    assert stores.lookup_tokens <= cpu.lookup_tokens  # no tails, no chunks the GPU still held
    hit = [chunks for chunks in (600, 1100, 1800, 2800) if cpu.hit_tokens_at(chunks) > 0]
    assert len(hit) >= 3
    for chunks in hit:
        assert stores.hit_tokens_at(chunks) == pytest.approx(cpu.hit_tokens_at(chunks), rel=0.02)
    assert stores.hit_ratio(5.0) == 0.0


def test_cpu_curve_with_an_l2_below_it(rag):
    knobs, cluster = Knobs(), ClusterSpec(pods=2)
    cpu = tier_curves(rag, cluster, knobs)["cpu"]
    for gib in (32.0, 48.0):
        got = _ratio(rag, cluster, knobs.replace(cpu_gib=gib), "cpu")
        assert got > 0
        assert cpu.hit_ratio(gib) == pytest.approx(got, abs=0.01)


def test_a_prompt_stops_at_its_first_miss():
    """Prefix lookups over chained chunks: an LRU evicts a prompt's head before its tail, and the
    chunks behind a missing head do not hit (the curve takes the running maximum of distances)."""
    from simulator.capacity.curves import _prefix_max

    rng = np.random.default_rng(6)
    docs = rng.integers(3, 12, 40)
    prompts = [list(range(d * 100, d * 100 + int(rng.integers(1, docs[d] + 1)))) for d in rng.integers(0, 40, 600)]
    keys = np.concatenate([np.array(p) for p in prompts])
    starts = np.concatenate([[0], np.cumsum([len(p) for p in prompts])]).astype(np.int64)
    req = np.repeat(np.arange(len(prompts)), [len(p) for p in prompts])
    pm = _prefix_max(reuse_distances(keys, starts), req)
    plain = reuse_distances(keys, starts)
    differs = 0
    for cap in (5, 20, 60, 150):
        tier, want = LRU(cap), 0
        for p in prompts:
            hit = tier.prefix_len(p)
            want += hit
            tier.touch_many(p[:hit])
            tier.insert_many(p[hit:])
        assert int((pm < cap).sum()) == want
        differs += int((plain < cap).sum()) != want
    assert differs  # without the running maximum some capacity would come out wrong


def test_curve_capacity_gives_the_planner_sizes_and_publishes_the_curve(rag):
    from tuners.metrics import TunerMetrics
    from tuners.planning.capacity_source import CurveCapacity

    metrics = TunerMetrics(target="t")
    calls = []

    def history():
        calls.append(1)
        return rag

    source = CurveCapacity(history, ClusterSpec(pods=2, l2_tokens=0), headroom_gib=64.0, memory_ms_per_gib=0.0,
                           step_gib=1.0, metrics=metrics)
    sizes = source.cpu_candidates(Knobs())
    cpu = source.curves["cpu"]
    assert sizes and all(0 <= g <= 64 for g in sizes) and 5.0 not in sizes
    assert any(abs(g - cpu.max_useful_gib) <= 1.0 for g in sizes)  # free memory: where every reuse hits
    priced = CurveCapacity(history, ClusterSpec(pods=2, l2_tokens=0), headroom_gib=64.0,
                           memory_ms_per_gib=1000.0, step_gib=1.0).cpu_candidates(Knobs())
    assert 0.0 in priced  # memory too dear: the smallest buffer is a candidate
    first = source.curves
    source.cpu_candidates(Knobs())
    assert source.curves is first  # same history and knobs: not rebuilt
    text = "".join(f"{s.labels}{s.value}" for fam in metrics.collect() for s in fam.samples
                   if fam.name == "tierpilot_tier_capacity_hit_ratio")
    assert "'tier': 'cpu'" in text and "'capacity_gib': '5'" in text
    short = CurveCapacity(lambda: rag.head(10), ClusterSpec(pods=2), headroom_gib=64.0, memory_ms_per_gib=2.0)
    assert short.cpu_candidates(Knobs()) == []


class _FlatTwin:
    """A planning twin under which every configuration is as fast: nothing pays."""

    transition_s = 60.0

    def steady(self, knobs: Knobs) -> np.ndarray:
        return np.ones(50)

    def switch(self, before: Knobs, after: Knobs, *, restart: bool) -> np.ndarray:
        return np.ones(50)


class _Kind:
    def __init__(self, kind: str) -> None:
        self.kind = kind


def test_the_planner_reports_the_l2_pools_curve_sizes_over_the_rebuilt_workload(rag):
    """The L2 pool is the operator's (not a knob): each plan carries its curve's knee and useful
    maximum with their hit ratios, next to the pool in force; not on the fitted fallback."""
    from agent.runtime.tuning.build import WorkloadCapacity
    from tests.support.tuner_settings import plan_settings
    from tuners.planning.capacity_source import CurveCapacity, HeadroomCapacity
    from tuners.planning.planner import TransitionPlanner
    from tuners.space import DeploymentLimits

    cluster = ClusterSpec(pods=2, l2_tokens=40_000)
    curve = CurveCapacity(lambda: rag, cluster, headroom_gib=64.0, memory_ms_per_gib=0.0, step_gib=1.0)
    pool = curve.l2_pool(Knobs())
    l2 = tier_curves(rag, cluster, Knobs())["l2"]
    assert pool["pool_gib"] == round(l2.current_gib, 2) > 0 and pool["useful_gib"] == round(l2.max_useful_gib, 2)
    assert pool["useful_hit_ratio"] >= pool["hit_ratio"] and 0 < pool["knee_gib"] <= pool["useful_gib"]

    def planner(kind: str) -> TransitionPlanner:
        capacity = WorkloadCapacity(_Kind(kind), curve, HeadroomCapacity(DeploymentLimits()))
        return TransitionPlanner(_FlatTwin, Knobs, restarts=lambda a, b: True, routers=("roundrobin",),
                                 search=ListSearch([]), settings=plan_settings(), capacity=capacity)

    rebuilt, fitted = planner("rebuilt"), planner("fitted")
    assert rebuilt.candidates(3) == [] == fitted.candidates(3)
    assert rebuilt.last_plan["l2_pool"] == pool and "l2_pool" not in fitted.last_plan


class ListSearch:
    def __init__(self, found: list[Knobs]) -> None:
        self.found = found

    def candidates(self, k: int) -> list[Knobs]:
        return self.found[:k]


def test_live_kv_events_give_the_cpu_curve(rag):
    import shutil
    import subprocess

    from prometheus_client import CollectorRegistry, generate_latest

    from agent.kvevents.signals import EngineId, KvSignals
    from agent.kvevents.store_curve import StoreCurveCollector, StoreStream
    from agent.kvevents.wire import Batch, Stored
    from contracts.events import AllBlocksCleared, BlockStored
    from simulator.capacity.stores import cpu_curve_from_stores

    knobs, cluster = Knobs(), ClusterSpec(pods=2, l2_tokens=0)
    events: list = []
    run = replay(rag, cluster, knobs, event_sink=events.append)
    bpt = run.capacities.kv_bytes_per_token
    signals = KvSignals()
    stream = StoreStream()
    signals.store_stream = stream
    seq = 0
    for ev in events:  # the twin's events as the agent decodes them from the wire, one message each
        if isinstance(ev, BlockStored):
            seq += 1
            batch = Batch(b"kv", seq, ev.ts, None, [Stored(list(ev.block_hashes), ev.parent_block_hash,
                                                           ev.block_size, ev.medium, None)], {})
            signals.apply(EngineId(ev.pod, "m"), batch)
    want = cpu_curve_from_stores(events, chunk_tokens=knobs.chunk_tokens, kv_bytes_per_token=bpt)
    got = stream.curve("m", bpt)
    assert stream.blocks("m") == want.lookup_tokens // knobs.chunk_tokens
    for gib in (24.0, 32.0, 48.0):  # the agent's lookups are messages, not requests: close, not equal
        assert got.hit_ratio(gib) == pytest.approx(want.hit_ratio(gib), abs=0.01)
    assert got.hit_ratio(5.0) == 0.0 and got.hit_ratio(48.0) > 0.03
    collector = StoreCurveCollector(stream, bpt, refresh_s=60.0, clock=lambda: 0.0)
    registry = CollectorRegistry()
    registry.register(collector)
    assert "tierpilot_kv_cpu_capacity_hit_ratio" not in generate_latest(registry).decode()  # before a rebuild
    assert collector.rebuild() == 1
    text = generate_latest(registry).decode()
    assert 'tierpilot_kv_cpu_capacity_hit_ratio{capacity_gib="0",model="m"} 0.0' in text
    promtool = shutil.which("promtool") or "/usr/bin/promtool"
    result = subprocess.run([promtool, "check", "metrics"], input=text, capture_output=True, text=True, check=False)
    assert result.returncode == 0, result.stdout + result.stderr
    small = StoreStream(max_blocks=1000)
    small.add("m", "pod-0", range(800), 256)
    small.add("m", "pod-1", range(800, 1500), 256)
    assert small.blocks("m") == 700  # the oldest message went
    small.clear_engine("m", "pod-1")
    assert small.blocks("m") == 0
    assert not [e for e in events if isinstance(e, AllBlocksCleared)]  # no restarts in this replay
