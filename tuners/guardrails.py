"""Guardrails: nothing unsafe reaches a cluster.

`Guardrails` wraps an `Actuator` (the only way a change leaves the tuner) and enforces:

- validation against the deployment limits before anything is applied;
- one change in flight at a time;
- a cooldown after each change and a cap on changes per rolling hour, timed on a monotonic clock
  when one is given (`monotonic=`): a wall-clock jump neither ends a cooldown early nor blocks
  changes for the length of the jump (without it, the `now` passed in times them);
- immediate rollback to the last good configuration (`rollback`) when `judge` finds a trial
  statistically worse (see `tuners.stats`);
- dry-run: proposals are validated, logged and counted, the actuator is asked for a dry-run
  only, and nothing changes;
- the apply scope (`apply`: none | hot | all, tuners/proposals.py): a change outside it is not
  applied but recorded in the `ProposalBook` for a person to apply (status `proposed`).

Each proposal, apply and rollback is one structured log line and a `TunerMetrics` count.
"""
from __future__ import annotations

import collections
import dataclasses
import time
from collections.abc import Callable

from contracts.actuator import (
    ActuationError,
    Actuator,
    ApplyResult,
    PermanentActuationError,
    RefusedConfigError,
    RetriableActuationError,
    RolloutTimeoutError,
)
from contracts.knobs import Knobs
from tuners.logline import log_event
from tuners.metrics import TunerMetrics
from tuners.objective import TtftObservations
from tuners.proposals import APPLY_SCOPES, ApplyScope, Proposal, ProposalBook, held_back
from tuners.space import SearchSpace
from tuners.space.limits import CandidateError
from tuners.stats import RegressionSettings, Verdict, judge

HOUR_S = 3600.0


@dataclasses.dataclass(frozen=True, kw_only=True)
class GuardrailSettings:
    """cooldown_s: minimum time between two changes. max_changes_per_hour: rolling-hour cap.
    dry_run: propose and log, apply nothing. regression: the statistical regression test.
    apply: what may be applied without a person (tuners/proposals.py): none, hot (the router's
    knobs only) or all (restart-requiring changes too)."""

    cooldown_s: float
    max_changes_per_hour: int
    dry_run: bool
    apply: ApplyScope
    regression: RegressionSettings

    def __post_init__(self) -> None:
        if self.cooldown_s < 0:
            raise ValueError(f"guardrails.cooldown_s: must be >= 0, got {self.cooldown_s}")
        if self.max_changes_per_hour < 1:
            raise ValueError(f"guardrails.max_changes_per_hour: must be >= 1, got {self.max_changes_per_hour}")
        if self.apply not in APPLY_SCOPES:
            raise ValueError(f"tuner.apply: {self.apply!r}; valid: {', '.join(APPLY_SCOPES)}")


@dataclasses.dataclass(frozen=True)
class ApplyOutcome:
    """What `Guardrails.apply` did. status: applied | dry_run | unchanged | retry | failed | rejected |
    proposed (outside the apply scope: recorded as `proposal`, nothing written)."""

    status: str
    result: ApplyResult | None = None
    message: str = ""
    retry_after_s: float = 0.0
    permanent: bool = False
    proposal: Proposal | None = None


class Guardrails:
    """Every change and rollback goes through here."""

    def __init__(self, actuator: Actuator, space: SearchSpace, metrics: TunerMetrics,
                 settings: GuardrailSettings, *,
                 clock: Callable[[], float] = time.time,
                 monotonic: Callable[[], float] | None = None, proposals: ProposalBook | None = None) -> None:
        self.actuator = actuator
        self.space = space
        self.metrics = metrics
        self.settings = settings
        self.clock = clock
        self.monotonic = monotonic  # times cooldown and the hourly cap when given
        self.proposals = proposals if proposals is not None else ProposalBook(settings.apply)
        self.in_flight: int | None = None  # trial number currently applied and under evaluation
        self._changes: collections.deque[float] = collections.deque()
        self._last_change: float | None = None
        metrics.set_dry_run(settings.dry_run)

    # -- gate --------------------------------------------------------------------------------
    def blocked(self, now: float | None = None) -> str | None:
        """Why a new change may not start now (in_flight | cooldown | hourly_cap), or None."""
        now = self._timer(self.clock() if now is None else now)
        while self._changes and self._changes[0] <= now - HOUR_S:
            self._changes.popleft()
        if self.in_flight is not None:
            return "in_flight"
        if self._last_change is not None and now - self._last_change < self.settings.cooldown_s:
            return "cooldown"
        if len(self._changes) >= self.settings.max_changes_per_hour:
            return "hourly_cap"
        return None

    def next_allowed(self, now: float) -> float:
        """Earliest time a change could start (ignoring an in-flight trial), on `now`'s clock."""
        timer_now = self._timer(now)
        t = timer_now
        if self._last_change is not None:
            t = max(t, self._last_change + self.settings.cooldown_s)
        if len(self._changes) >= self.settings.max_changes_per_hour:
            t = max(t, self._changes[-self.settings.max_changes_per_hour] + HOUR_S)
        return now + (t - timer_now)

    # -- apply -------------------------------------------------------------------------------
    def apply(self, knobs: Knobs, *, trial: int, now: float | None = None) -> ApplyOutcome:
        """Validate, then apply (or dry-run) `knobs` for `trial`. Never raises ActuationError."""
        now = self.clock() if now is None else now
        reason = self.blocked(now)
        if reason is not None:
            self.metrics.guardrail_block(reason)
            log_event("blocked", trial=trial, reason=reason)
            return ApplyOutcome("blocked", message=reason, retry_after_s=max(0.0, self.next_allowed(now) - now))
        try:
            self.space.validate(knobs)
        except CandidateError as exc:
            self.metrics.guardrail_block("invalid")
            self.metrics.actuation("rejected")
            log_event("rejected", trial=trial, knobs=knobs, error=str(exc))
            return ApplyOutcome("rejected", message=str(exc))
        dry = self.settings.dry_run
        current = self._current_or_none()
        held = held_back(self.settings.apply, current if current is not None else self.space.fixed, knobs)
        if held:  # outside the apply scope: a person decides (the cooldown and cap are not spent)
            proposal = self.proposals.record(current if current is not None else self.space.fixed, knobs, held,
                                             at=now)
            log_event("proposed", trial=trial, id=proposal.id, knobs=knobs, restarts=list(proposal.restarts),
                      reason=held, plan=proposal.plan)
            return ApplyOutcome("proposed", message=proposal.describe(), proposal=proposal)
        log_event("proposal", trial=trial, knobs=knobs, dry_run=dry,
                  changed=current.diff(knobs) if current else None)
        try:
            result = self.actuator.apply(knobs, dry_run=dry)
        except RetriableActuationError as exc:
            self.metrics.actuation("retriable_error")
            log_event("apply_failed", trial=trial, error=str(exc), retriable=True, retry_after_s=exc.delay_s)
            return ApplyOutcome("retry", message=str(exc), retry_after_s=exc.delay_s)
        except RolloutTimeoutError as exc:
            self.metrics.actuation("rollout_timeout")
            log_event("apply_failed", trial=trial, error=str(exc), rollout_timeout=True)
            self._record_change(now)
            self.in_flight = trial  # something may have changed; the caller rolls back
            return ApplyOutcome("failed", message=f"rollout timed out: {exc}")
        except RefusedConfigError as exc:  # this candidate cannot be expressed; nothing was written
            self.metrics.actuation("rejected")
            log_event("rejected", trial=trial, knobs=knobs, error=str(exc))
            return ApplyOutcome("rejected", message=str(exc))
        except PermanentActuationError as exc:
            self.metrics.actuation("permanent_error")
            log_event("apply_failed", trial=trial, error=str(exc), permanent=True)
            return ApplyOutcome("failed", message=str(exc), permanent=True)
        except ActuationError as exc:
            self.metrics.actuation("retriable_error")
            log_event("apply_failed", trial=trial, error=str(exc), retriable=True)
            return ApplyOutcome("retry", message=str(exc), retry_after_s=self.settings.cooldown_s)
        self._record_change(now)
        self.in_flight = trial
        self.metrics.set_in_flight(True)
        if dry:
            self.metrics.actuation("dry_run")
            log_event("dry_run", trial=trial, knobs=knobs, message=result.message)
            return ApplyOutcome("dry_run", result)
        status = "applied" if result.applied else "unchanged"
        self.metrics.actuation(status)
        self.metrics.set_config(result.knobs)
        log_event("apply", trial=trial, knobs=result.knobs, changed=result.changed,
                  restarted=list(result.restarted), status=status)
        return ApplyOutcome(status, result)

    def finish(self, trial: int) -> None:
        """The in-flight trial is over (kept, rolled back or failed)."""
        if self.in_flight == trial:
            self.in_flight = None
            self.metrics.set_in_flight(False)

    # -- judge, rollback, mark good ----------------------------------------------------------
    def judge(self, candidate: TtftObservations, baseline: TtftObservations, *, trial: int,
              seed: int = 0) -> Verdict:
        verdict = judge(candidate, baseline, self.settings.regression, seed=seed)
        log_event("verdict", trial=trial, worse=verdict.worse, conclusive=verdict.conclusive,
                  method=verdict.method, statistic=verdict.statistic, reason=verdict.reason,
                  n_candidate=verdict.n_candidate, n_baseline=verdict.n_baseline)
        return verdict

    def rollback(self, reason: str, *, trial: int | None = None, last_good: Knobs | None = None) -> ApplyResult | None:
        """Restore the last good configuration now (no cooldown: safety first).

        Uses `actuator.rollback()`; if the actuator has no last good of its own, re-applies
        `last_good` (e.g. from study storage). In dry-run nothing was applied, so nothing is undone.
        """
        if self.settings.dry_run:
            log_event("rollback", trial=trial, reason=reason, dry_run=True)
            self.metrics.actuation("dry_run")
            return None
        if self._held(self.actuator.last_good() or last_good, f"rollback: {reason}", trial):
            return None
        try:
            if self.actuator.last_good() is None and last_good is not None:
                result = self.actuator.apply(last_good)
            else:
                result = self.actuator.rollback()
        except ActuationError as exc:
            self.metrics.actuation("permanent_error" if isinstance(exc, PermanentActuationError)
                                   else "retriable_error")
            log_event("rollback_failed", trial=trial, reason=reason, error=str(exc))
            raise
        self.metrics.actuation("rolled_back")
        self.metrics.set_config(result.knobs)
        log_event("rollback", trial=trial, reason=reason, knobs=result.knobs, changed=result.changed)
        return result

    def reapply(self, knobs: Knobs, reason: str) -> ApplyResult | None:
        """Re-apply a known good configuration (after a restart), bypassing cooldown."""
        if self.settings.dry_run:
            log_event("reapply", reason=reason, knobs=knobs, dry_run=True)
            return None
        if self._held(knobs, f"reapply: {reason}", None):
            return None
        result = self.actuator.apply(self.space.validate(knobs))
        self.metrics.actuation("reapplied")
        self.metrics.set_config(result.knobs)
        log_event("reapply", reason=reason, knobs=result.knobs, changed=result.changed)
        return result

    def mark_good(self, knobs: Knobs, *, trial: int | None = None) -> None:
        if not self.settings.dry_run:
            self.actuator.mark_good(knobs)
        self.metrics.set_last_good(knobs)
        log_event("mark_good", trial=trial, knobs=knobs, dry_run=self.settings.dry_run)

    # -- helpers -----------------------------------------------------------------------------
    def _timer(self, now: float) -> float:
        return self.monotonic() if self.monotonic is not None else now

    def _record_change(self, now: float) -> None:
        t = self._timer(now)
        self._changes.append(t)
        self._last_change = t

    def _held(self, target: Knobs | None, why: str, trial: int | None) -> bool:
        """Whether restoring `target` is outside the apply scope (then it is recorded as a proposal:
        a rollback or re-apply that restarts the engines waits for a person under `hot`)."""
        if self.settings.apply == "all" or target is None:
            return False
        current = self._current_or_none() or self.space.fixed
        held = held_back(self.settings.apply, current, target) if current != target else ""
        if held:
            proposal = self.proposals.record(current, target, held, at=self.clock())
            log_event("proposed", trial=trial, id=proposal.id, knobs=target, restarts=list(proposal.restarts),
                      reason=f"{why}; {held}")
        return bool(held)

    def _current_or_none(self) -> Knobs | None:
        try:
            return self.actuator.current()
        except ActuationError:
            return None
