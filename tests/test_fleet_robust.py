"""No single pod steers the fleet: the windows the tuner plans and judges on are robust to one
hostile pod (agent/runtime/fleet_robust.py). The issue's scenario: honest pods report 10 requests
per 2.5 s with ~2k-token prompts, ~0.3 external hits and ~0.4 s TTFT; one pod reports 200
requests per 2.5 s, 12k-token prompts, 0.9 external hits and a 9 s TTFT. With it among 4 pods
and among 16, what the planner fits (rate, prompt mix, hit ratio, waiting, GPU size), the
calibration points and the judge's TTFT histogram equal the honest fleet's."""
from __future__ import annotations

import logging

import pytest

from agent.collect.mapping import load_mappings
from agent.collect.normalise import normalise, resolve
from agent.collect.parse import parse
from agent.collect.store import WindowStore
from agent.runtime.fleet_robust import FleetBounds, PodStats, RobustFleet, fleet_outliers, robust_window
from agent.runtime.paying_runtime import latency_points, observed_between
from agent.runtime.tuning_bridge import StoreWindowSource, drift_signals
from agent.settings import load_settings
from contracts.tier_model import Target

MAPPINGS = load_mappings()
M = "m"
LENGTH_BUCKETS = (256, 1024, 4096, 16384, 65536)
TTFT_BUCKETS = (0.1, 0.5, 1.0, 5.0, 10.0, 30.0)


def _hist(name: str, n: float, value: float, buckets: tuple[float, ...]) -> list[str]:
    lines = [f'{name}_bucket{{engine="0",le="{float(le)}",model_name="{M}"}} {n if value <= le else 0.0}'
             for le in buckets]
    return lines + [f'{name}_bucket{{engine="0",le="+Inf",model_name="{M}"}} {n}',
                    f'{name}_count{{engine="0",model_name="{M}"}} {n}', f'{name}_sum{{engine="0",model_name="{M}"}} {n * value}']


def pod_payload(n: float, length: float, hits: float, ttft: float, waiting: float) -> str:
    """A vLLM pod's /metrics after `n` requests of `length` tokens, `hits` of them served from
    LMCache (external), each with `ttft` seconds to the first token."""
    tokens = n * length
    out = ['# TYPE vllm:cache_config_info gauge',
           'vllm:cache_config_info{block_size="16",engine="0",num_gpu_blocks="2048"} 1.0',
           "# TYPE vllm:num_requests_waiting gauge", f'vllm:num_requests_waiting{{engine="0",model_name="{M}"}} {waiting}',
           "# TYPE vllm:request_success_total counter",
           f'vllm:request_success_total{{engine="0",finished_reason="stop",model_name="{M}"}} {n}',
           "# TYPE vllm:prompt_tokens_total counter", f'vllm:prompt_tokens_total{{engine="0",model_name="{M}"}} {tokens}',
           "# TYPE vllm:prefix_cache_queries_total counter",
           f'vllm:prefix_cache_queries_total{{engine="0",model_name="{M}"}} {tokens}',
           "# TYPE vllm:prefix_cache_hits_total counter", f'vllm:prefix_cache_hits_total{{engine="0",model_name="{M}"}} 0.0',
           "# TYPE vllm:external_prefix_cache_queries_total counter",
           f'vllm:external_prefix_cache_queries_total{{engine="0",model_name="{M}"}} {tokens}',
           "# TYPE vllm:external_prefix_cache_hits_total counter",
           f'vllm:external_prefix_cache_hits_total{{engine="0",model_name="{M}"}} {tokens * hits}',
           "# TYPE vllm:prompt_tokens_by_source_total counter",
           (f'vllm:prompt_tokens_by_source_total{{engine="0",model_name="{M}",source="local_compute"}} '
            f'{tokens * (1 - hits)}'),
           (f'vllm:prompt_tokens_by_source_total{{engine="0",model_name="{M}",source="external_kv_transfer"}} '
            f'{tokens * hits}'),
           "# TYPE vllm:time_to_first_token_seconds histogram"]
    out += _hist("vllm:time_to_first_token_seconds", n, ttft, TTFT_BUCKETS)
    out += ["# TYPE vllm:request_prompt_tokens histogram"]
    out += _hist("vllm:request_prompt_tokens", n, length, LENGTH_BUCKETS)
    return "\n".join(out) + "\n"


HONEST = {"per_step": 10, "length": 2000, "hits": 0.3, "ttft": 0.4, "waiting": 1.0}
HOSTILE = {"per_step": 200, "length": 12000, "hits": 0.9, "ttft": 9.0, "waiting": 40.0}


def fleet_store(pods: int, hostile: int | None, *, steps: int = 24, step_s: float = 2.5) -> WindowStore:
    """`pods` pods scraped every `step_s` for `steps` scrapes; pod `hostile` (if any) lies."""
    store = WindowStore(clock=lambda: 1000.0 + steps * step_s, window_s=300, retention_s=900)
    for k in range(steps + 1):
        for p in range(pods):
            spec = HOSTILE if p == hostile else {**HONEST, "length": HONEST["length"] + 50 * (p % 3)}
            text = pod_payload(spec["per_step"] * k, spec["length"], spec["hits"], spec["ttft"], spec["waiting"])
            target = Target(f"http://p{p}:8000/metrics", "vllm", f"p{p}")
            store.ingest(resolve(normalise(target, parse(text, MAPPINGS.wanted["vllm"]), MAPPINGS).signals,
                                 MAPPINGS), ts=1000.0 + k * step_s)
    return store


def bounds() -> FleetBounds:
    b = load_settings(env={}).tuner.fleet_bounds
    return FleetBounds(max_ratio=b.max_ratio, max_hit_gap=b.max_hit_gap, max_pod_rps=b.max_pod_rps,
                       max_pod_prompt_tokens_per_s=b.max_pod_prompt_tokens_per_s, min_pods=b.min_pods)


def _stats(pod: str, rate: float, length: float = 2000.0, ttft: float = 0.4, hit: float = 0.3) -> PodStats:
    return PodStats(pod, M, rate * 60, rate, length, rate * length, ttft, hit)


def test_outliers_are_named_by_what_is_out_of_bounds():
    honest = [_stats(f"p{i}", 4.0 + 0.2 * i) for i in range(3)]
    b = bounds()
    assert fleet_outliers(honest, b) == {}
    for odd, word in ((_stats("x", 80.0), "requests/s"), (_stats("x", 4.0, length=12000), "prompt tokens per request"),
                      (_stats("x", 4.0, ttft=9.0), "TTFT"), (_stats("x", 4.0, hit=0.95), "hit ratio")):
        assert list(fleet_outliers([*honest, odd], b)) == [("x", M)]
        assert word in fleet_outliers([*honest, odd], b)[("x", M)]
    # implausible on its own, whatever the fleet: one pod claiming 2^63 requests
    alone = fleet_outliers([_stats("x", 2.0 ** 63 / 60)], b)
    assert "max_pod_rps" in alone[("x", M)]
    # a two-pod fleet has no median to compare with: only the absolute bounds apply
    assert fleet_outliers([_stats("a", 4.0), _stats("b", 40.0)], b) == {}


@pytest.mark.parametrize("pods", [4, 16])
def test_one_hostile_pod_does_not_move_what_the_tuner_sees(pods):
    honest_store, hostile_store = fleet_store(pods, None), fleet_store(pods, 3)
    now = 1000.0 + 24 * 2.5
    honest = observed_between(honest_store, None, now - 60, now, latest=False)
    naive = observed_between(hostile_store, None, now - 60, now, latest=False)
    robust = RobustFleet(hostile_store, bounds())
    seen = observed_between(robust, None, now - 60, now, latest=False)
    # the bug, as it was: summed over pods, the hostile pod dominates the rate and the mix
    assert naive.arrival_rate_rps > 2 * honest.arrival_rate_rps and naive.overlap > honest.overlap + 0.3
    # robust: the rate, the mix, the hit ratio and the load are the honest fleet's
    assert seen.arrival_rate_rps == pytest.approx(honest.arrival_rate_rps, rel=0.05)
    assert [b[:2] for b in seen.prompt_length_mix] == [b[:2] for b in honest.prompt_length_mix]
    assert [b[2] for b in seen.prompt_length_mix] == pytest.approx([b[2] for b in honest.prompt_length_mix], abs=0.02)
    assert seen.overlap == pytest.approx(honest.overlap, abs=0.02)
    assert seen.requests_waiting == pytest.approx(honest.requests_waiting, rel=0.05)
    assert seen.gpu_tokens == honest.gpu_tokens
    # the calibration points and the judge's histogram too
    honest_points = [x for point in latency_points(honest_store, now - 60, now, 30) for x in point]
    robust_points = [x for point in latency_points(robust, now - 60, now, 30) for x in point]
    assert len(honest_points) == 6 and robust_points == pytest.approx(honest_points, rel=0.05)
    judge, reference = StoreWindowSource(robust), StoreWindowSource(honest_store)
    assert judge.ttft_observations(now - 60, now).buckets == reference.ttft_observations(now - 60, now).buckets
    assert judge.cumulative_hit_ratio(now - 60, now) == pytest.approx(reference.cumulative_hit_ratio(now - 60, now),
                                                                       abs=0.02)


@pytest.mark.parametrize("pods", [4, 16])
def test_one_hostile_pod_moves_neither_the_drift_signals_nor_the_latest_rate(pods):
    """The drift detector's signals and the fitted workload's latest-window rate (both read
    `store.window`) are the honest fleet's: one pod cannot raise a drift alarm or a replan."""
    honest_store, hostile_store = fleet_store(pods, None), fleet_store(pods, 3)
    robust = RobustFleet(hostile_store, bounds())
    honest, naive, seen = (drift_signals(s, None, 60.0) for s in (honest_store, hostile_store, robust))
    assert set(seen) == set(honest) == {"arrival_rate", "prompt_tokens_mean", "long_prompt_fraction", "hit_ratio"}
    assert naive["arrival_rate"] > 2 * honest["arrival_rate"]  # summed, the hostile pod dominates
    assert naive["long_prompt_fraction"] > honest["long_prompt_fraction"] + 0.3
    for key, value in honest.items():
        assert seen[key] == pytest.approx(value, rel=0.05, abs=0.02), key
    now = 1000.0 + 24 * 2.5
    latest = observed_between(robust, None, now - 60, now, latest=True)
    assert latest.arrival_rate_rps == pytest.approx(honest["arrival_rate"], rel=0.05)


def test_outliers_are_counted_and_logged(caplog):
    store = fleet_store(4, 3)
    robust = RobustFleet(store, bounds())
    with caplog.at_level(logging.WARNING, logger="agent.runtime.fleet_robust"):
        robust.window_between(1000.0, 1060.0)
        robust.window_between(1000.0, 1060.0)
    lines = [r.getMessage() for r in caplog.records if "fleet outlier" in r.getMessage()]
    assert len(lines) == 1 and "pod p3" in lines[0]  # logged once, when it becomes an outlier
    (fam,) = robust.collector().collect()
    assert [(s.labels["pod"], s.labels["reason"], s.value) for s in fam.samples] == [("p3", "requests_per_s", 2.0)]
    window, outliers = robust_window(store.window_between(1000.0, 1060.0), bounds())
    assert set(outliers) == {("p3", M)} and set(window["pod"].unique().to_list()) == {"p0", "p1", "p2", "p3"}
