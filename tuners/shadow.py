"""The shadow tuner's record: every plan it made, what the live tuner would have done with each
priced move, and, once the fleet's configuration changes (by anyone), how its prediction for that
change compares with what happened.

`ShadowLog.update(now)` (the agent's `shadow` job) does three things:

1. takes the plans the planner made since the last call (`TransitionPlanner.history`): each
   priced move is recorded with its verdict and what a live tuner with `tuner.apply` would do:
   `apply` (accepted, inside the scope), `propose` (accepted, outside it: a restart under `hot`)
   or `decline` (the plan's own reason);
2. reads the running configuration (`running()`); when it differs from the last one read, a
   change is opened: the TTFT of the `window_s` before it is read from the store, and the latest
   plan made from the old configuration that priced the new one gives the prediction (None if no
   plan priced it: the change is scored as unpriced);
3. once `settle_s + window_s` have passed since a change, the TTFT after it is read and the
   change is scored: measured relative p95 and p50 gains against the predicted steady p95 gain
   (memory price added back: TTFT only) and its verdict.

Everything is bounded (`keep` plans and scores in memory); with `log`, every plan line and score
is also written as one JSON line, the record of a weeks-long shadow run. The collector exports
the `tierpilot_tuner_shadow_*` families.
"""
from __future__ import annotations

import dataclasses
import math
import threading
from collections import Counter, deque
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, Protocol

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from contracts.knobs import Knobs
from tuners.objective import TtftObservations
from tuners.proposals import held_back

VERDICTS = ("apply", "propose", "decline")


class TtftSource(Protocol):
    def ttft_observations(self, since: float, until: float) -> TtftObservations | None:
        ...


@dataclasses.dataclass(frozen=True)
class ShadowMove:
    """One priced move of one plan, with what a live tuner would have done with it."""

    at: float
    current: Knobs
    knobs: Knobs
    would: str  # apply | propose | decline
    line: Mapping[str, Any]  # the planner's priced line (gain per hour, cost, payback, verdict, reason)

    def to_dict(self) -> dict[str, Any]:
        return {"at": self.at, "changes": {k: [a, b] for k, (a, b) in self.current.diff(self.knobs).items()},
                "would": self.would, **{k: v for k, v in self.line.items() if k != "knobs"}}


@dataclasses.dataclass
class ShadowScore:
    """A change of the running configuration, and (once measured) how it went against the prediction."""

    at: float
    before: Knobs
    after: Knobs
    predicted: Mapping[str, Any] | None  # the priced line, None: no plan priced this change
    before_p95_s: float = math.nan
    before_p50_s: float = math.nan
    before_requests: int = 0
    after_p95_s: float = math.nan
    after_p50_s: float = math.nan
    after_requests: int = 0
    scored_at: float | None = None

    @property
    def predicted_gain_p95(self) -> float | None:
        """The planner's steady p95 gain for the move, TTFT only (its memory price added back)."""
        if not self.predicted or self.predicted.get("steady_gain_p95") is None:
            return None
        return float(self.predicted["steady_gain_p95"]) + float(self.predicted.get("memory_p95") or 0.0)

    @property
    def measured_gain_p95(self) -> float:
        return 1.0 - self.after_p95_s / self.before_p95_s if self.before_p95_s > 0 else math.nan

    @property
    def measured_gain_p50(self) -> float:
        return 1.0 - self.after_p50_s / self.before_p50_s if self.before_p50_s > 0 else math.nan

    @property
    def outcome(self) -> str:
        """pending | unmeasured (too few requests on a side) | unpriced | scored."""
        if self.scored_at is None:
            return "pending"
        if not math.isfinite(self.measured_gain_p95):
            return "unmeasured"
        return "unpriced" if self.predicted_gain_p95 is None else "scored"

    @property
    def error_p95(self) -> float | None:
        """Measured minus predicted p95 gain (0: the prediction was right; -0.05: 5 points too hopeful)."""
        pred = self.predicted_gain_p95
        if pred is None or not math.isfinite(self.measured_gain_p95):
            return None
        return self.measured_gain_p95 - pred

    def to_dict(self) -> dict[str, Any]:
        def num(x: float | None) -> float | None:
            return round(x, 4) if x is not None and math.isfinite(x) else None

        return {"at": self.at, "scored_at": self.scored_at, "outcome": self.outcome,
                "changes": {k: [a, b] for k, (a, b) in self.before.diff(self.after).items()},
                "predicted_gain_p95": num(self.predicted_gain_p95),
                "predicted_verdict": self.predicted.get("verdict") if self.predicted else None,
                "measured_gain_p95": num(self.measured_gain_p95), "measured_gain_p50": num(self.measured_gain_p50),
                "error_p95": num(self.error_p95), "before_p95_s": num(self.before_p95_s),
                "after_p95_s": num(self.after_p95_s), "requests": [self.before_requests, self.after_requests]}


class ShadowLog(Collector):
    """See the module docstring. `plans`: the planner's plan history (a growing list of dicts);
    `priced`: the planner's lookup of the latest priced line for a move, used for a change."""

    collector_name = "tuner_shadow"

    def __init__(self, *, scope: str, plans: Sequence[Mapping[str, Any]], running: Callable[[], Knobs],
                 ttft: TtftSource, settle_s: float, window_s: float, min_requests: int = 30,
                 keep: int = 500, log: Callable[[str, Mapping[str, Any]], None] | None = None,
                 target: str = "default") -> None:
        self.scope = scope
        self._plans = plans
        self._running = running
        self._ttft = ttft
        self.settle_s, self.window_s, self.min_requests = settle_s, window_s, min_requests
        self._log = log or (lambda _kind, _rec: None)
        self.target = target
        self._lock = threading.Lock()
        self._seen = 0
        self.moves: deque[ShadowMove] = deque(maxlen=keep)
        self.scores: deque[ShadowScore] = deque(maxlen=keep)
        self._open: list[ShadowScore] = []
        self._would: Counter[str] = Counter({v: 0 for v in VERDICTS})
        self._outcomes: Counter[str] = Counter({o: 0 for o in ("scored", "unpriced", "unmeasured")})
        self._plans_made = 0
        self._last: Knobs | None = None

    # -- the job ------------------------------------------------------------------------------
    def update(self, now: float) -> int:
        """Take new plans, notice a configuration change, score the changes that have matured.
        Returns the number of records written (plans' moves + changes + scores)."""
        n = self._take_plans()
        try:
            running = self._running()
        except Exception as exc:  # noqa: BLE001 - a reader that fails skips this look, says why
            self._log("running_unreadable", {"at": now, "error": f"{type(exc).__name__}: {exc}"})
            running = None
        if running is not None:
            if self._last is not None and running != self._last:
                self._open_change(self._last, running, now)
                n += 1
            self._last = running
        for change in [c for c in self._open if now >= c.at + self.settle_s + self.window_s]:
            self._score(change, now)
            n += 1
        return n

    def _take_plans(self) -> int:
        new = list(self._plans[self._seen:])
        self._seen += len(new)
        n = 0
        for plan in new:
            at = float(plan.get("at") or 0.0)
            current = Knobs.from_mapping(plan["current"], source="plan")
            with self._lock:
                self._plans_made += 1
            self._log("plan", {"at": at, "current": plan["current"], "plan": plan.get("plan"),
                               "horizon": plan.get("horizon"), "deferred": plan.get("restarts_deferred")})
            for line in plan.get("priced") or ():
                knobs = current.replace(**{k: b for k, (_a, b) in dict(line.get("knobs") or {}).items()})
                would = ("decline" if line.get("verdict") != "apply"
                         else "propose" if held_back(self.scope, current, knobs) else "apply")
                move = ShadowMove(at, current, knobs, would, line)
                with self._lock:
                    self.moves.append(move)
                    self._would[would] += 1
                self._log("move", move.to_dict())
                n += 1
        return n

    def _prediction(self, before: Knobs, after: Knobs) -> Mapping[str, Any] | None:
        with self._lock:
            moves = list(self.moves)
        for move in reversed(moves):
            if move.current == before and move.knobs == after:
                return move.line
        return None

    def _open_change(self, before: Knobs, after: Knobs, now: float) -> None:
        change = ShadowScore(now, before, after, self._prediction(before, after))
        obs = self._ttft.ttft_observations(now - self.window_s, now)
        if obs is not None and obs.count >= self.min_requests:
            change.before_p95_s, change.before_p50_s = obs.quantile(0.95), obs.quantile(0.5)
        change.before_requests = obs.count if obs is not None else 0
        self._open.append(change)
        self._log("config_change", change.to_dict())

    def _score(self, change: ShadowScore, now: float) -> None:
        since = change.at + self.settle_s
        obs = self._ttft.ttft_observations(since, since + self.window_s)
        if obs is not None and obs.count >= self.min_requests:
            change.after_p95_s, change.after_p50_s = obs.quantile(0.95), obs.quantile(0.5)
        change.after_requests = obs.count if obs is not None else 0
        change.scored_at = now
        self._open.remove(change)
        with self._lock:
            self.scores.append(change)
            self._outcomes[change.outcome] += 1
        self._log("score", change.to_dict())

    # -- reads --------------------------------------------------------------------------------
    def summary(self, recent: int = 5) -> dict[str, Any]:
        """/healthz `info.tuner_shadow`: counts, the latest plan's moves, the latest scores."""
        with self._lock:
            moves, scores, would = list(self.moves), list(self.scores), dict(self._would)
            plans, outcomes = self._plans_made, dict(self._outcomes)
        latest_at = moves[-1].at if moves else None
        return {"apply": self.scope, "plans": plans, "moves": would, "changes_scored": outcomes,
                "pending_changes": len(self._open), "running": self._last.to_dict() if self._last else None,
                "latest_plan": [m.to_dict() for m in moves if m.at == latest_at],
                "scores": [s.to_dict() for s in scores[-recent:]]}

    # -- Collector ----------------------------------------------------------------------------
    def describe(self) -> Iterable[Metric]:
        return []

    def collect(self) -> Iterable[Metric]:
        with self._lock:
            moves, scores, would = list(self.moves), list(self.scores), dict(self._would)
            plans, outcomes = self._plans_made, dict(self._outcomes)
        t = self.target
        fam = CounterMetricFamily("tierpilot_tuner_shadow_plans", "Plans the shadow tuner made.", labels=["workload"])
        fam.add_metric([t], plans)
        yield fam
        fam = CounterMetricFamily("tierpilot_tuner_shadow_moves", "Moves the shadow tuner priced, by what a live "
                                  "tuner with tuner.apply would have done: apply, propose (outside tuner.apply) "
                                  "or decline.", labels=["workload", "would"])
        for would_, n in sorted(would.items()):
            fam.add_metric([t, would_], n)
        yield fam
        fam = CounterMetricFamily("tierpilot_tuner_shadow_changes_scored", "Changes of the running configuration "
                                  "the shadow tuner scored, by outcome: scored (it had priced the change), "
                                  "unpriced (no plan priced it), unmeasured (too few requests).",
                                  labels=["workload", "outcome"])
        for outcome, n in sorted(outcomes.items()):
            fam.add_metric([t, outcome], n)
        yield fam
        best = next((m for m in reversed(moves) if m.would != "decline"), None)
        if best is not None:
            for name, key, doc in (
                ("tierpilot_tuner_shadow_predicted_gain_per_hour_seconds", "gain_per_hour_s",
                 "The latest move the shadow tuner would make: predicted steady gain, TTFT seconds saved per hour."),
                ("tierpilot_tuner_shadow_transition_cost_seconds", "transition_cost_s",
                 "The latest move the shadow tuner would make: predicted transition cost, TTFT seconds."),
            ):
                value = best.line.get(key)
                if isinstance(value, (int, float)) and math.isfinite(value):
                    g = GaugeMetricFamily(name, doc, labels=["workload", "would"])
                    g.add_metric([t, best.would], float(value))
                    yield g
        scored = [s for s in scores if s.outcome in ("scored", "unpriced")]
        if scored:
            last = scored[-1]
            g = GaugeMetricFamily("tierpilot_tuner_shadow_measured_gain_ratio", "The latest scored change: measured "
                                  "relative TTFT p95 gain (1 - after / before).", labels=["workload"])
            g.add_metric([t], last.measured_gain_p95)
            yield g
            if last.error_p95 is not None:
                g = GaugeMetricFamily("tierpilot_tuner_shadow_prediction_error_ratio", "The latest scored change: "
                                      "measured minus predicted relative TTFT p95 gain.", labels=["workload"])
                g.add_metric([t], last.error_p95)
                yield g


__all__ = ["VERDICTS", "ShadowLog", "ShadowMove", "ShadowScore"]
