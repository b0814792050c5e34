"""The demo's taps on the tuner it builds: the twin search's trials recorded for the optuna
chart, and a known-bad configuration put first in the warm start (`--inject-regression`)."""
from __future__ import annotations

from collections.abc import Callable

from contracts.knobs import Knobs
from tuners.evaluators import TwinEvaluator
from tuners.objective import Evaluation
from tuners.planning.warmstart import WarmStart


class RecordingEvaluator:
    """Wraps the twin evaluator of the warm start so its trials reach the optuna chart."""

    def __init__(self, inner: TwinEvaluator, sink: Callable[[Evaluation], None]) -> None:
        self.inner = inner
        self.sink = sink

    def start(self, candidate, now):
        return self.inner.start(candidate, now)

    def poll(self, now):
        ev = self.inner.poll(now)
        if ev is not None:
            self.sink(ev)
        return ev


class InjectingWarmStart:
    """The twin warm start, with a known-bad configuration put first until a trial has tried it
    (shows the rollback; a plan discarded before its first trial, e.g. by a drift alarm, keeps it)."""

    def __init__(self, inner: WarmStart, bad: Knobs | None, on_candidates: Callable[[list[Knobs]], None],
                 on_start: Callable[[], None], tried: Callable[[Knobs], bool]) -> None:
        self.on_start = on_start
        self.inner = inner
        self.bad = bad
        self.on_candidates = on_candidates
        self.tried = tried

    def candidates(self, k: int) -> list[Knobs]:
        self.on_start()
        out = self.inner.candidates(k)
        if self.bad is not None and self.tried(self.bad):
            self.bad = None
        if self.bad is not None:
            out = [self.bad] + [c for c in out if c != self.bad]
        self.on_candidates(out)
        return out


__all__ = ["InjectingWarmStart", "RecordingEvaluator"]
