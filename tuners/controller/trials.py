"""One live trial of the tuning controller, from apply to verdict.

`LiveTrials` holds the trial half of `tuners.controller.TuningController`: start a candidate
through the guardrails (retry, dry-run, proposed, rejected, failed), poll its measurement window,
record the baseline, judge a trial against the baseline (corrected by the twin's counterfactual
when there is one) and tell it or roll it back. `StepReport` is what one step did.

It is a mixin: the state it reads and writes (`tuner`, `phase`, `baseline`, `candidate`,
`_retry`, `stopped`, `evaluator`, `guardrails`, `metrics`, `settings`, `objective`,
`counterfactual`, `prediction_errors`, `_plan_pending`) and the methods it calls
(`_config_changed`, `_update_best`, `_enqueue_warm_start`) are the controller's.
"""
from __future__ import annotations

import dataclasses
import math

from contracts.actuator import ActuationError
from tuners.base import Candidate
from tuners.drift import DriftEvent
from tuners.live import InsufficientTraffic, LiveResult
from tuners.logline import log_event
from tuners.objective import TtftObservations
from tuners.stats import scale_observations


@dataclasses.dataclass(frozen=True)
class StepReport:
    """What one `step` did. state: see `TuningController.step`."""

    now: float
    phase: int
    state: str
    trial: int | None = None
    message: str = ""
    drift: DriftEvent | None = None


class LiveTrials:
    """Start -> poll -> baseline or judge -> tell or roll back (see the module docstring)."""

    def _start(self, cand: Candidate, now: float, attempts: int) -> StepReport:
        assert self.tuner is not None
        self._retry = None
        res = self.evaluator.start(cand, now)
        if res.started:
            self.candidate = cand
            self._config_changed()
            return StepReport(now, self.phase, "trial_started", cand.number, res.message)
        if res.status == "dry_run":
            self.tuner.fail(cand, "dry-run: proposed, not applied", state="dry_run")
            self.metrics.trial_finished("dry_run")
            self.guardrails.finish(cand.number)
            return StepReport(now, self.phase, "dry_run", cand.number, "proposed, not applied")
        if res.status == "proposed":  # outside tuner.apply: kept for a person (tuners/proposals.py)
            self.tuner.fail(cand, res.message, state="proposed")
            self.metrics.trial_finished("proposed")
            return StepReport(now, self.phase, "proposed", cand.number, res.message)
        if res.status == "rejected":
            self.tuner.fail(cand, res.message, state="rejected")
            self.metrics.trial_finished("rejected")
            return StepReport(now, self.phase, "rejected", cand.number, res.message)
        if res.status in ("retry", "blocked") and attempts + 1 < self.settings.max_apply_retries:
            self._retry = (cand, now + res.retry_after_s, attempts + 1)
            return StepReport(now, self.phase, "retry", cand.number, res.message)
        # failed: permanent error, rollout timeout, or out of retries
        self.tuner.fail(cand, res.message or res.status)
        self.metrics.trial_finished("failed")
        if self.guardrails.in_flight == cand.number:  # rollout timed out: undo whatever happened
            self._rollback(cand.number, f"apply failed: {res.message}")
            self.guardrails.finish(cand.number)
        if res.permanent:
            self.stopped = f"permanent actuation error: {res.message}"
            log_event("tuning_stopped", reason=self.stopped)
            return StepReport(now, self.phase, "stopped", cand.number, self.stopped)
        return StepReport(now, self.phase, "failed", cand.number, res.message)

    def _poll(self, now: float) -> StepReport:
        assert self.tuner is not None
        cand = self.candidate
        try:
            result = self.evaluator.poll_result(now)
        except InsufficientTraffic as exc:
            if cand is None:  # baseline: try again with the next window
                return StepReport(now, self.phase, "baseline", message=str(exc))
            self.tuner.fail(cand, str(exc))
            self.metrics.trial_finished("failed")
            self._rollback(cand.number, "too little traffic to judge the trial")
            self._finish(cand)
            return StepReport(now, self.phase, "failed", cand.number, str(exc))
        if result is None:
            return StepReport(now, self.phase, "measuring", cand.number if cand else None)
        self._prediction_error(result)
        if cand is None:
            return self._baseline_done(result, now)
        return self._judge(cand, result, now)

    def _prediction_error(self, result: LiveResult) -> None:
        if self.counterfactual is None:
            return
        pred = self.counterfactual.predict(result.knobs, result.since, result.until)
        live = result.evaluation.ttft_p95_s
        if pred is None or not (live > 0 and math.isfinite(pred.p95_s)):
            return
        err = pred.p95_s / live - 1.0
        self.prediction_errors.append((result.until, err))
        self.metrics.set_twin_prediction_error(err)
        log_event("twin_prediction", knobs=result.knobs, since=result.since, until=result.until,
                  predicted_p95_s=pred.p95_s, measured_p95_s=live, error=err)

    def _drift_factor(self, result: LiveResult) -> float:
        """How much slower the last good configuration would have been over the trial's window than
        over the baseline's, on the twin (1.0 without a counterfactual)."""
        assert self.tuner is not None and self.baseline is not None
        good = self.tuner.last_good() or self.baseline.knobs
        if self.counterfactual is None:
            return 1.0
        then = self.counterfactual.predict(good, self.baseline.since, self.baseline.until)
        now = self.counterfactual.predict(good, result.since, result.until)
        if then is None or now is None or not (then.p95_s > 0 and now.p95_s > 0):
            return 1.0
        factor = now.p95_s / then.p95_s
        log_event("counterfactual", knobs=good, baseline_window=[self.baseline.since, self.baseline.until],
                  trial_window=[result.since, result.until], factor=factor)
        return factor

    def _baseline_done(self, result: LiveResult, now: float) -> StepReport:
        assert self.tuner is not None
        self.baseline = result
        rec = self.tuner.record(result.knobs, result.evaluation, source="baseline")
        value = result.evaluation.metric(self.objective.metric)
        if self.tuner.last_good() is None or self.tuner.last_good() == result.knobs:
            self.tuner.set_last_good(result.knobs, trial=rec.number if rec else None, value=value)
            self.guardrails.mark_good(result.knobs, trial=rec.number if rec else None)
        self._update_best()
        if self._plan_pending:
            self._plan_pending = False
            self._enqueue_warm_start()
        return StepReport(now, self.phase, "baseline_done", rec.number if rec else None,
                          f"{self.objective.metric}={value:.4g}s")

    def _judge(self, cand: Candidate, result: LiveResult, now: float) -> StepReport:
        assert self.tuner is not None and self.baseline is not None
        ev = result.evaluation
        factor = self._drift_factor(result)
        base_obs: TtftObservations | None = scale_observations(self.baseline.evaluation.ttft, factor)
        verdict = self.guardrails.judge(ev.ttft, base_obs, trial=cand.number) if ev.ttft and base_obs else None
        if verdict is not None and verdict.worse:
            self._rollback(cand.number, verdict.reason)
            self.tuner.tell(cand, ev, rolled_back=True)
            self.metrics.trial_finished("rolled_back")
            self.metrics.set_trial_objective(ev.metric(self.objective.metric))
            self._finish(cand)
            return StepReport(now, self.phase, "rolled_back", cand.number, verdict.reason)
        self.tuner.tell(cand, ev)
        self.metrics.trial_finished("complete")
        value = ev.metric(self.objective.metric)
        self.metrics.set_trial_objective(value)
        good_value = self.tuner.last_good_value()
        good_value = None if good_value is None else good_value * factor
        state = "told"
        if not self.settings.live_search or (verdict is None or verdict.conclusive) and (
                good_value is None or value < good_value * (1.0 - self.settings.min_improvement)):
            self.tuner.set_last_good(cand.knobs, trial=cand.number, value=value)
            self.guardrails.mark_good(cand.knobs, trial=cand.number)
            self.baseline = result
            state = "improved"
        self._finish(cand)
        self._update_best()
        return StepReport(now, self.phase, state, cand.number, verdict.reason if verdict else "")

    def _finish(self, cand: Candidate) -> None:
        self.candidate = None
        self.guardrails.finish(cand.number)

    def _rollback(self, trial: int | None, reason: str) -> None:
        assert self.tuner is not None
        try:
            self.guardrails.rollback(reason, trial=trial, last_good=self.tuner.last_good())
            self._config_changed()
        except ActuationError as exc:
            log_event("rollback_failed", trial=trial, error=str(exc))
