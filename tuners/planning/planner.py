"""Decide on the twin what to change live, counting what getting there costs.

A live change is not free: a rolling restart empties every pod's GPU and CPU cache and takes each
pod out for a while, and a chunk-size change leaves the shared L2 unreadable until it refills.
`TransitionPlanner` (a `tuners.planning.warmstart.WarmStart`, so the controller enqueues what it returns)
prices every candidate on a twin of the recent workload (`PlanningTwin`):

- **stay**: the running configuration, warm (what the fleet will serve if nothing changes);
- **transition**: the candidate applied at the start of the evaluation window, restarts and all;
- **steady**: the candidate, warm (what the fleet serves once the transition is over).

Over the expected rest of the phase (`horizon_s`) the move serves `transition` for the length of
the window and `steady` for the rest (`horizon_outcome`); of its net gains on TTFT p95 and on the
mean (`net_gain`) the larger must clear a margin and neither may be below `-tolerance`, or the
candidate is not worth its transition.

A restart's caches refill only as fast as the workload revisits its working set, which can take
far longer than the evaluation window (a chunk-size change leaves a full L2 unreadable). When the
twin can follow the refill over a longer stretch of history (`PlanningTwin.refill`), the TTFT the
refill adds within the horizon beyond what the window already counts is charged to the move's mean
and to its transition cost (`refill_charge`).

Knobs that reload without a restart (the router) are decided on their own first, against the
running configuration; restart-requiring candidates from the twin search (`search`, e.g.
`TwinWarmStart`, with the chosen router) are then priced against that, and at most the best one
that clears `margin` follows. Nothing else is tried on the fleet.
"""
from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol

import numpy as np

from contracts.knobs import Knobs
from tuners.logline import log_event
from tuners.payoff import change_text
from tuners.planning.warmstart import WarmStart


@dataclasses.dataclass(frozen=True, kw_only=True)
class PlanSettings:
    """horizon_s: expected rest of a phase after the plan (how long a workload regime lasts).
    margin: net predicted gain (relative) a restart-requiring change needs on TTFT p95 or on the
    mean, whichever is larger. hot_margin: the same for a hot-reload change. tolerance: neither
    gain may be below -tolerance. search_k: twin-search candidates priced."""

    horizon_s: float
    margin: float
    hot_margin: float
    tolerance: float
    search_k: int

    def __post_init__(self) -> None:
        if not self.horizon_s > 0:
            raise ValueError(f"plan.horizon_s: must be > 0, got {self.horizon_s}")
        if self.margin < 0 or self.hot_margin < 0 or self.tolerance < 0:
            raise ValueError("plan.margin, plan.hot_margin and plan.tolerance must be >= 0")


class PlanningTwin(Protocol):
    """A twin of the recent workload. transition_s: length of the evaluation window."""

    transition_s: float

    def steady(self, knobs: Knobs) -> np.ndarray:
        """TTFT (s) over the evaluation window with `knobs` in force all along (warm)."""
        ...

    def switch(self, before: Knobs, after: Knobs, *, restart: bool) -> np.ndarray:
        """TTFT (s) over the evaluation window when `after` replaces `before` at its start."""
        ...

    # optional: refill(before, after, *, restart) -> (seconds since the switch, TTFT added over `after`
    # held all along) per request, over a stretch longer than the window; None if it cannot


def refill_charge(twin: PlanningTwin, before: Knobs, after: Knobs, *, restart: bool, transition: np.ndarray,
                  steady: np.ndarray, horizon_s: float) -> float:
    """TTFT seconds (summed over requests) the refill adds within the horizon beyond what the
    evaluation window counts (the window's transition over the settled candidate); 0 when the twin
    cannot follow the refill further."""
    follow = getattr(twin, "refill", None)
    got = follow(before, after, restart=restart) if follow is not None else None
    if got is None:
        return 0.0
    since, added = got
    in_window = float(transition.sum() - steady.mean() * transition.size) if transition.size and steady.size else 0.0
    return max(float(added[since < horizon_s].sum()) - in_window, 0.0)


def weighted_p95_mean(values: np.ndarray, weights: np.ndarray) -> tuple[float, float]:
    """(p95, mean) of a weighted sample (step quantile: the smallest value with >= 95% of the weight)."""
    if values.size == 0 or not weights.sum() > 0:
        return math.nan, math.nan
    order = np.argsort(values, kind="stable")
    v, w = values[order], weights[order]
    cum = np.cumsum(w) / w.sum()
    p95 = float(v[min(int(np.searchsorted(cum, 0.95)), v.size - 1)])
    return p95, float(np.average(v, weights=w))


def horizon_outcome(transition: np.ndarray, steady: np.ndarray, transition_s: float,
                    horizon_s: float) -> tuple[float, float]:
    """(p95, mean) over the horizon of a move: `transition` for its first `transition_s`, then
    `steady`. Each set's weight is its share of the horizon, spread over its requests."""
    share = min(max(transition_s, 0.0) / horizon_s, 1.0)
    parts = [(transition, share), (steady, 1.0 - share)]
    vals = [p for p, s in parts if p.size and s > 0]
    if not vals:
        return math.nan, math.nan
    weights = [np.full(p.size, s / p.size) for p, s in parts if p.size and s > 0]
    return weighted_p95_mean(np.concatenate(vals), np.concatenate(weights))


def net_gain(stay: np.ndarray, transition: np.ndarray, steady: np.ndarray, transition_s: float,
             horizon_s: float) -> tuple[float, float]:
    """Relative gain of moving over staying, on (p95, mean): 1 - move / stay (above 0: better)."""
    s95, smean = weighted_p95_mean(stay, np.ones(stay.size))
    m95, mmean = horizon_outcome(transition, steady, transition_s, horizon_s)
    return (1.0 - m95 / s95 if s95 > 0 else math.nan), (1.0 - mmean / smean if smean > 0 else math.nan)


@dataclasses.dataclass(frozen=True)
class Decision:
    """One priced candidate. gain_p95 / gain_mean: net relative gains over the horizon (memory
    price included on p95). gain_per_hour_s: TTFT seconds (summed over requests) saved per hour
    once the move has settled; transition_cost_s: TTFT seconds the transition adds over staying;
    payback_s: how long the steady gain takes to repay it (inf: never). verdict: apply / decline,
    with the reason."""

    knobs: Knobs
    restart: bool
    gain_p95: float
    gain_mean: float
    accepted: bool
    horizon_s: float = math.nan
    gain_per_hour_s: float = math.nan
    transition_cost_s: float = math.nan
    payback_s: float = math.nan
    steady_gain_p95: float = math.nan
    steady_gain_mean: float = math.nan
    reason: str = ""
    memory_p95: float = 0.0  # the memory price taken off both p95 gains (share of the p95 TTFT)

    @property
    def verdict(self) -> str:
        return "apply" if self.accepted else "decline"

    def describe(self) -> str:
        pay = "never" if not math.isfinite(self.payback_s) else f"{self.payback_s:,.0f} s"
        return (f"{'restart' if self.restart else 'hot'} p95 {self.gain_p95 * 100:+.1f}% "
                f"mean {self.gain_mean * 100:+.1f}% over {self.horizon_s:,.0f} s; steady gain "
                f"{self.gain_per_hour_s:,.0f} s/h, transition cost {self.transition_cost_s:,.0f} s, payback {pay}"
                f" -> {self.verdict}" + (f" ({self.reason})" if self.reason else ""))

    def to_dict(self) -> dict[str, object]:
        def num(x: float, nd: int = 4) -> float | None:
            return round(x, nd) if math.isfinite(x) else None

        return {"restart": self.restart, "gain_p95": num(self.gain_p95), "gain_mean": num(self.gain_mean),
                "steady_gain_p95": num(self.steady_gain_p95), "steady_gain_mean": num(self.steady_gain_mean),
                "horizon_s": num(self.horizon_s, 1), "gain_per_hour_s": num(self.gain_per_hour_s, 1),
                "transition_cost_s": num(self.transition_cost_s, 1), "payback_s": num(self.payback_s, 1),
                "memory_p95": num(self.memory_p95), "verdict": self.verdict, "reason": self.reason}


def price(stay: np.ndarray, transition: np.ndarray, steady: np.ndarray, transition_s: float,
          window_s: float) -> tuple[float, float, float]:
    """(steady gain per hour, transition cost, payback), in TTFT seconds summed over requests.
    The steady gain is the mean TTFT saved per request times the request rate of the window; the
    cost is what the transition window served beyond what staying would have (0 if less)."""
    if not (stay.size and steady.size and window_s > 0):
        return math.nan, math.nan, math.nan
    rate_per_h = stay.size / window_s * 3600.0
    per_hour = (float(stay.mean()) - float(steady.mean())) * rate_per_h
    cost = max(float(transition.sum()) - float(stay.mean()) * transition.size, 0.0) if transition.size else 0.0
    payback = 0.0 if cost == 0 and per_hour > 0 else (cost / per_hour * 3600.0 if per_hour > 0 else math.inf)
    return per_hour, cost, payback


def decide(twin: PlanningTwin, current: Knobs, candidates: Sequence[Knobs], *,
           restarts: Callable[[Knobs, Knobs], bool], margin: float, horizon_s: float,
           tolerance: float = 0.0, memory_s: Callable[[Knobs], float] | None = None) -> list[Decision]:
    """Every candidate priced against staying on `current`, best first (accepted ones first, then
    by the sum of the two gains). Accepted: the larger gain >= margin, the smaller >= -tolerance.
    `memory_s(knobs)`: the objective's memory price of a configuration, in seconds of TTFT p95. Only
    memory a move adds is charged: the fleet is never restarted just to free memory (a smaller
    buffer is taken only when it pays in TTFT)."""
    stay = twin.steady(current)
    mem = memory_s or (lambda _k: 0.0)
    out = []
    for knobs in dict.fromkeys(candidates):
        if knobs == current:
            continue
        restart = restarts(current, knobs)
        trans, steady = twin.switch(current, knobs, restart=restart), twin.steady(knobs)
        g95, gmean = net_gain(stay, trans, steady, twin.transition_s, horizon_s)
        s95, smean = net_gain(stay, steady, steady, 0.0, horizon_s)
        base95 = weighted_p95_mean(stay, np.ones(stay.size))[0]
        extra = 0.0
        if base95 > 0 and math.isfinite(g95):  # the memory price of memory added, on the p95 objective
            extra = max(mem(knobs) - mem(current), 0.0) / base95
            g95, s95 = g95 - extra, s95 - extra
        per_hour, cost, payback = price(stay, trans, steady, twin.transition_s, twin.transition_s)
        refill = refill_charge(twin, current, knobs, restart=restart, transition=trans, steady=steady,
                               horizon_s=horizon_s) if restart else 0.0
        if refill > 0 and stay.size and twin.transition_s > 0:  # the refill past the window, on the mean
            gmean -= refill / (stay.size / twin.transition_s * horizon_s) / float(stay.mean())
            cost += refill
            payback = cost / per_hour * 3600.0 if per_hour > 0 else math.inf
        ok = (math.isfinite(g95) and math.isfinite(gmean) and max(g95, gmean) >= margin
              and min(g95, gmean) >= -tolerance)
        if ok:
            reason = ""
        elif not (math.isfinite(g95) and math.isfinite(gmean)):
            reason = "not measurable on the twin"
        elif min(s95, smean) < -tolerance:  # settled, it is slower on one statistic
            which = "p95" if s95 < smean else "mean"
            reason = (f"{which} slower once settled (p95 {change_text(s95)}, mean {change_text(smean)}, "
                      f"against staying)")
        elif max(s95, smean) < margin:
            reason = (f"settled gain under the {margin * 100:.1f}% margin (p95 {change_text(s95)}, mean "
                      f"{change_text(smean)}, against staying)")
        elif min(g95, gmean) < -tolerance:
            which = "p95" if g95 < gmean else "mean"
            reason = f"{which} worse over the horizon ({min(g95, gmean) * 100:+.1f}%)"
        elif math.isfinite(payback) and payback < horizon_s:
            reason = (f"gain below the {margin * 100:.1f}% margin over the horizon (p95 {g95 * 100:+.1f}%, "
                      f"mean {gmean * 100:+.1f}%)")
        else:
            pay = "never" if not math.isfinite(payback) else f"{payback:,.0f} s"
            reason = f"transition not repaid within the horizon (payback {pay}, horizon {horizon_s:,.0f} s)"
        out.append(Decision(knobs, restart, g95, gmean, ok, horizon_s, per_hour, cost, payback, s95, smean, reason,
                            memory_p95=extra))
    out.sort(key=lambda d: (not d.accepted, -(d.gain_p95 + d.gain_mean)))
    return out


class CapacitySource(Protocol):
    """Where CPU buffer candidates come from (the hit-ratio-vs-capacity curve: its knee and the
    size where the next GiB buys less than the memory price)."""

    def cpu_candidates(self, current: Knobs) -> Sequence[float]:
        ...


class TransitionPlanner:
    """The phase's live plan: at most one hot change, then at most one restart-requiring change.

    `horizon()` (optional) estimates the rest of the regime from the run (tuners.planning.horizon); without
    it `settings.horizon_s` is used. `capacity` (optional) adds CPU buffer candidates to the
    search's, and, when it has `l2_pool(knobs)`, the L2 pool's curve sizes to the plan record (the
    pool's size is the operator's: reported, not priced). `every_value` (optional): knobs with a few values that are all priced at every plan,
    whatever the search found (the L2 eviction policy: the search's short window cannot rank
    policies that differ only once scans have churned the pool, and a full-history twin can).
    `memory_s(knobs)` prices memory as the objective does."""

    def __init__(self, twin_factory: Callable[[], PlanningTwin], current: Callable[[], Knobs], *,
                 restarts: Callable[[Knobs, Knobs], bool], routers: Sequence[str],
                 search: WarmStart | None = None, settings: PlanSettings,
                 horizon: Callable[[], Any] | None = None, capacity: CapacitySource | None = None,
                 memory_s: Callable[[Knobs], float] | None = None,
                 every_value: Mapping[str, Sequence[object]] | None = None,
                 clock: Callable[[], float] | None = None, workload: Callable[[], str] | None = None) -> None:
        self.twin_factory = twin_factory
        self.workload = workload
        self.current = current
        self.restarts = restarts
        self.routers = tuple(routers)
        self.search = search
        self.settings = settings
        self.horizon = horizon
        self.capacity = capacity
        self.memory_s = memory_s
        self.every_value = dict(every_value or {})
        self.clock = clock
        self.decisions: list[Decision] = []
        self.last_plan: dict[str, Any] | None = None  # for /healthz and the report
        self.history: list[dict[str, Any]] = []  # every plan (time, horizon, priced candidates)

    def candidates(self, k: int) -> list[Knobs]:
        s = self.settings
        est = self.horizon() if self.horizon is not None else None
        horizon_s = est.horizon_s if est is not None else s.horizon_s
        twin = self.twin_factory()
        now = self.current()
        hot = decide(twin, now, [now.replace(router=r) for r in self.routers], restarts=lambda a, b: False,
                     margin=s.hot_margin, horizon_s=horizon_s, tolerance=s.tolerance)
        base = hot[0].knobs if hot and hot[0].accepted else now
        plan = [base] if base != now else []
        cold: list[Decision] = []
        l2_pool = None
        deferred = self._too_young(est, twin.transition_s)
        if deferred:
            log_event("restart_deferred", reason=deferred)
        if self.search is not None and s.search_k > 0 and k > len(plan) and not deferred:
            sizes = [float(g) for g in self.capacity.cpu_candidates(base)] if self.capacity is not None else []
            l2_pool = self.capacity.l2_pool(base) if hasattr(self.capacity, "l2_pool") else None
            if hasattr(self.search, "include"):  # seed the twin search with the capacity candidates
                self.search.include = tuple(base.replace(cpu_gib=g) for g in sizes)
            found = [c.replace(router=base.router) for c in self.search.candidates(s.search_k)]
            found += [c.replace(cpu_gib=g) for c in [base, *found[:1]] for g in sizes]
            # each knob of the search's best on its own: a change that needs no pod restart (an L2
            # eviction policy) or keeps the L2 readable (no chunk change) may pay where the bundle does not
            if found and len(base.diff(found[0])) > 1:
                found += [base.replace(**{name: after}) for name, (_b, after) in base.diff(found[0]).items()
                          if not name.startswith("l2_") or name == "l2_eviction"]
            found += [base.replace(**{name: v}) for name, values in self.every_value.items() for v in values
                      if v != getattr(base, name)]
            cold = decide(twin, base, found, restarts=self.restarts, margin=s.margin, horizon_s=horizon_s,
                          tolerance=s.tolerance, memory_s=self.memory_s)
            if cold and cold[0].accepted:
                plan.append(cold[0].knobs)
        self.decisions = hot + cold
        priced = [{"knobs": now.diff(d.knobs), **d.to_dict()} for d in self.decisions]
        self.last_plan = {"at": self.clock() if self.clock else None, "current": now.to_dict(),
                          **({"workload": self.workload()} if self.workload is not None else {}),
                          "horizon": est.to_dict() if est is not None else {"horizon_s": horizon_s, "basis": "configured"},
                          "plan": [p.to_dict() for p in plan], "priced": priced,
                          **({"restarts_deferred": deferred} if deferred else {}),
                          **({"l2_pool": l2_pool} if l2_pool else {})}
        self.history.append(self.last_plan)
        log_event("plan", current=now.to_dict(), plan=[p.to_dict() for p in plan], workload=self.last_plan.get("workload"),
                  horizon=self.last_plan["horizon"], **({"l2_pool": l2_pool} if l2_pool else {}),
                  priced=[{"knobs": now.diff(d.knobs), "decision": d.describe()} for d in self.decisions])
        return plan[:k]

    def priced(self, knobs: Knobs) -> dict[str, Any] | None:
        """The latest plan's priced line for the move to `knobs` (its numbers, verdict and the
        sentence), or None if the latest plan did not price it."""
        for d in self.decisions:
            if d.knobs == knobs:
                return {**d.to_dict(), "line": d.describe(), "at": self.last_plan.get("at") if self.last_plan else None}
        return None

    @staticmethod
    def _too_young(est: Any, window_s: float) -> str:
        """Why restart-requiring moves wait ("" if they need not): a regime that began with a
        drift and is younger than the twin's evaluation window would be priced on a window that
        mixes it with the regime before. A hot change is cheap to undo and is decided anyway; a
        restart waits for the replan, once the regime's own requests fill the window."""
        if est is None or est.typical_s is None or est.age_s >= window_s:
            return ""
        return (f"the regime is {est.age_s:,.0f} s old: the twin's {window_s:,.0f} s window would mix it with the "
                "one before; restart-requiring moves are priced once it fills the window")


__all__ = ["CapacitySource", "Decision", "PlanSettings", "PlanningTwin", "TransitionPlanner", "decide", "horizon_outcome",
           "net_gain", "price", "refill_charge", "weighted_p95_mean"]
