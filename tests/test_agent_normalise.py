"""Exact unified values from every shared sample and the hand-built fixtures (one scrape, so
ratios come from lifetime totals)."""
from __future__ import annotations

import math
from pathlib import Path

import pytest

from agent.collect.mapping import MappingError, load_mapping, load_mappings
from agent.collect.normalise import normalise, resolve
from agent.collect.parse import parse
from agent.collect.snapshot import build_snapshot
from agent.collect.store import WindowStore
from contracts.tier_model import Target

FIXTURES = Path(__file__).parent / "fixtures"
M = "meta-llama/Llama-3.1-8B-Instruct"
MAPPINGS = load_mappings()


def strip_elisions(text: str) -> str:
    return "\n".join(line for line in text.split("\n") if line.strip() != "...")


def unify(*payloads: tuple[str, str, str], kvbpt: float = 131072.0):
    """(role, pod, text)... -> snapshot after one scrape, plus the anomalies seen."""
    signals, anomalies = [], {}
    for role, pod, text in payloads:
        target = Target(f"http://{pod}/{role}", role, pod)  # type: ignore[arg-type]
        out = normalise(target, parse(strip_elisions(text), MAPPINGS.wanted[role]), MAPPINGS)
        signals.extend(out.signals)
        for k, v in out.anomalies.items():
            anomalies[k] = anomalies.get(k, 0) + v
    store = WindowStore()
    store.ingest(resolve(signals, MAPPINGS), ts=1000.0)
    return build_snapshot(store.window(now=1000.0), [], taken_at=1000.0, kv_bytes_per_token=kvbpt), anomalies


def tiers(snap) -> dict:
    return {(t.pod, t.model, t.tier): t for t in snap.tiers}


def fixture(name: str) -> str:
    return (FIXTURES / name).read_text()


# -- shared samples ------------------------------------------------------------------------------
def test_datadog_vllm_sample(samples_dir):
    snap, anomalies = unify(("vllm", "p", (samples_dir / "datadog_vllm_metrics.prom").read_text()))
    t = tiers(snap)
    gpu = t[("p", "facebook/opt-125m", "gpu")]
    assert (gpu.source, gpu.lookup_tokens, gpu.hit_tokens) == ("vllm_v1", 117.0, 64.0)
    assert gpu.hit_ratio == 64 / 117 and gpu.cumulative_hit_ratio == 64 / 117
    assert gpu.usage_ratio == 0.0  # kv_cache_usage_perc (V1) preferred over gpu_cache_usage_perc (V0)
    # the connector counters are all zero: no cache tier below the GPU is reported
    assert set(t) == {("p", "facebook/opt-125m", "gpu")}
    (pod,) = snap.pods
    assert (pod.prompt_tokens, pod.requests) == (5.0, 1.0)
    # one observation in (0.25, 0.5]: Prometheus interpolation inside that bucket
    assert pod.ttft_quantiles == pytest.approx({0.5: 0.375, 0.95: 0.4875, 0.99: 0.4975})
    assert anomalies == {}


def test_ray_vllm_sample_with_prefix_alias_and_v0_gauges(samples_dir):
    snap, _ = unify(("vllm", "p", (samples_dir / "datadog_ray_vllm_metrics.prom").read_text()))
    t = tiers(snap)
    v1 = t[("p", "facebook/opt-125m", "gpu")]
    assert (v1.source, v1.lookup_tokens, v1.hit_tokens) == ("vllm_v1", 117.0, 64.0)
    v0 = t[("p", "neuralmagic/Meta-Llama-3.1-70B-Instruct-FP8", "gpu")]
    # V0 only: usage from gpu_cache_usage_perc; the hit-rate gauge is -1 (no data) so no ratio
    assert v0.source == "vllm_v0" and v0.usage_ratio == pytest.approx(5.882698982295764e-05)
    assert v0.hit_ratio is None and v0.lookup_tokens is None


def test_sglang_sample(samples_dir):
    snap, _ = unify(("vllm", "s", (samples_dir / "datadog_sglang_metrics.prom").read_text()))
    gpu = tiers(snap)[("s", "facebook/opt-125m", "gpu")]
    assert (gpu.source, gpu.lookup_tokens, gpu.hit_tokens, gpu.hit_ratio, gpu.usage_ratio) == (
        "sglang", 5.0, 1.0, 0.2, 0.25)
    (pod,) = snap.pods
    assert pod.requests == 1.0 and pod.ttft_quantiles == pytest.approx({0.5: 0.05, 0.95: 0.095, 0.99: 0.099})


def test_lmcache_sample_fixture(samples_dir):
    snap, _ = unify(("vllm", "p", (samples_dir / "lmcache_metrics_test_fixture.prom").read_text()))
    # label `model` (fallback model label); worker 0 requested 8192, hits max(4096, 2048)
    cpu = tiers(snap)[("p", "m", "cpu")]
    assert (cpu.source, cpu.lookup_tokens, cpu.hit_tokens, cpu.hit_ratio) == (
        "connector_combined", 8192.0, 4096.0, 0.5)


def test_vllm_docs_design_excerpt_without_inf_bucket(samples_dir):
    snap, _ = unify(("vllm", "p", (samples_dir / "vllm_metrics_docs_design_excerpt.prom").read_text()))
    (pod,) = snap.pods
    assert pod.model == M and pod.requests == 132.0
    # no +Inf bucket in the excerpt: it is taken from _count (140); rank 70 falls in (0.02, 0.04]
    assert pod.ttft_quantiles[0.5] == pytest.approx(0.02 + 0.02 * (70 - 13) / (97 - 13))
    assert pod.ttft_quantiles[0.99] == pytest.approx(0.08 + 0.02 * (138.6 - 138) / (140 - 138))
    assert snap.tiers == ()


def test_vllm_docs_usage_excerpt_has_no_tier_signal(samples_dir):
    snap, anomalies = unify(("vllm", "p", (samples_dir / "vllm_metrics_docs_usage_excerpt.prom").read_text()))
    assert snap.tiers == () and snap.pods == () and anomalies == {}


# -- hand-built fixtures ---------------------------------------------------------------------------
def test_vllm_0_33_data_parallel_engines_are_aggregated_per_pod():
    snap, anomalies = unify(("vllm", "v0", fixture("vllm_0_33_dp2.prom")))
    t = tiers(snap)
    gpu, cpu, l2 = t[("v0", M, "gpu")], t[("v0", M, "cpu")], t[("v0", M, "l2")]
    assert (gpu.lookup_tokens, gpu.hit_tokens, gpu.hit_ratio, gpu.usage_ratio) == (16000, 6000, 0.375, 0.375)
    assert (cpu.source, cpu.lookup_tokens, cpu.hit_tokens, cpu.hit_ratio) == ("vllm_by_source", 10000, 2500, 0.25)
    assert (l2.source, l2.lookup_tokens, l2.hit_tokens, l2.hit_ratio) == ("vllm_by_source", 7500, 1500, 0.2)
    assert [gpu.cumulative_hit_ratio, cpu.cumulative_hit_ratio, l2.cumulative_hit_ratio] == [
        0.375, 0.53125, 0.625]
    (pod,) = snap.pods
    assert (pod.prompt_tokens, pod.requests) == (16000, 72)
    # custom buckets 0.05 .. 1.0, summed over engines: 10, 32, 56, 65, 72, 72
    assert pod.ttft_quantiles == pytest.approx({
        0.5: 0.1 + 0.15 * (36 - 32) / 24, 0.95: 0.5 + 0.5 * (68.4 - 65) / 7, 0.99: 0.5 + 0.5 * (71.28 - 65) / 7})
    assert anomalies == {}


def test_lmcache_inprocess_takes_the_max_over_tp_workers():
    snap, _ = unify(("vllm", "v0", fixture("lmcache_inprocess.prom")))
    cpu = tiers(snap)[("v0", M, "cpu")]
    assert (cpu.source, cpu.lookup_tokens, cpu.hit_tokens, cpu.evicted_chunks) == (
        "connector_combined", 10000, 4000, 120)


def test_lmcache_mp_split_is_exact_and_preferred():
    snap, _ = unify(("vllm", "v0", fixture("vllm_0_33_dp2.prom")), ("lmcache", "v0", fixture("lmcache_mp.om")))
    t = tiers(snap)
    cpu, l2 = t[("v0", M, "cpu")], t[("v0", M, "l2")]
    assert (cpu.source, cpu.lookup_tokens, cpu.hit_tokens, cpu.hit_ratio) == ("lmcache_mp", 20000, 6000, 0.3)
    assert (l2.source, l2.lookup_tokens, l2.hit_tokens, l2.hit_ratio) == ("lmcache_mp", 14000, 3000, 3 / 14)
    assert (cpu.evicted_chunks, cpu.usage_ratio, l2.evicted_chunks) == (50, 0.8, 7)  # model-less series join the model
    assert l2.cumulative_hit_ratio == (6000 + 6000 + 3000) / 16000


VLLM_UNSPECIFIED = f"""# TYPE vllm:prefix_cache_queries_total counter
vllm:prefix_cache_queries_total{{engine="0",model_name="{M}"}} 20000.0
# TYPE vllm:prefix_cache_hits_total counter
vllm:prefix_cache_hits_total{{engine="0",model_name="{M}"}} 8000.0
# TYPE vllm:external_prefix_cache_queries_total counter
vllm:external_prefix_cache_queries_total{{engine="0",model_name="{M}"}} 12000.0
# TYPE vllm:external_prefix_cache_hits_total counter
vllm:external_prefix_cache_hits_total{{engine="0",model_name="{M}"}} 10000.0
# TYPE vllm:prompt_tokens_cached_by_source_total counter
vllm:prompt_tokens_cached_by_source_total{{engine="0",model_name="{M}",source="device"}} 8000.0
vllm:prompt_tokens_cached_by_source_total{{engine="0",model_name="{M}",source="host"}} 0.0
vllm:prompt_tokens_cached_by_source_total{{engine="0",model_name="{M}",source="disk"}} 0.0
vllm:prompt_tokens_cached_by_source_total{{engine="0",model_name="{M}",source="external_unspecified"}} 10000.0
"""


def test_curvine_read_bytes_estimate_the_l2_split():
    snap, _ = unify(("vllm", "v0", VLLM_UNSPECIFIED), ("curvine-fuse", "v0", fixture("curvine_fuse.prom")))
    t = tiers(snap)
    cpu, l2 = t[("v0", M, "cpu")], t[("v0", M, "l2")]
    # 1,048,576,000 read bytes / 131,072 B per token = 8,000 L2 tokens; the other 2,000 hits are L1
    assert (cpu.source, cpu.lookup_tokens, cpu.hit_tokens) == ("estimated_l2_read_bytes", 12000, 2000)
    assert (l2.source, l2.lookup_tokens, l2.hit_tokens) == ("estimated_l2_read_bytes", 10000, 8000)
    assert l2.estimated and not t[("v0", M, "gpu")].estimated
    io = {x.op: x.quantiles for x in snap.l2_io}
    assert io["read"] == pytest.approx({0.5: 8666.666666e-6, 0.95: 47000e-6, 0.99: 87000e-6})
    read = next(x.histogram for x in snap.l2_io if x.op == "read")
    assert read is not None and len(read.cumulative_counts) == len(read.bounds) + 1  # +Inf bucket kept
    assert read.bounds[0] < 1e-3 and read.count == read.cumulative_counts[-1]  # microseconds became seconds
    assert io["write"] == pytest.approx({0.5: 750e-6, 0.95: 975e-6, 0.99: 995e-6})


def test_without_any_split_source_cpu_reports_the_connector_total():
    snap, _ = unify(("vllm", "v0", VLLM_UNSPECIFIED))
    t = tiers(snap)
    assert (t[("v0", M, "cpu")].source, t[("v0", M, "cpu")].hit_tokens) == ("connector_combined", 10000)
    assert ("v0", M, "l2") not in t


def test_curvine_master_reports_pool_usage_and_evictions():
    snap, _ = unify(("curvine-master", "cm", fixture("curvine_master.prom")))
    (l2,) = snap.tiers
    assert (l2.pod, l2.model, l2.tier, l2.source, l2.usage_ratio) == ("cm", "", "l2", "curvine_master", 0.25)
    # files and bytes stay apart: unlike units are never added
    assert (l2.evicted_chunks, l2.evicted_files, l2.evicted_bytes) == (None, 42, 53687091200)


V0_ENGINE = """# TYPE vllm:gpu_prefix_cache_queries_total counter
vllm:gpu_prefix_cache_queries_total{model_name="old"} 400.0
# TYPE vllm:gpu_prefix_cache_hits_total counter
vllm:gpu_prefix_cache_hits_total{model_name="old"} 100.0
# TYPE vllm:gpu_cache_usage_perc gauge
vllm:gpu_cache_usage_perc{model_name="old"} 0.9
"""


def test_v0_names():
    snap, _ = unify(("vllm", "old-0", V0_ENGINE))
    (gpu,) = snap.tiers
    assert (gpu.source, gpu.lookup_tokens, gpu.hit_tokens, gpu.hit_ratio, gpu.usage_ratio) == (
        "vllm_v0", 400, 100, 0.25, 0.9)


def test_router_series_are_not_engine_series():
    # scraped with the router role: only its own counters; as an engine: all `server` series rejected
    snap, _ = unify(("router", "r", fixture("router.prom")))
    assert snap.tiers == () and snap.pods == ()
    snap, _ = unify(("vllm", "r", fixture("router.prom")))
    assert snap.tiers == () and snap.pods == ()


def test_nan_and_inf_values_are_dropped_and_counted():
    text = VLLM_UNSPECIFIED.replace('source="host"} 0.0', 'source="host"} NaN').replace(
        "12000.0", "+Inf")
    snap, anomalies = unify(("vllm", "v0", text))
    assert anomalies == {"invalid_value": 2}
    t = tiers(snap)
    assert t[("v0", M, "gpu")].hit_tokens == 8000  # the rest of the payload is kept
    assert ("v0", M, "cpu") not in t  # connector lookups are gone: no connector tier


def test_mapping_files_are_validated_with_the_key_named(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("source: x\nroles: [vllm]\nmetrics:\n  - {name: a, signal: no_such_signal}\n")
    with pytest.raises(MappingError, match=r"bad.yaml: key 'metrics.0.signal': .*unknown signal 'no_such_signal'"):
        load_mapping(bad)
    bad.write_text("source: x\nroles: [gpu]\nmetrics: []\n")
    with pytest.raises(MappingError, match=r"key 'roles.0': Input should be 'vllm'"):
        load_mapping(bad)


def test_every_builtin_mapping_loads_and_names_are_unique():
    sources = [m.source for m in MAPPINGS.mappings]
    assert sorted(sources) == ["curvine_fuse", "curvine_master", "curvine_worker", "lmcache_inprocess",
                               "lmcache_mp", "router", "sglang", "vllm_router", "vllm_v0", "vllm_v1"]
    assert all(not math.isnan(m.preference) for m in MAPPINGS.mappings)
