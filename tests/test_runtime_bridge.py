"""The pure pieces of the runtime: the window source, drift signals, the KV counter feed, KV
endpoints from pods, the restricted search space, the last good record in study storage, and the
synthetic workload fitted to observed signals. Exact values on small hand-built inputs."""
from __future__ import annotations

import math

import optuna
import pytest

from agent.collect.store import WindowStore
from agent.kvevents import PodCounters
from agent.runtime.tuning_bridge import (
    StoreWindowSource,
    StudyLastGood,
    drift_signals,
    feed_kv_counters,
    kv_endpoints_from_pods,
    pod_counters,
    restrict_space,
)
from agent.runtime.workload_fit import ObservedWorkload, fit_phase, fitted_workload, length_moments
from contracts.knobs import Knobs
from contracts.tier_model import Signal
from tuners.space import DeploymentLimits, SearchSpace

NAN = math.nan
M = "llama"


def counter(pod, name, value, le=NAN, model=M, source="vllm_v1"):
    return Signal(pod, model, name, le, value, "counter", source)


def scrape(store, ts, pod, *, requests, prompt, computed, external, ttft, prompt_len=None):
    """One scrape of cumulative counters; `ttft` / `prompt_len` are cumulative buckets {le: count}."""
    sig = [counter(pod, "requests", requests), counter(pod, "prompt_tokens", prompt),
           counter(pod, "prompt_computed_tokens", computed), counter(pod, "connector_hit_tokens", external),
           counter(pod, "gpu_lookup_tokens", prompt), counter(pod, "gpu_hit_tokens", prompt - computed - external),
           counter(pod, "connector_lookup_tokens", computed + external)]
    sig += [counter(pod, "ttft_seconds", c, le) for le, c in ttft.items()]
    sig += [counter(pod, "prompt_length_tokens", c, le) for le, c in (prompt_len or {}).items()]
    store.ingest(sig, ts=ts)


@pytest.fixture
def store():
    now = [130.0]
    s = WindowStore(retention_s=1000, window_s=60, clock=lambda: now[0])
    inf = math.inf
    # t=100: lifetime totals; t=110 and t=120: 10 and 30 more requests
    scrape(s, 100.0, "p0", requests=100, prompt=100_000, computed=40_000, external=10_000,
           ttft={0.1: 50, 0.5: 90, inf: 100}, prompt_len={1024: 60, 8192: 100, inf: 100})
    scrape(s, 110.0, "p0", requests=110, prompt=110_000, computed=44_000, external=11_000,
           ttft={0.1: 52, 0.5: 99, inf: 110}, prompt_len={1024: 66, 8192: 110, inf: 110})
    scrape(s, 120.0, "p0", requests=140, prompt=170_000, computed=74_000, external=21_000,
           ttft={0.1: 52, 0.5: 109, inf: 140}, prompt_len={1024: 66, 8192: 120, inf: 140})
    return s


def test_window_source_reads_exactly_the_window_it_is_asked_for(store):
    src = StoreWindowSource(store)
    obs = src.ttft_observations(100.0, 110.0)  # one scrape in (100, 110]: its increases
    assert obs.buckets == ((0.1, 2.0), (0.5, 7.0), (math.inf, 1.0))
    obs = src.ttft_observations(100.0, 120.0)
    assert obs.buckets == ((0.1, 2.0), (0.5, 17.0), (math.inf, 21.0)) and obs.count == 40
    assert src.ttft_observations(120.0, 130.0) is None  # nothing scraped after 120
    # hits in (110, 120]: prompt 60k, computed 30k -> cached 30k (gpu 20k + external 10k) -> 0.5
    assert src.cumulative_hit_ratio(110.0, 120.0) == pytest.approx(0.5)


def test_window_source_counts_only_the_share_of_an_increase_inside_the_window(store):
    # (105, 120]: the scrape at 110 covers (100, 110], half of it inside: 5 of its 10 requests
    obs = StoreWindowSource(store).ttft_observations(105.0, 120.0)
    assert obs.count == pytest.approx(5 + 30)


def test_drift_signals_over_the_window(store):
    sig = drift_signals(store, None, 30.0)  # (100, 130]: 40 requests, 70k prompt tokens in 20 s
    assert sig["arrival_rate"] == pytest.approx(2.0)
    assert sig["prompt_tokens_mean"] == pytest.approx(70_000 / 40)
    assert sig["long_prompt_fraction"] == pytest.approx(20 / 40)  # the +Inf bucket starts at 8192
    assert sig["hit_ratio"] == pytest.approx(1 - 34_000 / 70_000)
    assert "reuse_ratio" not in sig  # no KV events: the detector falls back to counters
    assert drift_signals(store, None, 30.0, long_prompt_tokens=1024)["long_prompt_fraction"] == pytest.approx(34 / 40)


class Recorder:
    def __init__(self):
        self.calls = []

    def observe_counters(self, pod, model, counters, ts=None):
        self.calls.append((pod, model, counters, ts))

    def current_overlap(self, model=None, window_s=None):
        return None


def test_the_kv_feed_passes_the_latest_scraped_counters(store):
    assert pod_counters(store.window(15.0)) == {
        ("p0", M): PodCounters(prompt_tokens=170_000, local_compute_tokens=74_000, external_hit_tokens=21_000)}
    rec = Recorder()
    assert feed_kv_counters(store, rec, window_s=15.0, ts=130.0) == 1
    assert rec.calls == [("p0", M, PodCounters(170_000, 74_000, 21_000), 130.0)]
    assert feed_kv_counters(store, rec, window_s=5.0) == 0  # no pod scraped in the last 5 s


def test_pod_counters_need_the_prompt_counter():
    s = WindowStore(clock=lambda: 10.0)
    s.ingest([counter("p1", "connector_hit_tokens", 5.0)], ts=10.0)
    assert pod_counters(s.window()) == {}


def test_kv_endpoints_from_running_annotated_pods():
    def pod(name, ip, ann, phase="Running"):
        return {"metadata": {"name": name, "annotations": ann}, "status": {"phase": phase, "podIP": ip}}

    pods = [pod("b", "10.0.0.2", {"tierpilot.io/kv-events-port": "5557", "tierpilot.io/model": "m",
                                  "tierpilot.io/kv-events-replay-port": "5600"}),
            pod("a", "10.0.0.1", {"tierpilot.io/kv-events-port": "5557"}),
            pod("c", "10.0.0.3", {}),  # no stream advertised
            pod("d", "10.0.0.4", {"tierpilot.io/kv-events-port": "5557"}, phase="Pending"),
            pod("e", "10.0.0.5", {"tierpilot.io/kv-events-port": "5557", "tierpilot.io/kv-events-dp-size": "x"})]
    specs, errors = kv_endpoints_from_pods(pods, default_model="fallback")
    assert [(s.pod, s.model, s.endpoint, s.replay_endpoint) for s in specs] == [
        ("a", "fallback", "tcp://10.0.0.1:5557", None), ("b", "m", "tcp://10.0.0.2:5557", "tcp://10.0.0.2:5600")]
    assert len(errors) == 1 and "pod e" in errors[0] and "kv-events-dp-size" in errors[0]
    specs, errors = kv_endpoints_from_pods(pods[1:2])  # no model anywhere: reported, skipped
    assert specs == [] and "tierpilot.io/model" in errors[0]


def test_restricted_space_searches_only_owned_knobs_and_keeps_the_rest():
    space = SearchSpace.from_limits(DeploymentLimits(l2_backend="curvine"))
    running = Knobs(router="session", l2_eviction="lfu", chunk_tokens=512)
    small = restrict_space(space, {"chunk_tokens", "cpu_gib", "cpu_eviction", "l2_min_prompt_tokens"}, running)
    assert [d.name for d in small.dimensions] == ["chunk_tokens", "cpu_gib", "l2_min_prompt_tokens"]
    cand = small.to_knobs({"chunk_tokens": 128, "cpu_gib": 2.0, "l2_min_prompt_tokens": 256})
    assert (cand.router, cand.l2_eviction, cand.chunk_tokens) == ("session", "lfu", 128)
    with_wm = restrict_space(space, {"l2_eviction", "l2_high_watermark", "l2_low_watermark"}, running)
    assert [d.name for d in with_wm.dimensions] == ["l2_eviction", "l2_watermarks"]
    assert restrict_space(space, {"l2_high_watermark"}, running).dimensions == ()  # half a pair is not a dimension


def test_last_good_round_trips_through_study_storage(tmp_path):
    url = f"sqlite:///{tmp_path}/lg.db"
    lg = StudyLastGood(optuna.storages.RDBStorage(url), "prod")
    assert lg.load_last_good() is None and lg.records() == {}
    good = Knobs(chunk_tokens=512, cpu_gib=8.0)
    lg.on_mark_good(good, {"deployment-env llm/vllm": '{"knobs": {}}'})
    again = StudyLastGood(optuna.storages.RDBStorage(url), "prod")  # a restarted agent
    assert again.load_last_good() == good
    assert again.records() == {"deployment-env llm/vllm": '{"knobs": {}}'}
    assert "prod.last-good" in optuna.study.get_all_study_names(url)


# -- the fitted synthetic workload ----------------------------------------------------------
def token_overlap(frame) -> float:
    """Share of prompt tokens in 512-token blocks seen earlier (the KV-event overlap definition)."""
    seen, reused, total = set(), 0, 0
    for length, hashes in frame.select("input_length", "hash_ids").iter_rows():
        total += length
        for h in hashes:
            reused += 512 if h in seen else 0
            seen.add(h)
    return reused / total


def test_length_moments_from_buckets():
    assert length_moments([(0, 1000, 0.5), (1000, 3000, 0.5)]) == (1250.0, 750.0)
    assert length_moments([(4096, math.inf, 1.0)]) == (6144.0, 0.0)
    assert length_moments([]) is None and length_moments([(0, 10, 0.0)]) is None


@pytest.mark.parametrize(("rate", "mix", "overlap"), [
    (8.0, ((0, 1024, 0.2), (1024, 2048, 0.5), (2048, 4096, 0.3)), 0.8),
    (8.0, ((0, 512, 0.5), (512, 1024, 0.5)), 0.3),
    (6.0, ((512, 1024, 1.0),), 0.6),
    (4.0, ((2048, 4096, 1.0),), 0.0),
])
def test_fitted_workload_matches_rate_length_and_overlap(rate, mix, overlap):
    frame = fitted_workload(ObservedWorkload(rate, mix, overlap), duration_s=300, max_requests=5000, seed=1)
    mean, _std = length_moments(mix)
    span = (frame["timestamp_ms"].max() - frame["timestamp_ms"].min()) / 1000
    assert frame.height / span == pytest.approx(rate, rel=0.15)
    assert frame["input_length"].mean() == pytest.approx(mean, rel=0.1)
    # 512-token blocks quantise short prefixes and the prefix pool is random: +-0.08 at ~2,000 requests
    assert token_overlap(frame) == pytest.approx(overlap, abs=0.08)


def test_fit_caps_requests_and_defaults_unknown_signals():
    phase = fit_phase(ObservedWorkload(100.0), duration_s=300, max_requests=500)
    assert phase.duration_s == pytest.approx(5.0) and phase.rate_rps == 100.0
    assert phase.system_share == 0.0  # overlap unknown: no shared prefix is invented
    idle = fit_phase(ObservedWorkload(None, (), 0.5), duration_s=60)
    assert idle.rate_rps == 0.05 and idle.system_share == 1.0
    with pytest.raises(ValueError, match="overlap"):
        ObservedWorkload(1.0, (), 1.5)
