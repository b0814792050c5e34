"""Guardrails on fake time: one change in flight, cooldown, hourly cap, dry-run, logs, metrics."""
from __future__ import annotations

import json
import logging

import pytest
from prometheus_client import CollectorRegistry, generate_latest

from contracts.actuator import PermanentActuationError, RetriableActuationError, RolloutTimeoutError
from contracts.knobs import Knobs
from tests.support.tuner_fakes import FakeActuator, FakeClock
from tests.support.tuner_settings import guardrail_settings
from tuners.guardrails import Guardrails
from tuners.metrics import TunerMetrics
from tuners.space import DeploymentLimits, SearchSpace

SPACE = SearchSpace.from_limits(DeploymentLimits(pods=2, node_memory_headroom_gib=16, cpu_budget_gib=20))


def make(dry_run: bool = False, cooldown: float = 600, cap: int = 3):
    clock = FakeClock()
    actuator = FakeActuator(clock)
    metrics = TunerMetrics(target="ns/llm")
    registry = CollectorRegistry()
    registry.register(metrics)
    g = Guardrails(actuator, SPACE, metrics, guardrail_settings(apply="all", cooldown_s=cooldown, max_changes_per_hour=cap,
                                                               dry_run=dry_run), clock=clock)
    return clock, actuator, g, registry


def sample(registry: CollectorRegistry, name: str, **labels: str) -> float | None:
    return registry.get_sample_value(name, {"workload": "ns/llm", **labels})


def test_one_change_in_flight_then_cooldown_then_hourly_cap() -> None:
    clock, actuator, g, registry = make(cooldown=600, cap=3)
    assert g.apply(Knobs(chunk_tokens=512), trial=0).status == "applied"
    assert g.apply(Knobs(chunk_tokens=1024), trial=1).status == "blocked"
    assert g.blocked() == "in_flight"
    g.finish(0)
    assert g.blocked() == "cooldown"
    clock.advance(599)
    assert g.apply(Knobs(chunk_tokens=1024), trial=1).message == "cooldown"
    clock.advance(1)
    assert g.apply(Knobs(chunk_tokens=1024), trial=1).status == "applied"
    g.finish(1)
    clock.advance(600)
    assert g.apply(Knobs(chunk_tokens=128), trial=2).status == "applied"
    g.finish(2)
    clock.advance(600)  # t = 1800 s after the first change: 3 changes in the last hour
    out = g.apply(Knobs(chunk_tokens=64), trial=3)
    assert (out.status, out.message, out.retry_after_s) == ("blocked", "hourly_cap", 1800.0)
    clock.advance(1800)  # the first change leaves the rolling hour
    assert g.apply(Knobs(chunk_tokens=64), trial=3).status == "applied"
    assert actuator.current() == Knobs(chunk_tokens=64)
    assert sample(registry, "tierpilot_actuations_total", result="applied") == 4
    assert sample(registry, "tierpilot_tuner_guardrail_blocks_total", reason="in_flight") == 1
    assert sample(registry, "tierpilot_tuner_guardrail_blocks_total", reason="cooldown") == 1
    assert sample(registry, "tierpilot_tuner_guardrail_blocks_total", reason="hourly_cap") == 1


def test_invalid_candidate_is_never_applied() -> None:
    _, actuator, g, registry = make()
    out = g.apply(Knobs(cpu_gib=15.0), trial=0)  # 15 GiB x 2 pods > 20 GiB fleet budget
    assert out.status == "rejected"
    assert "fleet_cpu_budget_gib" in out.message
    assert actuator.calls == []
    assert sample(registry, "tierpilot_actuations_total", result="rejected") == 1


def test_dry_run_proposes_and_logs_but_changes_nothing(caplog: pytest.LogCaptureFixture) -> None:
    _, actuator, g, registry = make(dry_run=True)
    caplog.set_level(logging.INFO, logger="tierpilot.tuner")
    out = g.apply(Knobs(chunk_tokens=512, router="prefixaware"), trial=7)
    assert out.status == "dry_run"
    assert actuator.current() == Knobs()
    assert [c[0] for c in actuator.calls] == ["apply_dry_run"]
    assert g.rollback("test", trial=7) is None
    g.mark_good(Knobs(chunk_tokens=512), trial=7)
    assert actuator.last_good() is None
    events = [json.loads(r.getMessage()) for r in caplog.records]
    proposal = next(e for e in events if e["event"] == "proposal")
    assert proposal["trial"] == 7 and proposal["dry_run"] is True
    assert proposal["changed"] == {"chunk_tokens": [256, 512], "router": ["roundrobin", "prefixaware"]}
    assert [e["event"] for e in events] == ["proposal", "dry_run", "rollback", "mark_good"]
    assert sample(registry, "tierpilot_actuations_total", result="dry_run") == 2
    assert sample(registry, "tierpilot_dry_run") == 1


def test_actuation_errors_are_reported_not_raised() -> None:
    _, actuator, g, registry = make(cooldown=0)
    actuator.fail_next = [RetriableActuationError("409 conflict", delay_s=5.0)]
    out = g.apply(Knobs(chunk_tokens=512), trial=0)
    assert (out.status, out.retry_after_s) == ("retry", 5.0)
    assert g.in_flight is None
    actuator.fail_next = [PermanentActuationError("403 forbidden: missing RBAC")]
    out = g.apply(Knobs(chunk_tokens=512), trial=0)
    assert out.status == "failed" and out.permanent
    actuator.fail_next = [RolloutTimeoutError("rollout not done after 600 s")]
    out = g.apply(Knobs(chunk_tokens=512), trial=0)
    assert out.status == "failed" and not out.permanent
    assert g.in_flight == 0  # the caller must roll back before anything else changes
    assert sample(registry, "tierpilot_actuations_total", result="retriable_error") == 1
    assert sample(registry, "tierpilot_actuations_total", result="permanent_error") == 1
    assert sample(registry, "tierpilot_actuations_total", result="rollout_timeout") == 1


def test_rollback_restores_last_good_and_config_info_follows() -> None:
    _, actuator, g, registry = make(cooldown=0)
    good = Knobs(chunk_tokens=512, cpu_gib=8.0)
    g.apply(good, trial=0)
    g.mark_good(good, trial=0)
    g.finish(0)
    g.apply(Knobs(chunk_tokens=64), trial=1)
    labels = {"chunk_tokens": "64", "cpu_gib": "5", "cpu_eviction": "lru", "l2_eviction": "lru",
              "l2_high_watermark": "1", "l2_low_watermark": "1", "router": "roundrobin",
              "l2_min_prompt_tokens": "0", "router_temperature": "0", "kv_penalty_host": "0.8",
              "kv_penalty_external": "0.6"}
    assert sample(registry, "tierpilot_config_info", **labels) == 1
    result = g.rollback("regression", trial=1)
    assert result is not None and result.knobs == good
    assert actuator.current() == good
    assert sample(registry, "tierpilot_config_info", **{**labels, "chunk_tokens": "512", "cpu_gib": "8"}) == 1
    assert sample(registry, "tierpilot_config_info", **labels) is None  # old series gone
    assert sample(registry, "tierpilot_actuations_total", result="rolled_back") == 1
    text = generate_latest(registry).decode()
    assert 'tierpilot_tuner_last_good_info{chunk_tokens="512"' in text.replace('workload="ns/llm",', "")


def test_a_refused_configuration_rejects_the_candidate_and_tuning_goes_on() -> None:
    """A value the targets cannot express (RefusedConfigError, raised before any write) rejects that
    candidate; it is not a permanent fault of the target, so the controller is not stopped."""
    from contracts.actuator import RefusedConfigError

    _, actuator, g, registry = make(cooldown=0)
    actuator.fail_next = [RefusedConfigError("router: routing_logic=session needs session_key")]
    out = g.apply(Knobs(router="session"), trial=0)
    assert out.status == "rejected" and not out.permanent
    assert "session_key" in out.message
    assert g.in_flight is None and actuator.current().router != "session"
    assert sample(registry, "tierpilot_actuations_total", result="rejected") == 1
    assert (sample(registry, "tierpilot_actuations_total", result="permanent_error") or 0) == 0
    out = g.apply(Knobs(chunk_tokens=512), trial=1)  # the next candidate goes through
    assert out.status == "applied"
