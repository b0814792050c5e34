"""A cardinality budget per target: one pod with thousands of model labels cannot multiply the
agent's own series; the most active models are kept exactly, the rest dropped with a reason."""
from __future__ import annotations

import logging
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from agent.collect.budget import Budget, CardinalityBudget
from agent.collect.discovery import StaticTargets
from agent.runtime.app import Agent
from agent.settings import load_settings
from contracts.tier_model import NO_LE, Signal, Target
from tests.support.fake_targets import MetricsServer

GOOD = (Path(__file__).parent / "fixtures" / "vllm_0_33_dp2.prom").read_text()


def many_models(n: int, scale: float = 1.0, skip: tuple[int, ...] = ()) -> str:
    """One pod, `n` model_name values, 4 counters each; model i has i+1 requests."""
    out = []
    for name in ("prefix_cache_queries", "prefix_cache_hits", "prompt_tokens", "request_success"):
        out.append(f"# TYPE vllm:{name}_total counter")
        for i in range(n):
            if i not in skip:
                value = (i + 1) * scale * (100 if name != "request_success" else 1)
                out.append(f'vllm:{name}_total{{engine="0",model_name="m{i:05d}"}} {value}')
    return "\n".join(out) + "\n"


def sig(model: str, name: str, value: float, le: float = NO_LE) -> Signal:
    return Signal("p", model, name, le, value, "counter", "vllm_v1")


def test_the_most_active_models_are_kept_and_stay_kept():
    budget = CardinalityBudget(Budget(models=3))
    signals = [sig(f"m{i}", "requests", float(i)) for i in range(6)] + [sig("", "fuse_read_bytes", 1.0)]
    cut = budget.apply("t", signals)
    assert {s.model for s in cut.signals} == {"m5", "m4", "m3", ""}  # model-less signals always kept
    assert (cut.models_seen, cut.models_dropped, cut.readmitted) == (6, 3, ())
    # activity changes: the kept set does not churn
    cut = budget.apply("t", [sig(f"m{i}", "requests", 100.0 - i) for i in range(6)])
    assert {s.model for s in cut.signals} == {"m5", "m4", "m3"}
    # a kept model leaves: the most active dropped one is let in, and said to be not new
    cut = budget.apply("t", [sig(f"m{i}", "requests", 100.0 - i) for i in range(5)])
    assert {s.model for s in cut.signals} == {"m4", "m3", "m0"} and cut.readmitted == ("m0",)


def test_the_series_budget_drops_whole_signals_never_part_of_a_histogram():
    budget = CardinalityBudget(Budget(series=10))
    hist = [sig("a", "ttft_seconds", 1.0, le) for le in (0.1, 0.5, 1.0, float("inf"))]
    signals = [sig("a", "requests", 9.0), *hist, sig("a", "ttft_seconds:sum", 1.0),
               sig("a", "ttft_seconds:count", 1.0), sig("b", "requests", 1.0), *(
                   sig("b", "ttft_seconds", 1.0, le) for le in (0.1, 0.5, 1.0, float("inf")))]
    cut = budget.apply("t", signals)
    assert cut.series_dropped == 4 and len(cut.signals) == 8
    assert [s for s in cut.signals if s.model == "b"] == [sig("b", "requests", 1.0)]


@pytest.fixture(scope="module")
def server():
    with MetricsServer() as srv:
        yield srv


def _exported_models(agent: Agent, pod: str) -> tuple[set[str], int, dict[str, float]]:
    models: set[str] = set()
    series = 0
    warnings: dict[str, float] = {}
    for fam in text_string_to_metric_families(agent.metrics_text()):
        for s in fam.samples:
            if s.labels.get("pod") != pod:
                continue
            series += 1
            if "model" in s.labels:
                models.add(s.labels["model"])
            if s.name == "tierpilot_target_warning":
                warnings[s.labels["reason"]] = s.value
            if s.name == "tierpilot_scrape_errors_total":
                warnings["count:" + s.labels["reason"]] = s.value
    return models, series, warnings


def test_one_pod_with_hundreds_of_models_is_held_to_the_budget(server, caplog):
    hostile = server.route("/hostile", text=many_models(300))
    good = server.route("/good", text=GOOD)
    targets = StaticTargets([Target(hostile, "vllm", "hostile"), Target(good, "vllm", "good")])
    unbounded = Agent(load_settings(env={}, scrape={"max_models_per_target": 0, "max_series_per_target": 0}),
                      targets)
    unbounded.scrape_now()
    models_before, series_before, _ = _exported_models(unbounded, "hostile")
    assert len(models_before) == 300

    agent = Agent(load_settings(env={}), targets)
    with caplog.at_level(logging.INFO, logger="agent.collect.jobs"):
        for _ in range(3):
            snap = agent.scrape_now()
    models, series, warned = _exported_models(agent, "hostile")
    assert models == {f"m{i:05d}" for i in range(284, 300)}  # the 16 most active, exactly
    assert series * 10 < series_before
    status = {s.target.pod: s for s in snap.targets}
    assert status["hostile"].up and status["hostile"].errors == {"model_budget": 3 * 284}
    assert warned == {"model_budget": 1.0, "count:model_budget": 3 * 284.0}
    assert "284 of 300 models dropped" in dict(status["hostile"].warnings)["model_budget"]
    over = [r for r in caplog.records if "cardinality budget" in r.getMessage()]
    assert len(over) == 1 and "hostile" in over[0].getMessage()  # once per change, not per scrape
    # a kept model's numbers are exactly the unbounded agent's; the good pod is untouched
    kept = {(p.model, p.requests, p.prompt_tokens) for p in snap.pods if p.pod == "hostile"}
    assert kept == {(p.model, p.requests, p.prompt_tokens) for p in unbounded.snapshot.pods
                    if p.pod == "hostile" and p.model >= "m00284"}
    def lifetime(snap):
        return [(p.model, p.requests, p.prompt_tokens, p.ttft_quantiles) for p in snap.pods if p.pod == "good"]
    assert lifetime(snap) == lifetime(unbounded.snapshot) and lifetime(snap)
    # back within the budget: one line saying so
    server.route("/hostile", text=many_models(10))
    with caplog.at_level(logging.INFO, logger="agent.collect.jobs"):
        snap = agent.scrape_now()
    assert not dict(snap.targets[0].warnings).get("model_budget")
    assert any("within its cardinality budget again" in r.getMessage() for r in caplog.records)


def test_a_model_let_in_late_counts_no_phantom_increase(server):
    url = server.route("/late", text=many_models(20))
    now = [1000.0]
    agent = Agent(load_settings(env={}), StaticTargets([Target(url, "vllm", "late")]), clock=lambda: now[0])
    agent.scrape_now()
    now[0] += 15
    server.route("/late", text=many_models(20, skip=(19,)))  # a kept model leaves: m00003 is let in
    snap = agent.scrape_now()
    rates = {p.model: p.request_rate for p in snap.pods}
    assert "m00003" in rates
    assert rates["m00003"] is None  # its lifetime total (4 requests) is not an increase in 15 s
    assert all(rates[m] in (None, 0.0) for m in rates)
