"""The live loop on fake time: baseline, trials, an injected regression rolled back within one
evaluation window, improvement kept, phase end, drift -> new warm-started phase, dry-run."""
from __future__ import annotations

import math

import optuna
import pytest
from prometheus_client import CollectorRegistry

from contracts.knobs import Knobs
from tests.support.tuner_fakes import FakeActuator, FakeClock, FakeFleet
from tests.support.tuner_settings import (
    controller_settings,
    drift_settings,
    guardrail_settings,
    live_settings,
)
from tuners.controller import TuningController, latest_phase
from tuners.drift import DriftDetector
from tuners.guardrails import Guardrails
from tuners.live import LiveEvaluator
from tuners.metrics import TunerMetrics
from tuners.space import Choice, DeploymentLimits, FloatRange, SearchSpace

optuna.logging.set_verbosity(optuna.logging.WARNING)

SPACE = SearchSpace(
    (Choice("chunk_tokens", (64, 256, 512)), FloatRange("cpu_gib", 0.0, 10.0, 5.0),
     Choice("router", ("roundrobin", "prefixaware"))),
    DeploymentLimits(pods=2, node_memory_headroom_gib=10.0),
)
BAD = Knobs(chunk_tokens=64, cpu_gib=0.0)
GOOD = Knobs(chunk_tokens=512, cpu_gib=10.0, router="prefixaware")
SETTLE, WINDOW, TICK = 60.0, 300.0, 30.0


def median(k: Knobs) -> float:
    if k == BAD:
        return 0.40  # the injected regression: 2x the default's TTFT
    if k == GOOD:
        return 0.14
    return 0.20 + 0.01 * (k.chunk_tokens == 64)


class ListWarmStart:
    def __init__(self, *batches: list[Knobs]) -> None:
        self.batches = list(batches)
        self.calls = 0

    def candidates(self, k: int) -> list[Knobs]:
        self.calls += 1
        return self.batches.pop(0)[:k] if self.batches else []


def build(*, warm: ListWarmStart, dry_run: bool = False, buckets: tuple[float, ...] | None = None,
          drift: DriftDetector | None = None, trials: int = 4, storage=None):
    clock = FakeClock()
    actuator = FakeActuator(clock)
    fleet = FakeFleet(actuator, median, rate=1.0, buckets=buckets)
    metrics = TunerMetrics(target="demo")
    registry = CollectorRegistry()
    registry.register(metrics)
    guard = Guardrails(actuator, SPACE, metrics,
                       guardrail_settings(apply="all", cooldown_s=120, max_changes_per_hour=6, dry_run=dry_run), clock=clock)
    ctl = TuningController(
        space=SPACE, objective=None, storage=storage or optuna.storages.InMemoryStorage(), guardrails=guard,
        evaluator=LiveEvaluator(guard, fleet, live_settings(settle_s=SETTLE, window_s=WINDOW, min_requests=30)),
        metrics=metrics, settings=controller_settings(study="live", seed=1, trials_per_phase=trials),
        warm_start=warm, drift=drift)
    return clock, actuator, ctl, registry


def run_until(ctl: TuningController, clock: FakeClock, state: str, *, limit: float = 20000,
              signals=None) -> list:
    reports = []
    end = clock.now + limit
    while clock.now < end:
        r = ctl.step(clock.now, signals(clock.now) if signals else None)
        reports.append(r)
        if r.state == state:
            return reports
        clock.advance(TICK)
    raise AssertionError(f"no {state!r} within {limit} s; last states {[x.state for x in reports[-5:]]}")


@pytest.mark.parametrize("form", ["samples", "buckets"])
def test_regression_is_rolled_back_within_one_window_and_improvement_kept(form: str) -> None:
    buckets = (0.05, 0.1, 0.15, 0.2, 0.25, 0.3, 0.4, 0.5, 0.75, 1.0) if form == "buckets" else None
    clock, actuator, ctl, registry = build(warm=ListWarmStart([BAD, GOOD]), buckets=buckets)
    run_until(ctl, clock, "baseline_done")
    assert actuator.last_good() == Knobs()  # the running configuration is the first last good
    started = run_until(ctl, clock, "trial_started")[-1]
    t0 = clock.now
    assert actuator.current() == BAD and started.trial == 0  # the twin's first candidate
    rolled = run_until(ctl, clock, "rolled_back")[-1]
    assert clock.now - t0 <= SETTLE + WINDOW + TICK  # within one evaluation window
    assert actuator.current() == Knobs()
    assert "Mann-Whitney" in rolled.message
    run_until(ctl, clock, "trial_started")
    assert actuator.current() == GOOD
    improved = run_until(ctl, clock, "improved")[-1]
    assert improved.trial == 1
    assert actuator.last_good() == GOOD and ctl.tuner.last_good() == GOOD
    by_source = {(t.attrs.get("source"), t.knobs): t.state for t in ctl.tuner.trials()}
    assert by_source == {("twin", BAD): "rolled_back", ("twin", GOOD): "complete", ("baseline", Knobs()): "complete"}

    def get(name: str, **labels: str) -> float | None:
        return registry.get_sample_value(name, {"workload": "demo", **labels})

    assert get("tierpilot_tuner_trials_total", state="rolled_back") == 1
    assert get("tierpilot_tuner_trials_total", state="complete") == 1
    assert get("tierpilot_actuations_total", result="rolled_back") == 1
    assert get("tierpilot_actuations_total", result="applied") == 2
    assert get("tierpilot_tuner_best_objective_seconds") == pytest.approx(ctl.tuner.best().value)
    assert ctl.tuner.best().knobs == GOOD

    run_until(ctl, clock, "holding")  # trials_per_phase=4 -> holds the best configuration
    assert actuator.current() == GOOD
    assert ctl.step(clock.now + 1e5).state == "holding"


def test_drift_starts_a_new_phase_warm_started_from_the_twin() -> None:
    drift = DriftDetector(drift_settings(warmup=10, threshold=8.0), signals=("reuse_ratio",))
    warm = ListWarmStart([GOOD], [Knobs(chunk_tokens=256, cpu_gib=5.0, router="prefixaware")])
    clock, actuator, ctl, registry = build(warm=warm, drift=drift)
    t_shift = clock.now + 3000

    def signals(t: float) -> dict[str, float]:
        noise = 0.01 * math.sin(t / 7.0)
        return {"reuse_ratio": (0.6 if t < t_shift else 0.2) + noise}

    run_until(ctl, clock, "improved", signals=signals)
    assert actuator.current() == GOOD
    r = run_until(ctl, clock, "drift", signals=signals)[-1]
    assert r.drift.signal == "reuse_ratio" and r.drift.direction == "down"
    assert 0 <= clock.now - t_shift <= 10 * TICK
    assert ctl.phase == 1 and warm.calls == 2
    assert latest_phase(ctl.storage, "live") == 1
    assert ctl.tuner.last_good() == GOOD  # carried into the new phase as the fallback
    assert registry.get_sample_value("tierpilot_drift_events_total", {"workload": "demo", "signal": "reuse_ratio"}) == 1
    assert registry.get_sample_value("tierpilot_tuner_phase", {"workload": "demo"}) == 1
    run_until(ctl, clock, "baseline_done", signals=signals)
    started = run_until(ctl, clock, "trial_started", signals=signals)[-1]
    assert actuator.current() == Knobs(chunk_tokens=256, cpu_gib=5.0, router="prefixaware")
    assert started.trial == 0  # the twin's candidate comes before anything sampled


def test_dry_run_controller_proposes_but_never_changes_the_target() -> None:
    clock, actuator, ctl, registry = build(warm=ListWarmStart([BAD, GOOD]), dry_run=True, trials=3)
    run_until(ctl, clock, "holding")
    assert actuator.current() == Knobs()
    assert {c[0] for c in actuator.calls} == {"apply_dry_run"}
    assert registry.get_sample_value("tierpilot_tuner_trials_total", {"workload": "demo", "state": "dry_run"}) == 3
