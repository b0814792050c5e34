"""The live evaluator: apply through the guardrails, wait for rollout and settle, measure a window.

What it needs from the agent is the small `WindowSource` protocol below; the agent's window
store (agent/collect/store.py) or the demo satisfies it. Time is whatever clock the caller passes to
`start`/`poll`, so tests drive it with fake time and nothing here sleeps.

Timeline of one trial: `start` applies the candidate (the actuator returns once the rollout
completed) at t0; the window is [t0 + settle_s, t0 + settle_s + window_s]; `poll` returns None
until `now` passes the window end, then reads the window. With fewer than `min_requests`
observations it extends the window (up to `max_extensions` times), then fails the trial.
"""
from __future__ import annotations

import dataclasses
import math
from typing import Protocol, runtime_checkable

from contracts.knobs import Knobs
from tuners.base import Candidate
from tuners.evaluators import StartResult
from tuners.guardrails import Guardrails
from tuners.objective import Evaluation, TtftObservations
from tuners.space.limits import memory_cost_gib


@runtime_checkable
class WindowSource(Protocol):
    """Read access to the agent's rolling window of normalised samples."""

    def ttft_observations(self, since: float, until: float) -> TtftObservations | None:
        """TTFT over [since, until): raw samples, or per-bucket deltas of the TTFT histogram
        (fleet-wide, same bucket bounds for every window). None if nothing was recorded."""
        ...

    def cumulative_hit_ratio(self, since: float, until: float) -> float | None:
        """Hit tokens / lookup tokens over all tiers in [since, until), or None."""
        ...


@dataclasses.dataclass(frozen=True, kw_only=True)
class LiveSettings:
    """settle_s: wait after the rollout before measuring (caches warm up).
    window_s: evaluation window. min_requests: fewer observations -> extend the window.
    max_extensions: extra windows before the trial fails for lack of traffic."""

    settle_s: float
    window_s: float
    min_requests: int
    max_extensions: int

    def __post_init__(self) -> None:
        if self.settle_s < 0 or self.window_s <= 0:
            raise ValueError("live.settle_s must be >= 0 and live.window_s > 0")


class InsufficientTraffic(RuntimeError):
    """The window (and its extensions) saw too few requests to judge the trial."""


@dataclasses.dataclass
class _Pending:
    trial: int | None  # None = baseline measurement of the running configuration
    knobs: Knobs
    window_start: float
    window_end: float
    extensions: int = 0


@dataclasses.dataclass(frozen=True)
class LiveResult:
    trial: int | None
    knobs: Knobs
    evaluation: Evaluation
    since: float
    until: float


class LiveEvaluator:
    """Evaluates one candidate at a time on the live fleet."""

    def __init__(self, guardrails: Guardrails, source: WindowSource, settings: LiveSettings) -> None:
        self.guardrails = guardrails
        self.source = source
        self.settings = settings
        self.pending: _Pending | None = None
        self.last: LiveResult | None = None

    # -- Evaluator protocol ------------------------------------------------------------------
    def start(self, candidate: Candidate, now: float) -> StartResult:
        """Apply `candidate` through the guardrails; on success the measurement window begins."""
        if self.pending is not None:
            return StartResult("blocked", "a live evaluation is already in flight")
        outcome = self.guardrails.apply(candidate.knobs, trial=candidate.number, now=now)
        if outcome.status in ("applied", "unchanged"):
            self._begin(candidate.number, outcome.result.knobs if outcome.result else candidate.knobs, now)
            return StartResult("started", outcome.message)
        return StartResult(outcome.status, outcome.message, outcome.retry_after_s, outcome.permanent)

    def poll(self, now: float) -> Evaluation | None:
        result = self.poll_result(now)
        return result.evaluation if result else None

    # -- richer API used by the controller ---------------------------------------------------
    def start_baseline(self, knobs: Knobs, now: float) -> None:
        """Measure the running configuration (nothing is applied)."""
        self._begin(None, knobs, now, settle=False)

    def poll_result(self, now: float) -> LiveResult | None:
        """The finished measurement, or None while settling/measuring. Raises InsufficientTraffic."""
        p = self.pending
        if p is None or now < p.window_end:
            return None
        obs = self.source.ttft_observations(p.window_start, p.window_end)
        if obs is None or obs.count < self.settings.min_requests:
            if p.extensions < self.settings.max_extensions:
                p.extensions += 1
                p.window_end += self.settings.window_s
                return None
            self.pending = None
            seen = 0 if obs is None else obs.count
            raise InsufficientTraffic(
                f"only {seen} TTFT observations in {p.window_end - p.window_start:g} s "
                f"(need {self.settings.min_requests})")
        hit = self.source.cumulative_hit_ratio(p.window_start, p.window_end)
        ev = Evaluation(
            ttft_p50_s=obs.quantile(0.5), ttft_p95_s=obs.quantile(0.95),
            hit_ratio=math.nan if hit is None else float(hit),
            memory_gib=memory_cost_gib(p.knobs, self.guardrails.space.limits),
            requests=obs.count, ttft=obs, source="live")
        self.pending = None
        self.last = LiveResult(p.trial, p.knobs, ev, p.window_start, p.window_end)
        return self.last

    def abort(self) -> _Pending | None:
        """Drop the measurement in flight (e.g. on drift). Returns what was dropped."""
        p, self.pending = self.pending, None
        return p

    def _begin(self, trial: int | None, knobs: Knobs, now: float, *, settle: bool = True) -> None:
        start = now + (self.settings.settle_s if settle else 0.0)
        self.pending = _Pending(trial, knobs, start, start + self.settings.window_s)
