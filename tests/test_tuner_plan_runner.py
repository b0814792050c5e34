"""Plans off the control tick: while the twin prices a plan on the plan thread, every tick returns
at once ("planning") and drift is still checked; the candidates are enqueued when the plan is done;
a plan overtaken by drift is discarded; a plan that fails fails the step that takes it."""
from __future__ import annotations

import math
import threading
import time

import optuna
import pytest

from contracts.knobs import Knobs
from tests.support.tuner_fakes import FakeActuator, FakeClock, FakeFleet
from tests.support.tuner_settings import (
    controller_settings,
    drift_settings,
    guardrail_settings,
    horizon_settings,
    live_settings,
)
from tests.test_tuner_controller import BAD, GOOD, SETTLE, SPACE, TICK, WINDOW, median, run_until
from tuners.controller import TuningController
from tuners.drift import DriftDetector
from tuners.guardrails import Guardrails
from tuners.live import LiveEvaluator
from tuners.metrics import TunerMetrics
from tuners.planning.plan_runner import InlineExecutor, PlanRunner, background_executor

optuna.logging.set_verbosity(optuna.logging.WARNING)


class GatedPlan:
    """A plan that takes as long as the test says: each call waits for `release`."""

    def __init__(self, *batches: list[Knobs]) -> None:
        self.batches = list(batches)
        self.release = threading.Event()
        self.entered = threading.Event()
        self.calls = 0
        self.threads: list[str] = []
        self.fail: Exception | None = None

    def candidates(self, k: int) -> list[Knobs]:
        self.calls += 1
        self.threads.append(threading.current_thread().name)
        self.entered.set()
        assert self.release.wait(10), "the test never released the plan"
        if self.fail is not None:
            raise self.fail
        return self.batches.pop(0)[:k] if self.batches else []


def settle_plan(ctl: TuningController, clock: FakeClock, signals=None, wall_s: float = 10.0):
    """Step (fake time) until the plan thread has handed its plan over (the thread needs real time);
    the report of the step that took it."""
    deadline = time.monotonic() + wall_s
    while (r := ctl.step(clock.now, signals(clock.now) if signals else None)).state == "planning":
        assert time.monotonic() < deadline, "the plan never finished"
        clock.advance(TICK)
        time.sleep(0.01)
    clock.advance(TICK)
    return r


def build(warm, *, drift: DriftDetector | None = None, horizon=None, executor=None):
    clock = FakeClock()
    actuator = FakeActuator(clock)
    fleet = FakeFleet(actuator, median, rate=1.0)
    metrics = TunerMetrics(target="demo")
    guard = Guardrails(actuator, SPACE, metrics, guardrail_settings(apply="all", cooldown_s=120, max_changes_per_hour=6),
                       clock=clock)
    ctl = TuningController(
        space=SPACE, objective=None, storage=optuna.storages.InMemoryStorage(), guardrails=guard,
        evaluator=LiveEvaluator(guard, fleet, live_settings(settle_s=SETTLE, window_s=WINDOW, min_requests=30)),
        metrics=metrics, settings=controller_settings(study="bg", seed=1, trials_per_phase=4, plan_after_baseline=True,
                                                     live_search=False),
        warm_start=warm, drift=drift, plan_executor=executor or background_executor(), horizon=horizon)
    return clock, actuator, ctl


def test_the_tick_never_waits_for_a_plan_and_takes_its_candidates_when_done():
    warm = GatedPlan([GOOD])
    clock, actuator, ctl = build(warm)
    run_until(ctl, clock, "baseline_done")  # the plan starts once the baseline is measured
    assert warm.entered.wait(5)
    assert warm.threads == ["tierpilot-plan_0"]  # not the caller's thread
    for _ in range(5):  # the plan is still being priced (it waits for the test): each tick returns at once
        assert ctl.step(clock.now, None).state == "planning"
        clock.advance(TICK)
    assert actuator.current() == Knobs() and ctl.tuner is not None
    assert [t.state for t in ctl.tuner.trials()] == ["complete"]  # the baseline only: nothing enqueued yet
    warm.release.set()
    started = settle_plan(ctl, clock)  # the step that takes the plan starts its candidate
    assert actuator.current() == GOOD and started.trial is not None
    assert warm.calls == 1


def test_drift_discards_a_plan_in_flight():
    drift = DriftDetector(drift_settings(warmup=10, threshold=8.0), signals=("reuse_ratio",))
    warm = GatedPlan([GOOD], [])
    clock, actuator, ctl = build(warm, drift=drift)
    t_shift = clock.now + 2000

    def signals(t: float) -> dict[str, float]:
        return {"reuse_ratio": (0.6 if t < t_shift else 0.2) + 0.01 * math.sin(t / 7.0)}

    run_until(ctl, clock, "baseline_done", signals=signals)
    assert warm.entered.wait(5)
    reports = run_until(ctl, clock, "drift", signals=signals)
    assert {r.state for r in reports[:-1]} == {"planning"}  # drift was checked on every planning tick
    assert ctl.plans.discarded == 1 and ctl.phase == 1
    warm.release.set()  # the old regime's plan finishes after the drift: its GOOD is never enqueued
    run_until(ctl, clock, "baseline_done", signals=signals)
    settle_plan(ctl, clock, signals)  # the new regime's plan, on the thread
    run_until(ctl, clock, "holding", signals=signals)  # it found nothing: the phase holds
    assert actuator.current() == Knobs()  # nothing from the discarded plan was tried
    assert warm.calls == 2  # the new regime was planned on its own


def test_a_failing_plan_fails_the_step_that_takes_it():
    warm = GatedPlan([GOOD])
    warm.fail = RuntimeError("twin replay failed: no history")
    warm.release.set()
    clock, _actuator, ctl = build(warm)
    with pytest.raises(RuntimeError, match="twin replay failed"):
        run_until(ctl, clock, "never")


def test_inline_runner_hands_the_outcome_over_once():
    runner = PlanRunner(InlineExecutor())
    runner.start(lambda: [GOOD], now=42.0)
    assert not runner.running
    out = runner.take()
    assert out is not None and list(out.candidates) == [GOOD] and out.started == 42.0 and out.error is None
    assert runner.take() is None
    runner.start(lambda: 1 / 0, now=43.0)
    err = runner.take()
    assert err is not None and isinstance(err.error, ZeroDivisionError)


class BatchPlan:
    """A plan that hands out the given batches in order, at once."""

    def __init__(self, *batches: list[Knobs]) -> None:
        self.batches = list(batches)

    def candidates(self, k: int) -> list[Knobs]:
        return self.batches.pop(0)[:k] if self.batches else []


def test_a_replan_tries_its_move_even_to_a_configuration_the_phase_measured_before():
    warm = BatchPlan([GOOD], [Knobs()])  # first look: GOOD; the next look prices the defaults (trial 0's) again
    clock, actuator, ctl = _replanning(warm)
    first = run_until(ctl, clock, "trial_started")[-1]
    assert actuator.current() == GOOD and first.trial is not None
    run_until(ctl, clock, "replan")
    second = run_until(ctl, clock, "trial_started")[-1]
    assert actuator.current() == Knobs()  # the planned move, not a draw of the sampler
    assert ctl.tuner is not None
    started = next(t for t in ctl.tuner.trials() if t.number == second.trial)
    assert started.knobs == Knobs() and started.attrs.get("source") == "twin"


def test_a_replan_does_not_try_again_a_move_rolled_back_in_the_phase():
    clock, actuator, ctl = _replanning(BatchPlan([BAD], [BAD]))
    run_until(ctl, clock, "rolled_back")
    assert actuator.current() == Knobs()
    run_until(ctl, clock, "replan")
    reports = run_until(ctl, clock, "holding", limit=5000)
    assert "trial_started" not in {r.state for r in reports} and actuator.current() == Knobs()


def _replanning(warm: BatchPlan):
    from tuners.planning.horizon import RegimeHorizon

    return build(warm, executor=InlineExecutor(),
                 horizon=RegimeHorizon(horizon_settings(floor_s=300.0, cap_s=36000.0, replan_growth=1.25)))
