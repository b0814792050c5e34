"""What `/healthz` (liveness) and `/readyz` (readiness) answer: a pure verdict from a few facts.

- live: the scheduler runs and the last completed scrape cycle (or the start, before the first
  cycle) is at most `STALE_INTERVALS` scrape intervals old. A stuck cycle, a paused or stopped
  scheduler, turns it false, so the kubelet restarts the pod (what TierpilotAgentStale's runbook
  asks a human to do).
- ready: live, and at least one scrape cycle completed (so the first /metrics is not empty).

All times are from one monotonic clock (never the agent's data clock, which tests may drive).
"""
from __future__ import annotations

from dataclasses import dataclass

STALE_INTERVALS = 3.0  # how many scrape intervals without a completed cycle is "stuck"
MIN_STALE_S = 1.0  # floor, so a very short interval cannot flap


@dataclass(frozen=True, slots=True)
class Health:
    live: bool
    ready: bool
    reason: str
    cycles: int
    last_cycle_age_s: float | None

    def as_json(self) -> dict[str, object]:
        return {"ok": self.live, "ready": self.ready, "reason": self.reason, "cycles": self.cycles,
                "last_cycle_age_s": None if self.last_cycle_age_s is None else round(self.last_cycle_age_s, 3)}


def stale_after_s(interval_s: float, intervals: float = STALE_INTERVALS) -> float:
    return max(interval_s * intervals, MIN_STALE_S)


def judge(*, now: float, started_at: float | None, last_cycle_at: float | None, cycles: int,
          interval_s: float, scheduler_running: bool, intervals: float = STALE_INTERVALS) -> Health:
    """The verdict at `now` (monotonic seconds)."""
    age = None if last_cycle_at is None else now - last_cycle_at
    if started_at is None or not scheduler_running:
        return Health(False, False, "scheduler not running", cycles, age)
    limit = stale_after_s(interval_s, intervals)
    since = now - (last_cycle_at if last_cycle_at is not None else started_at)
    if since > limit:
        what = "last completed scrape cycle" if last_cycle_at is not None else "start, and no scrape cycle completed"
        return Health(False, False, f"stale: {since:.1f}s since the {what} (limit {limit:g}s)", cycles, age)
    if last_cycle_at is None:
        return Health(True, False, "waiting for the first scrape cycle", cycles, age)
    return Health(True, True, "ok", cycles, age)
