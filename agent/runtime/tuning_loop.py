"""The `tune_step` job: one tuning-controller step per tick, on the leader only.

A replica that does not hold the Lease runs scrape and export only: it builds no controller and
touches nothing. Each time this replica becomes the leader a new term starts: a fresh
`TuningController` is made, `resume(now)` reopens the latest phase from the study storage (fails
this replica's trials left in flight, re-applies the last good configuration), and steps follow.
Losing the Lease ends the term: a measurement in flight is dropped (the next leader's `resume`
restores the last good configuration) and the guardrails' in-flight slot is freed.
The guardrails (cooldown, hourly cap) are shared across terms, so a flapping Lease cannot
multiply changes.
"""
from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Mapping

from tuners.controller import StepReport, TuningController
from tuners.guardrails import Guardrails

log = logging.getLogger("tierpilot.runtime")
QUIET_STATES = frozenset({"measuring", "holding", "blocked", "baseline", "retry"})


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
            if self.controller is None:
                self.controller = self.make_controller()
                self.terms += 1
                log.info("tuning: leader term %d starts; resuming from the study storage", self.terms)
                self.controller.resume(now)
            report = self.controller.step(now, self.signals())
            self.state = report.state
            self.last_report = report
        level = logging.DEBUG if report.state in QUIET_STATES else logging.INFO
        log.log(level, "tuning step: phase=%d state=%s trial=%s %s", report.phase, report.state,
                report.trial, report.message)
        if self.on_report is not None:
            self.on_report(report)
        return report

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
