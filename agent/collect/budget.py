"""A cardinality budget per target: one pod must not multiply the agent's own series. Pure state
object, no I/O.

After normalisation, a target's signals are held to two bounds (0 = unlimited):
- `models`: distinct model labels. Beyond it, the models kept are the ones kept before (so the
  exported series do not churn), then the most active new ones (largest counter total, then by
  name); the others are dropped, counted as `model_budget`. Model-less signals (a pod's Curvine
  FUSE I/O, LMCache MP usage) are always kept and do not count.
- `series`: signals per target after the model bound. Beyond it, whole (model, signal) groups are
  dropped from the least active model up (a histogram is never cut between its buckets), counted
  as `series_budget`.

Dropping, not summing into an `__other__` model: the set of models beyond a budget changes from
scrape to scrape, and a sum over a changing set is not a counter (it would read as resets and
phantom increases). What is kept is exact; what is dropped is said.
"""
from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from contracts.tier_model import Signal


@dataclass(frozen=True, slots=True)
class Budget:
    models: int = 0  # distinct model labels per target (0: unlimited)
    series: int = 0  # signals per target (0: unlimited)


@dataclass(frozen=True, slots=True)
class BudgetCut:
    signals: list[Signal]
    models_seen: int
    models_dropped: int
    series_dropped: int
    # models let in now that were (or may have been) dropped before: their counters already ran,
    # so their first values are lifetime totals, not increases (WindowStore.ingest `known`)
    readmitted: tuple[str, ...] = ()


def _base(name: str) -> str:
    i = name.find(":")
    return name if i < 0 else name[:i]


class CardinalityBudget:
    """Per target (its key), the models it was allowed last time."""

    def __init__(self, budget: Budget) -> None:
        self.budget = budget
        self._kept: dict[str, tuple[str, ...]] = {}
        self._over: set[str] = set()  # targets that were over a budget at their previous scrape

    def apply(self, key: str, signals: Sequence[Signal]) -> BudgetCut:
        activity: dict[str, float] = {}
        for s in signals:
            if not s.model:
                continue
            if s.kind == "counter" and s.le != s.le:  # a counter, not a bucket
                activity[s.model] = activity.get(s.model, 0.0) + (s.value if math.isfinite(s.value) else 0.0)
            else:
                activity.setdefault(s.model, 0.0)
        before = [m for m in self._kept.get(key, ()) if m in activity]
        known = set(before)
        ranked = before + sorted((m for m in activity if m not in known), key=lambda m: (-activity[m], m))
        if self.budget.models:
            ranked = ranked[:self.budget.models]
        readmitted = tuple(m for m in ranked if m not in known) if key in self._over else ()
        self._kept[key] = tuple(ranked)
        rank = {m: i for i, m in enumerate(ranked)}
        out = [s for s in signals if not s.model or s.model in rank]
        series_dropped = 0
        if self.budget.series and len(out) > self.budget.series:
            groups: dict[tuple[str, str], int] = {}
            for s in out:
                g = (s.model, _base(s.name))
                groups[g] = groups.get(g, 0) + 1
            room = self.budget.series
            allowed: set[tuple[str, str]] = set()
            for g in sorted(groups, key=lambda g: (rank.get(g[0], -1), g[1])):  # model-less first
                if groups[g] <= room:
                    allowed.add(g)
                    room -= groups[g]
            kept = [s for s in out if (s.model, _base(s.name)) in allowed]
            series_dropped = len(out) - len(kept)
            out = kept
        if len(ranked) < len(activity) or series_dropped:
            self._over.add(key)
        else:
            self._over.discard(key)
        return BudgetCut(out, len(activity), len(activity) - len(ranked), series_dropped, readmitted)

    def forget(self, key: str) -> None:
        self._kept.pop(key, None)
        self._over.discard(key)
