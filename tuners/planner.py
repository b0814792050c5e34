"""Decide on the twin what to change live, counting what getting there costs.

A live change is not free: a rolling restart empties every pod's GPU and CPU cache and takes each
pod out for a while, and a chunk-size change leaves the shared L2 unreadable until it refills.
`TransitionPlanner` (a `tuners.warmstart.WarmStart`, so the controller enqueues what it returns)
prices every candidate on a twin of the recent workload (`PlanningTwin`):

- **stay**: the running configuration, warm (what the fleet will serve if nothing changes);
- **transition**: the candidate applied at the start of the evaluation window, restarts and all;
- **steady**: the candidate, warm (what the fleet serves once the transition is over).

Over the expected rest of the phase (`horizon_s`) the move serves `transition` for the length of
the window and `steady` for the rest (`horizon_outcome`); of its net gains on TTFT p95 and on the
mean (`net_gain`) the larger must clear a margin and neither may be below `-tolerance`, or the
candidate is not worth its transition.

Knobs that reload without a restart (the router) are decided on their own first, against the
running configuration; restart-requiring candidates from the twin search (`search`, e.g.
`TwinWarmStart`, with the chosen router) are then priced against that, and at most the best one
that clears `margin` follows. Nothing else is tried on the fleet.
"""
from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Sequence
from typing import Protocol

import numpy as np

from contracts.knobs import Knobs
from tuners.logline import log_event
from tuners.warmstart import WarmStart


@dataclasses.dataclass(frozen=True)
class PlanSettings:
    """horizon_s: expected rest of a phase after the plan (how long a workload regime lasts).
    margin: net predicted gain (relative) a restart-requiring change needs on TTFT p95 or on the
    mean, whichever is larger. hot_margin: the same for a hot-reload change. tolerance: neither
    gain may be below -tolerance. search_k: twin-search candidates priced."""

    horizon_s: float = 900.0
    margin: float = 0.03
    hot_margin: float = 0.01
    tolerance: float = 0.005
    search_k: int = 3

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
    knobs: Knobs
    restart: bool
    gain_p95: float
    gain_mean: float
    accepted: bool

    def describe(self) -> str:
        return (f"{'restart' if self.restart else 'hot'} p95 {self.gain_p95 * 100:+.1f}% "
                f"mean {self.gain_mean * 100:+.1f}% -> {'apply' if self.accepted else 'skip'}")


def decide(twin: PlanningTwin, current: Knobs, candidates: Sequence[Knobs], *,
           restarts: Callable[[Knobs, Knobs], bool], margin: float, horizon_s: float,
           tolerance: float = 0.0) -> list[Decision]:
    """Every candidate priced against staying on `current`, best first (accepted ones first, then
    by the sum of the two gains). Accepted: the larger gain >= margin, the smaller >= -tolerance."""
    stay = twin.steady(current)
    out = []
    for knobs in dict.fromkeys(candidates):
        if knobs == current:
            continue
        restart = restarts(current, knobs)
        g95, gmean = net_gain(stay, twin.switch(current, knobs, restart=restart), twin.steady(knobs),
                              twin.transition_s, horizon_s)
        ok = (math.isfinite(g95) and math.isfinite(gmean) and max(g95, gmean) >= margin
              and min(g95, gmean) >= -tolerance)
        out.append(Decision(knobs, restart, g95, gmean, ok))
    out.sort(key=lambda d: (not d.accepted, -(d.gain_p95 + d.gain_mean)))
    return out


class TransitionPlanner:
    """The phase's live plan: at most one hot change, then at most one restart-requiring change."""

    def __init__(self, twin_factory: Callable[[], PlanningTwin], current: Callable[[], Knobs], *,
                 restarts: Callable[[Knobs, Knobs], bool], routers: Sequence[str],
                 search: WarmStart | None = None, settings: PlanSettings = PlanSettings()) -> None:
        self.twin_factory = twin_factory
        self.current = current
        self.restarts = restarts
        self.routers = tuple(routers)
        self.search = search
        self.settings = settings
        self.decisions: list[Decision] = []

    def candidates(self, k: int) -> list[Knobs]:
        s = self.settings
        twin = self.twin_factory()
        now = self.current()
        hot = decide(twin, now, [now.replace(router=r) for r in self.routers], restarts=lambda a, b: False,
                     margin=s.hot_margin, horizon_s=s.horizon_s, tolerance=s.tolerance)
        base = hot[0].knobs if hot and hot[0].accepted else now
        plan = [base] if base != now else []
        cold: list[Decision] = []
        if self.search is not None and s.search_k > 0 and k > len(plan):
            found = [c.replace(router=base.router) for c in self.search.candidates(s.search_k)]
            cold = decide(twin, base, found, restarts=self.restarts, margin=s.margin, horizon_s=s.horizon_s,
                          tolerance=s.tolerance)
            if cold and cold[0].accepted:
                plan.append(cold[0].knobs)
        self.decisions = hot + cold
        log_event("plan", current=now.to_dict(), plan=[p.to_dict() for p in plan],
                  priced=[{"knobs": now.diff(d.knobs), "decision": d.describe()} for d in self.decisions])
        return plan[:k]


__all__ = ["Decision", "PlanSettings", "PlanningTwin", "TransitionPlanner", "decide", "horizon_outcome",
           "net_gain", "weighted_p95_mean"]
