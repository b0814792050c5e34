"""What `/healthz` (liveness) and `/readyz` (readiness) answer: a pure verdict from a few facts.

- live: the scheduler runs and the last completed scrape cycle (or the start, before the first
  cycle) is at most `STALE_INTERVALS` scrape intervals old. A stuck cycle, a paused or stopped
  scheduler, turns it false, so the kubelet restarts the pod (what TierpilotAgentStale's runbook
  asks a human to do).
- ready: live, and at least one scrape cycle completed (so the first /metrics is not empty).

All times are from one monotonic clock (never the agent's data clock, which tests may drive).

/healthz adds `status`: `ok`, `starting` (before the first cycle), `degraded` (live and ready, but
a component check failed: the agent is blind, every target down for `scrape.blind_after_cycles`
cycles, or an extra collector raises; `reason` says which and why) or `down` (not live, 503).
Degraded does not fail the probes: a restart brings no target back, and an agent taken out of
its Service would hide the very `tierpilot_target_up 0` series that say what is wrong.
"""
from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

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


def health_json(h: Health, checks: dict[str, str], snap: Any) -> dict[str, object]:
    """The /healthz body: the verdict, the component checks, and the targets by state."""
    degraded = sorted(k for k, v in checks.items() if v != "ok")
    out = {**h.as_json(), "snapshot_at": snap.taken_at, "checks": checks, "degraded": degraded}
    if not h.live:
        out["status"] = "down"
    elif degraded:
        out["status"] = "degraded"
        out["reason"] = "; ".join(checks[k] if k == "targets" else f"{k}: {checks[k]}" for k in degraded)
    else:
        out["status"] = "ok" if h.ready else "starting"
    down = Counter(st.reason or "down" for st in snap.targets if not st.up)
    out["targets"] = {"total": len(snap.targets), "up": sum(1 for st in snap.targets if st.up),
                      "down_by_reason": dict(sorted(down.items()))}
    return out


def component_checks(checks: Mapping[str, Callable[[], str | None]]) -> dict[str, str]:
    """/healthz `checks`: each component check's answer by name, "ok" or its problem."""
    out: dict[str, str] = {}
    for name, check in sorted(checks.items()):
        try:
            problem = check()
        except Exception as exc:  # noqa: BLE001 - a broken check is itself a problem
            problem = f"check failed: {type(exc).__name__}"
        out[name] = problem or "ok"
    return out


def component_info(info: Mapping[str, Callable[[], Any]]) -> dict[str, Any]:
    """/healthz `info`: each component's state by name (an error record when its reader raises)."""
    out: dict[str, Any] = {}
    for name, fn in sorted(info.items()):
        try:
            out[name] = fn()
        except Exception as exc:  # noqa: BLE001 - a broken reader must not break /healthz
            out[name] = {"error": f"{type(exc).__name__}"}
    return out
