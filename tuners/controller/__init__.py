"""The tuning controller: what the agent's scheduler calls on every tick.

`TuningController.step(now, signals)` does at most one thing per call, never sleeps, and never
raises for an actuation or evaluation problem (it reports it):

1. drift check on the workload signals; on a change point, abort any trial in flight (roll back
   to the last good configuration) and start a new phase;
2. a new phase opens its own optuna study (`<study>.phase000`, `.phase001`, ...), enqueues the
   twin's top candidates for the new workload first (warm start), and measures a baseline of the
   running configuration (recorded as a trial, and kept as the regression reference);
3. otherwise, with no trial in flight and the guardrails permitting: ask -> validate -> apply ->
   settle -> measure a window -> judge against the baseline -> tell; a statistically worse trial
   is rolled back at once; a better one becomes the last good configuration (study user attrs
   and `actuator.mark_good`);
4. after `trials_per_phase` trials the phase holds the last good configuration until drift.

`resume(now)` after a restart: reopen the latest phase, fail trials left in flight, and
re-apply the last good configuration if the target runs anything else.

A trial's own steps (start, poll, judge, roll back) are in `tuners.controller.trials`, the
phase studies' names and lookups in `tuners.controller.phases`.
"""
from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from concurrent.futures import Executor
from typing import Protocol

import optuna

from contracts.actuator import ActuationError
from contracts.knobs import Knobs
from tuners.base import Candidate
from tuners.controller.phases import latest_good_before, latest_phase, phase_study_name
from tuners.controller.trials import LiveTrials, StepReport
from tuners.drift import DriftDetector, DriftEvent
from tuners.guardrails import Guardrails
from tuners.live import LiveEvaluator, LiveResult
from tuners.logline import log_event
from tuners.metrics import TunerMetrics
from tuners.objective import ObjectiveSpec
from tuners.optuna_tuner import OptunaTuner
from tuners.payoff import TtftSummary
from tuners.planning.horizon import RegimeHorizon
from tuners.planning.plan_runner import PlanRunner
from tuners.planning.warmstart import WarmStart
from tuners.space import SearchSpace
from tuners.space.limits import CandidateError

# the names code outside `tuners` imports from here
__all__ = ["ControllerSettings", "StepReport", "TuningController", "latest_phase"]


@dataclasses.dataclass(frozen=True, kw_only=True)
class ControllerSettings:
    """study: base study name (phases are `<study>.phaseNNN`). sampler/seed: the live sampler.
    trials_per_phase: live trials before holding. warm_start_k: twin candidates enqueued first.
    min_improvement: relative gain needed to replace the last good configuration.
    max_apply_retries: retriable actuation failures before the trial fails.
    plan_after_baseline: ask the warm start once the phase's baseline window is measured (so it
    sees the new regime's requests), not when the phase opens.
    live_search: False = only the warm start's candidates are tried live (the search happened on
    the twin) and one that is not worse than the baseline is kept.
    drift_quiet_s: drift signals are ignored this long after each change the tuner makes (a
    rollout disturbs what the agent measures; it is not a workload shift).
    config_dependent: drift signals re-learned after each change the tuner makes (they move with
    the configuration: the hit ratio; the KV-event reuse ratio, whose blocks are chunk-sized)."""

    study: str
    sampler: str
    seed: int | None
    owner: str
    trials_per_phase: int
    warm_start_k: int
    min_improvement: float
    max_apply_retries: int
    plan_after_baseline: bool
    live_search: bool
    drift_quiet_s: float
    config_dependent: tuple[str, ...]



class WindowPredictor(Protocol):
    """The twin's TTFT for a configuration over one live window (`tuners.planning.twin_oracle.WindowTwin`)."""

    def predict(self, knobs: Knobs, since: float, until: float) -> TtftSummary | None:
        ...


class TuningController(LiveTrials):
    """Drift -> phase -> ask -> actuate via guardrails -> evaluate -> tell -> rollback.

    With `counterfactual`, a trial is judged against the baseline corrected for how the workload
    moved between the two windows: the baseline's TTFT scaled by the twin's TTFT p95 for the last
    good configuration over the trial's window / over the baseline's window. Every finished window
    also exports the twin's prediction error for the configuration that ran in it."""

    def __init__(self, *, space: SearchSpace, objective: ObjectiveSpec | None, storage: optuna.storages.BaseStorage,
                 guardrails: Guardrails, evaluator: LiveEvaluator, metrics: TunerMetrics,
                 settings: ControllerSettings, warm_start: WarmStart | None = None,
                 drift: DriftDetector | None = None, counterfactual: WindowPredictor | None = None,
                 horizon: RegimeHorizon | None = None, plan_executor: Executor | None = None) -> None:
        self.space = space
        base = objective or ObjectiveSpec()
        self.objective = ObjectiveSpec(metric=base.metric, memory_ms_per_gib=base.memory_ms_per_gib)
        self.storage = storage
        self.guardrails = guardrails
        self.evaluator = evaluator
        self.metrics = metrics
        self.settings = settings
        self.warm_start = warm_start
        self.drift = drift
        self.phase = -1
        self.tuner: OptunaTuner | None = None
        self.baseline: LiveResult | None = None
        self.candidate: Candidate | None = None  # asked, applied, being measured
        self._retry: tuple[Candidate, float, int] | None = None  # (candidate, retry at, attempts)
        self.stopped: str | None = None
        self.holding = False
        self.counterfactual = counterfactual
        self.horizon = horizon
        self.prediction_errors: list[tuple[float, float]] = []  # (window end, error ratio)
        self._plan_pending = False
        self.plans = PlanRunner(plan_executor)  # the warm start / plan, off the tick when given a thread
        self._planned = 0
        self._now = 0.0
        self._drift_quiet_until = -math.inf

    # -- lifecycle ---------------------------------------------------------------------------
    def resume(self, now: float, *, adopt: bool = False) -> list[int]:
        """Reopen the latest phase after a restart; fail orphaned trials; restore last good.
        `adopt`: this replica just took the Lease; the previous leader's trial in flight is failed
        and its candidate measured again (OptunaTuner.resume)."""
        latest = latest_phase(self.storage, self.settings.study)
        if self.horizon is not None and not self.horizon.starts:
            self.horizon.start(now)
        self._open_phase(max(latest, 0), now, reason="resume" if latest >= 0 else "start",
                         fresh=latest < 0)
        assert self.tuner is not None
        orphans = self.tuner.resume(adopt=adopt)
        for _ in orphans:
            self.metrics.trial_finished("failed")
        good = self.tuner.last_good() or self.guardrails.actuator.last_good()
        if good is not None:
            self.metrics.set_last_good(good)
            try:
                current = self.guardrails.actuator.current()
                self.metrics.set_config(current)
                if current != good:
                    self.guardrails.reapply(good, reason="restart: target not on the last good configuration")
                    self._config_changed()
            except (ActuationError, CandidateError) as exc:
                log_event("reapply_failed", error=str(exc))
        log_event("resume", phase=self.phase, orphaned_trials=orphans,
                  last_good=good, finished_trials=len(self.tuner.trials()))
        return orphans

    def step(self, now: float, signals: Mapping[str, float] | None = None) -> StepReport:
        """One scheduler tick. See the module docstring for the order of work."""
        self._now = now
        if self.tuner is None:
            self.resume(now)
        quiet = now < self._drift_quiet_until
        event = self.drift.update(signals, now) if (self.drift is not None and signals and not quiet) else None
        if event is not None:
            self.metrics.drift_event(event.signal)
            self._on_drift(event, now)
            return StepReport(now, self.phase, "drift", message=f"{event.signal} {event.direction}", drift=event)
        if self.stopped:
            return StepReport(now, self.phase, "stopped", message=self.stopped)
        if self.plans.running:
            return StepReport(now, self.phase, "planning", message="the twin is pricing candidates")
        self._take_plan()
        if self.evaluator.pending is not None:
            return self._poll(now)
        if self.baseline is None:
            knobs = self._current()
            self.evaluator.start_baseline(knobs, now)
            return StepReport(now, self.phase, "baseline", message="measuring the running configuration")
        if self._retry is not None:
            cand, at, attempts = self._retry
            if now < at:
                return StepReport(now, self.phase, "retry", cand.number, f"retrying at {at:g}")
            return self._start(cand, now, attempts)
        if self._phase_done():
            return self._hold(now)
        blocked = self.guardrails.blocked(now)
        if blocked is not None:
            self.metrics.guardrail_block(blocked)
            return StepReport(now, self.phase, "blocked", message=blocked)
        assert self.tuner is not None
        try:
            cand = self.tuner.ask()
        except CandidateError as exc:
            self.metrics.trial_finished("rejected")
            return StepReport(now, self.phase, "rejected", message=str(exc))
        return self._start(cand, now, 0)

    # -- internals (a trial's own steps: tuners/controller/trials.py) -----------------------
    def _on_drift(self, event: DriftEvent, now: float) -> None:
        assert self.tuner is not None
        dropped = self.evaluator.abort()
        if dropped is not None and self.candidate is not None:
            self.tuner.fail(self.candidate, f"workload drift ({event.signal}) during evaluation")
            self.metrics.trial_finished("failed")
            self._rollback(self.candidate.number, "workload drift during evaluation")
            self._finish(self.candidate)
        self._retry = None
        if self.plans.discard():
            log_event("plan_discarded", phase=self.phase, reason=f"workload drift ({event.signal})")
        if self.horizon is not None:
            self.horizon.start(now)
        self._open_phase(self.phase + 1, now, reason=f"drift:{event.signal}", fresh=True)

    def _open_phase(self, phase: int, now: float, *, reason: str, fresh: bool) -> None:
        s = self.settings
        self.phase = phase
        self.tuner = OptunaTuner(self.space, self.objective, storage=self.storage,
                                 study_name=phase_study_name(s.study, phase), sampler=s.sampler,
                                 seed=s.seed, owner=s.owner)
        self.baseline = None
        self.holding = False
        self.stopped = None
        self.metrics.set_phase(phase)
        if fresh:
            self.tuner.study.set_user_attr("phase", {"number": phase, "reason": reason, "started_at": now})
            previous = latest_good_before(self.storage, s.study, phase)
            if previous is not None and self.tuner.last_good() is None:
                self.tuner.set_last_good(previous)  # carry the fallback across phases
            self._planned = 0
            if s.plan_after_baseline:
                self._plan_pending = True
            else:
                self._enqueue_warm_start()
        log_event("phase", phase=phase, reason=reason, study=self.tuner.study_name)

    def _enqueue_warm_start(self) -> None:
        """Start the warm start / plan (on the plan executor); its candidates are enqueued when
        it finishes (at once with the inline executor)."""
        assert self.tuner is not None
        if self.warm_start is None or self.settings.warm_start_k <= 0:
            return
        warm, k = self.warm_start, self.settings.warm_start_k
        self.plans.start(lambda: warm.candidates(k), self._now)
        self._take_plan()

    def _take_plan(self) -> None:
        outcome = self.plans.take()
        if outcome is None or self.tuner is None:
            return
        if outcome.error is not None:  # the step fails as if the plan had run on it (TuningLoop reports it)
            raise outcome.error
        if outcome.seconds > 1.0:
            log_event("plan_priced", phase=self.phase, started_at=outcome.started, wall_s=round(outcome.seconds, 2),
                      candidates=len(outcome.candidates))
        # every planned move is tried as planned, even a configuration this phase has measured
        # before (the baseline of an earlier look): a skipped one would leave its live trial to the
        # sampler, a move nobody priced. Only a move the guardrails rolled back in this phase is
        # not tried again: live evidence outranks the twin.
        rolled_back = [t.knobs for t in self.tuner.trials() if t.state == "rolled_back"]
        for knobs in outcome.candidates:
            if knobs in rolled_back:
                log_event("warm_start_skipped", knobs=knobs, error="rolled back earlier in this phase")
                continue
            try:
                self.tuner.enqueue(knobs, source="twin", again=True)
                self._planned += 1
            except CandidateError as exc:
                log_event("warm_start_skipped", error=str(exc))
        if self.horizon is not None:
            self.horizon.planned(outcome.started)

    def _phase_done(self) -> bool:
        assert self.tuner is not None
        done = [t for t in self.tuner.trials() if t.state != "running" and t.attrs.get("source") != "baseline"]
        limit = self.settings.trials_per_phase
        if not self.settings.live_search:
            limit = self._planned  # every planned move is tried; a plan is bounded by the planner
        return len(done) >= limit

    def _hold(self, now: float) -> StepReport:
        assert self.tuner is not None
        if (self.horizon is not None and self.settings.plan_after_baseline and self.warm_start is not None
                and self.horizon.replan_due(now)):
            # the regime has aged: its horizon may have grown enough for a move to pay now. Measure
            # the running configuration again, then plan (the same path as a new phase's plan)
            self.horizon.planned(now)
            self.holding = False
            self.baseline = None
            self._plan_pending = True
            log_event("replan", phase=self.phase, horizon=self.horizon.estimate(now).to_dict())
            return StepReport(now, self.phase, "replan", message="the regime has aged: planning again")
        good = self.tuner.last_good()
        if not self.holding:
            self.holding = True
            if good is not None and self._current() != good:
                self._rollback(None, "phase finished: restore the best configuration")
            log_event("phase_done", phase=self.phase, last_good=good)
        return StepReport(now, self.phase, "holding", message="phase finished; waiting for drift")

    def _current(self) -> Knobs:
        try:
            return self.guardrails.actuator.current()
        except ActuationError:
            assert self.tuner is not None
            return self.tuner.last_good() or self.space.fixed

    def _config_changed(self) -> None:
        if self.drift is not None:
            self.drift.reset(self.settings.config_dependent)
        self._drift_quiet_until = self._now + self.settings.drift_quiet_s

    def _update_best(self) -> None:
        assert self.tuner is not None
        best = self.tuner.best()
        self.metrics.set_best(best.value if best else None)
