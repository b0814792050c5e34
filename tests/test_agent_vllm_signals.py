"""vLLM signals with cache meaning, normalised into the tier model: GPU pressure (preemptions,
waiting), real GPU capacity (cache_config_info), the per-tier eviction-age histograms, the other
prompt-token sources, vLLM native CPU offload as L1, and LMCache's `external_unspecified` hits."""
from __future__ import annotations

import pytest

from agent.collect.mapping import load_mappings
from agent.collect.normalise import normalise, resolve
from agent.collect.parse import parse
from agent.collect.snapshot import build_snapshot
from agent.collect.store import WindowStore
from contracts.tier_model import Target
from exporters.prom import build_registry

M = "Qwen/Qwen3-8B"
MAPPINGS = load_mappings()
AGE_BUCKETS = (0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1, 2, 5, 10, 20, 30, 60, 120, 300, 600,
               1200, 1800)


def _hist(name: str, engine: str, counts: dict[float, int], total: float) -> str:
    """One vLLM histogram series (cumulative buckets) as prometheus_client writes it."""
    lines, cum = [], 0
    for le in AGE_BUCKETS:
        cum += counts.get(le, 0)
        lines.append(f'{name}_bucket{{engine="{engine}",le="{float(le)}",model_name="{M}"}} {float(cum)}')
    lines.append(f'{name}_bucket{{engine="{engine}",le="+Inf",model_name="{M}"}} {float(cum)}')
    lines.append(f'{name}_count{{engine="{engine}",model_name="{M}"}} {float(cum)}')
    lines.append(f'{name}_sum{{engine="{engine}",model_name="{M}"}} {total}')
    return "\n".join(lines)


def vllm_payload(*, preemptions=(3, 4), waiting=(2, 5), idle=None, offload=False, by_source=None) -> str:
    idle = idle or {"0": {1: 10, 2: 10}, "1": {5: 20}}
    by_source = by_source or {"device": 6000, "host": 0, "disk": 0, "external_unspecified": 3000}
    out = ["# HELP vllm:cache_config_info Information of the LLMEngine CacheConfig",
           "# TYPE vllm:cache_config_info gauge"]
    for e in ("0", "1"):
        out.append(f'vllm:cache_config_info{{block_size="16",cache_dtype="auto",enable_prefix_caching="True",'
                   f'engine="{e}",gpu_memory_utilization="0.9",num_gpu_blocks="2048",'
                   f'prefix_caching_hash_algo="sha256"}} 1.0')
    out += ["# TYPE vllm:num_requests_waiting gauge"]
    out += [f'vllm:num_requests_waiting{{engine="{e}",model_name="{M}"}} {float(w)}' for e, w in zip("01", waiting)]
    out += ["# TYPE vllm:num_requests_running gauge"]
    out += [f'vllm:num_requests_running{{engine="{e}",model_name="{M}"}} 8.0' for e in "01"]
    out += ["# TYPE vllm:num_preemptions_total counter"]
    out += [f'vllm:num_preemptions_total{{engine="{e}",model_name="{M}"}} {float(p)}'
            for e, p in zip("01", preemptions)]
    out += ["# TYPE vllm:prefix_cache_queries_total counter",
            f'vllm:prefix_cache_queries_total{{engine="0",model_name="{M}"}} 20000.0',
            "# TYPE vllm:prefix_cache_hits_total counter",
            f'vllm:prefix_cache_hits_total{{engine="0",model_name="{M}"}} 6000.0',
            "# TYPE vllm:external_prefix_cache_queries_total counter",
            f'vllm:external_prefix_cache_queries_total{{engine="0",model_name="{M}"}} 14000.0',
            "# TYPE vllm:external_prefix_cache_hits_total counter",
            f'vllm:external_prefix_cache_hits_total{{engine="0",model_name="{M}"}} 3000.0',
            "# TYPE vllm:prompt_tokens_total counter",
            f'vllm:prompt_tokens_total{{engine="0",model_name="{M}"}} 20000.0',
            "# TYPE vllm:prompt_tokens_by_source_total counter"]
    for src, v in (("local_compute", 11000), ("local_cache_hit", 6000), ("external_kv_transfer", 3000)):
        out.append(f'vllm:prompt_tokens_by_source_total{{engine="0",model_name="{M}",source="{src}"}} {float(v)}')
    out.append("# TYPE vllm:prompt_tokens_cached_by_source_total counter")
    for src, v in by_source.items():
        out.append(f'vllm:prompt_tokens_cached_by_source_total{{engine="0",model_name="{M}",source="{src}"}} '
                   f'{float(v)}')
    out.append("# TYPE vllm:kv_block_idle_before_evict_seconds histogram")
    out += [_hist("vllm:kv_block_idle_before_evict_seconds", e, c, 1.0) for e, c in idle.items()]
    if offload:
        out += ["# TYPE vllm:kv_offload_load_bytes_total counter",
                f'vllm:kv_offload_load_bytes_total{{engine="0",model_name="{M}"}} 393216000.0',
                "# TYPE vllm:kv_offload_store_bytes_total counter",
                f'vllm:kv_offload_store_bytes_total{{engine="0",model_name="{M}"}} 917504000.0']
    return "\n".join(out) + "\n"


def snapshot_of(*scrapes: tuple[float, str], extra: tuple[tuple[str, str], ...] = ()):
    store = WindowStore()
    for ts, text in scrapes:
        target = Target("http://v0:8000/metrics", "vllm", "v0")
        signals = normalise(target, parse(text, MAPPINGS.wanted["vllm"]), MAPPINGS).signals
        for role, more in extra:
            t = Target(f"http://v0/{role}", role, "v0")  # type: ignore[arg-type]
            signals += normalise(t, parse(more, MAPPINGS.wanted[role]), MAPPINGS).signals
        store.ingest(resolve(signals, MAPPINGS), ts=ts)
    now = scrapes[-1][0]
    return build_snapshot(store.window(now=now), [], taken_at=now, kv_bytes_per_token=131072.0)


def test_capacity_pressure_and_eviction_ages_reach_the_snapshot():
    snap = snapshot_of((1000.0, vllm_payload()), (1010.0, vllm_payload(
        preemptions=(5, 12), waiting=(1, 2), idle={"0": {1: 10, 2: 30}, "1": {5: 20, 10: 40}})))
    (pod,) = snap.pods
    # cache_config_info has no model label: it joins the pod's model; 2 engines x 2048 blocks x 16
    assert pod.gpu_capacity_tokens == 2 * 2048 * 16
    assert (pod.requests_waiting, pod.preemptions) == (3, 17)
    assert pod.preemption_rate == pytest.approx(10 / 10)
    (age,) = snap.eviction_ages
    assert (age.pod, age.tier, age.measure) == ("v0", "gpu", "idle_before_evict")
    # window increase: 20 samples in (1, 2] and 40 in (5, 10]: p50 = 5 + 5 * (30 - 20) / 40
    assert age.quantiles[0.5] == pytest.approx(5 + 5 * 10 / 40)
    reg = build_registry(lambda: snap)
    assert reg.get_sample_value("tierpilot_gpu_capacity_tokens", {"pod": "v0", "model": M}) == 65536
    assert reg.get_sample_value("tierpilot_requests_waiting", {"pod": "v0", "model": M}) == 3
    assert reg.get_sample_value("tierpilot_preemptions_total", {"pod": "v0", "model": M}) == 17
    assert reg.get_sample_value("tierpilot_eviction_age_seconds", {
        "pod": "v0", "tier": "gpu", "measure": "idle_before_evict", "q": "0.5"}) == pytest.approx(6.25)


def test_lmcache_hits_are_external_unspecified_so_host_and_disk_do_not_split():
    # with LMCache (its connectors do not override vLLM's default source), host/disk stay 0: the
    # by-source split must not report an L1 of 0 and an L2 of 0 for 3,000 connector hits
    snap = snapshot_of((1000.0, vllm_payload()))
    tiers = {t.tier: t for t in snap.tiers}
    assert (tiers["cpu"].source, tiers["cpu"].hit_tokens) == ("connector_combined", 3000)
    assert "l2" not in tiers


def test_a_tier_naming_connector_still_splits_by_source():
    snap = snapshot_of((1000.0, vllm_payload(by_source={"device": 6000, "host": 2000, "disk": 1000,
                                                        "external_unspecified": 0})))
    tiers = {t.tier: t for t in snap.tiers}
    assert (tiers["cpu"].source, tiers["cpu"].hit_tokens, tiers["l2"].hit_tokens) == ("vllm_by_source", 2000, 1000)


def test_vllm_native_offload_is_the_l1_tier():
    snap = snapshot_of((1000.0, vllm_payload(offload=True)))
    tiers = {t.tier: t for t in snap.tiers}
    assert (tiers["cpu"].source, tiers["cpu"].lookup_tokens, tiers["cpu"].hit_tokens) == (
        "vllm_native_offload", 14000, 3000)
    assert "l2" not in tiers


def test_other_prompt_sources_and_cached_sources_are_signals():
    target = Target("http://v0:8000/metrics", "vllm", "v0")
    out = normalise(target, parse(vllm_payload(), MAPPINGS.wanted["vllm"]), MAPPINGS)
    got = {s.name: s.value for s in out.signals if s.le != s.le}
    assert (got["prompt_computed_tokens"], got["prompt_local_hit_tokens"], got["prompt_external_tokens"]) == (
        11000, 6000, 3000)
    assert (got["cached_device_tokens"], got["cached_external_tokens"]) == (6000, 3000)
    assert (got["gpu_blocks"], got["gpu_block_size"]) == (4096, 16)


def test_cache_config_info_before_profiling_gives_no_capacity():
    text = vllm_payload().replace('num_gpu_blocks="2048"', 'num_gpu_blocks="None"')
    (pod,) = snapshot_of((1000.0, text)).pods
    assert pod.gpu_capacity_tokens is None


LMCACHE_MP_AGES = """# TYPE lmcache_mp_l1_chunk_idle_before_evict_seconds histogram
lmcache_mp_l1_chunk_idle_before_evict_seconds_bucket{le="1.0"} 10.0
lmcache_mp_l1_chunk_idle_before_evict_seconds_bucket{le="10.0"} 30.0
lmcache_mp_l1_chunk_idle_before_evict_seconds_bucket{le="+Inf"} 30.0
lmcache_mp_l1_chunk_idle_before_evict_seconds_count 30.0
lmcache_mp_l1_chunk_idle_before_evict_seconds_sum 100.0
"""


def test_lmcache_mp_chunk_ages_are_the_cpu_tier():
    snap = snapshot_of((1000.0, vllm_payload()), extra=(("lmcache", LMCACHE_MP_AGES),))
    ages = {(a.tier, a.measure): a.quantiles for a in snap.eviction_ages}
    assert ages[("cpu", "idle_before_evict")][0.5] == pytest.approx(1 + 9 * (15 - 10) / 20)
    assert ("gpu", "idle_before_evict") in ages


def test_the_warm_start_sees_the_real_gpu_capacity_and_load():
    from agent.runtime.assembly import observed_workload

    store = WindowStore(clock=lambda: 1010.0)
    for ts, text in ((1000.0, vllm_payload()), (1010.0, vllm_payload(preemptions=(5, 12), waiting=(1, 2)))):
        target = Target("http://v0:8000/metrics", "vllm", "v0")
        store.ingest(resolve(normalise(target, parse(text, MAPPINGS.wanted["vllm"]), MAPPINGS).signals, MAPPINGS),
                     ts=ts)
    observed = observed_workload(store, None, 300.0)
    assert observed.gpu_tokens == 2 * 2048 * 16
    assert observed.requests_waiting == 3
    assert observed.preemption_rate == pytest.approx(1.0)


# -- lmcache_series_missing ----------------------------------------------------------------------
def _scrape_once(payloads: dict[str, tuple[str, str]], lmcache: str = "auto"):
    """{path: (role, text)} served on 127.0.0.1, all one pod; the agent's snapshot after one scrape."""
    from agent.collect.discovery import StaticTargets
    from agent.runtime.app import Agent
    from agent.settings import load_settings
    from tests.support.fake_targets import OPENMETRICS, MetricsServer

    with MetricsServer() as srv:  # OpenMetrics text (it ends with `# EOF`) is served as such
        targets = [Target(srv.route(path, text=text, **({"content_type": OPENMETRICS} if text.endswith("# EOF\n") else {})),
                          role, "v0") for path, (role, text) in payloads.items()]
        settings = load_settings(None, env={"TIERPILOT_TIERS__LMCACHE": lmcache})
        return Agent(settings, StaticTargets(targets)).scrape_now()


def _warnings(snap):
    return {st.target.role: [r for r, _ in st.warnings] for st in snap.targets}


def test_a_vllm_pod_with_connector_traffic_but_no_lmcache_series_is_marked():
    from pathlib import Path

    lmcache = (Path(__file__).parent / "fixtures" / "lmcache_inprocess.prom").read_text()
    mp = (Path(__file__).parent / "fixtures" / "lmcache_mp.om").read_text()
    snap = _scrape_once({"/v": ("vllm", vllm_payload())})
    (st,) = snap.targets
    assert st.up and st.warnings == (("lmcache_series_missing", st.warnings[0][1]),)
    assert "PROMETHEUS_MULTIPROC_DIR" in st.warnings[0][1] and "docs/runbooks.md" in st.warnings[0][1]
    # the series on vLLM's own /metrics (shared multiprocess dir): nothing to report
    assert _warnings(_scrape_once({"/v": ("vllm", vllm_payload() + lmcache)})) == {"vllm": []}
    # an LMCache MP server for the pod, vLLM's native offload, or lmcache: none: not LMCache in-process
    assert _warnings(_scrape_once({"/v": ("vllm", vllm_payload()), "/l": ("lmcache", mp)}))["vllm"] == []
    assert _warnings(_scrape_once({"/v": ("vllm", vllm_payload(offload=True))})) == {"vllm": []}
    assert _warnings(_scrape_once({"/v": ("vllm", vllm_payload())}, lmcache="none")) == {"vllm": []}


def test_in_process_mode_expects_the_series_even_before_traffic():
    idle = vllm_payload().replace("vllm:external_prefix_cache_queries_total{engine=\"0\",model_name=\"Qwen/Qwen3-8B\"}"
                                  " 14000.0", "vllm:external_prefix_cache_queries_total{engine=\"0\","
                                  "model_name=\"Qwen/Qwen3-8B\"} 0.0")
    assert _warnings(_scrape_once({"/v": ("vllm", idle)})) == {"vllm": []}
    assert _warnings(_scrape_once({"/v": ("vllm", idle)}, lmcache="in-process")) == {
        "vllm": ["lmcache_series_missing"]}


def test_waiting_requests_give_the_load_term_by_littles_law():
    from agent.runtime.workload_fit import ObservedWorkload

    # 4 pods at 20 req/s in all (5 per pod), 2 requests waiting per pod: 2 / 5 = 0.4 s in the queue
    assert ObservedWorkload(20.0, requests_waiting=2.0).queue_delay_s(pods=4) == pytest.approx(0.4)
    assert ObservedWorkload(20.0, requests_waiting=0.0).queue_delay_s(pods=4) == 0.0
    assert ObservedWorkload(None, requests_waiting=2.0).queue_delay_s(pods=4) is None
    assert ObservedWorkload(20.0).queue_delay_s(pods=4) is None
