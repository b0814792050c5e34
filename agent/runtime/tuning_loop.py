"""The `tune_step` job: one tuning-controller step per tick, on the leader only.

A replica that does not hold the Lease runs scrape and export only: it builds no controller and
touches nothing. Each time this replica becomes the leader a new term starts: a fresh
`TuningController` is made, `resume(now)` reopens the latest phase from the study storage (fails
this replica's trials left in flight, re-applies the last good configuration), and steps follow.
Losing the Lease ends the term: a measurement in flight is dropped (the next leader's `resume`
restores the last good configuration) and the guardrails' in-flight slot is freed.
The guardrails (cooldown, hourly cap) are shared across terms, so a flapping Lease cannot
multiply changes.

A sharded leader reads the fleet from every shard (FleetStore, FleetOverlap). When a shard does
not answer the signals read raises `PartialFleetError` and the cycle is skipped: no drift check,
no measurement, no decision on part of the fleet; a trial in flight keeps its fixed window and is
read on a later step (`step_errors_total{kind="partial_fleet"}`, /healthz `tuner`). A shard that
fails between that read and the controller's own reads makes the step raise like any other
failure below (the trial in flight is rolled back): never a partial fleet taken for the whole.

Every path out of a trial frees the guardrails' in-flight slot. A step that raises (the study
storage is down, or anything unexpected) fails the trial in flight: the measurement is dropped, the
candidate is rolled back to the last good configuration at once (through the actuator, which does
not need the storage), the slot is freed, the failure is counted
(`tierpilot_tuner_step_errors_total{kind="storage"|"other"}`) and shown in /healthz (`tuner`
check), and the term ends; the next step starts a new term whose `resume` (once the storage
answers again) marks the orphaned trial failed and re-applies the last good configuration if the
target runs anything else. `shutdown()` (SIGTERM) does the same for a trial in flight, within a
time budget, so the candidate never outlives the agent.
"""
from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Mapping

from contracts.fleet import PartialFleetError
from contracts.redact import redact_text
from tuners.controller import StepReport, TuningController
from tuners.guardrails import Guardrails
from tuners.storage_errors import is_storage_error, one_line

log = logging.getLogger("tierpilot.runtime")
QUIET_STATES = frozenset({"measuring", "holding", "blocked", "baseline", "retry", "planning"})


class TuningLoop:
    """Leader-gated driver of a `TuningController`; `step()` is the scheduler's job body."""

    def __init__(self, make_controller: Callable[[], TuningController],
                 signals: Callable[[], Mapping[str, float]], *, clock: Callable[[], float],
                 guardrails: Guardrails, is_leader: Callable[[], bool] | None = None,
                 on_report: Callable[[StepReport], None] | None = None) -> None:
        self.make_controller = make_controller
        self.signals = signals
        self.clock = clock
        self.guardrails = guardrails
        self.is_leader = is_leader
        self.on_report = on_report
        self.controller: TuningController | None = None
        self.terms = 0
        self.state = "idle"
        self.last_report: StepReport | None = None
        self.problem: str | None = None  # why the last step failed (None: it worked)
        self.errors: dict[str, int] = {"storage": 0, "other": 0}
        self._lock = threading.Lock()

    @property
    def leading(self) -> bool:
        return self.is_leader is None or self.is_leader()

    def step(self) -> StepReport | None:
        """One tick: None on a standby, else the controller's report."""
        with self._lock:
            now = self.clock()
            if not self.leading:
                if self.controller is not None:
                    self._end_term("this replica lost the Lease")
                self.state = "standby"
                return None
            try:
                if self.controller is None:
                    self.controller = self.make_controller()
                    self.terms += 1
                    log.info("tuning: leader term %d starts; resuming from the study storage", self.terms)
                    # with a Lease, this replica is the only one acting: it adopts trials left in flight
                    self.controller.resume(now, adopt=self.is_leader is not None)
                try:
                    signals = self.signals()
                except PartialFleetError as exc:  # a shard did not answer: no step on part of the fleet
                    report = self._partial_fleet(now, exc)
                else:
                    report = self.controller.step(now, signals)
                    self.problem = None
            except Exception as exc:  # noqa: BLE001 - every path out of a trial must free the slot
                report = self._step_failed(now, exc)
            self.state = report.state
            self.last_report = report
        level = logging.DEBUG if report.state in QUIET_STATES else logging.INFO
        log.log(level, "tuning step: phase=%d state=%s trial=%s %s", report.phase, report.state,
                report.trial, report.message)
        if self.on_report is not None:
            self.on_report(report)
        return report

    def health(self) -> str | None:
        """For /healthz: None when the last step worked, else why it failed."""
        return self.problem

    def shutdown(self, timeout_s: float = 10.0) -> None:
        """The agent is stopping (SIGTERM): roll a trial in flight back and free the slot, waiting
        at most `timeout_s` for a step in progress. The trial stays unfinished in the storage; the
        next start's `resume` marks it failed."""
        if not self._lock.acquire(timeout=timeout_s):
            log.error("tuning: a step is still running after %gs; the next start restores the last good "
                      "configuration", timeout_s)
            return
        try:
            if self.guardrails.in_flight is not None or (self.controller is not None
                                                          and self.controller.evaluator.pending is not None):
                self._abandon("the agent is stopping")
            self.controller = None
            self.state = "stopped"
        finally:
            self._lock.release()

    def _partial_fleet(self, now: float, exc: PartialFleetError) -> StepReport:
        """A sharded leader's fleet read left a shard out: this cycle is skipped (nothing is
        measured, decided or applied; a trial in flight keeps its window and is read on a later
        step), counted as `step_errors_total{kind="partial_fleet"}` and shown in /healthz."""
        self.errors["partial_fleet"] = self.errors.get("partial_fleet", 0) + 1
        count = getattr(self.guardrails.metrics, "step_error", None)
        if count is not None:
            count("partial_fleet")
        message = redact_text(str(exc).strip().splitlines()[0])[:300]  # PartialFleetError names peer and reason
        self.problem = f"fleet view partial, cycle skipped: {message}"
        log.warning("tuning: %s", self.problem)
        phase = self.controller.phase if self.controller is not None else -1
        return StepReport(now, phase, "partial_fleet", None, message)

    def _step_failed(self, now: float, exc: Exception) -> StepReport:
        kind = "storage" if is_storage_error(exc) else "other"
        message = one_line(exc)
        self.errors[kind] += 1
        count = getattr(self.guardrails.metrics, "step_error", None)
        if count is not None:
            count(kind)
        self.problem = (f"study storage unavailable: {message}" if kind == "storage"
                        else f"tuning step failed: {message}")
        log.error("tuning: %s; the trial in flight (if any) fails and is rolled back", self.problem)
        trial = self._abandon(self.problem)
        phase = self.controller.phase if self.controller is not None else -1
        self.controller = None  # the next step resumes from the storage (when it answers again)
        return StepReport(now, phase, "storage_unavailable" if kind == "storage" else "error", trial, message)

    def _abandon(self, reason: str) -> int | None:
        """Drop the measurement in flight, roll the candidate back, free the slot; never raises."""
        if self.controller is not None:
            self.controller.evaluator.abort()
            self.controller.candidate = None
        trial = self.guardrails.in_flight
        if trial is None:
            return None
        try:
            self.guardrails.rollback(reason, trial=trial)
        except Exception as exc:  # noqa: BLE001 - resume re-applies the last good later
            log.error("tuning: rollback of trial %s failed (%s); the next resume re-applies the last good "
                      "configuration", trial, one_line(exc))
        finally:
            self.guardrails.finish(trial)
        return trial

    def _end_term(self, reason: str) -> None:
        ctl = self.controller
        assert ctl is not None
        dropped = ctl.evaluator.abort()
        in_flight = self.guardrails.in_flight
        if in_flight is not None:
            self.guardrails.finish(in_flight)
        log.warning("tuning: %s; term %d ends (dropped %s)", reason, self.terms,
                    "a measurement in flight" if dropped is not None else "nothing in flight")
        self.controller = None
