"""How long the current workload regime will last, from the run's own history (pure).

The planner prices a move over the expected rest of the regime. `RegimeHorizon` estimates it from
what the run has seen: the start of the current regime (the last real drift, or when the agent
began observing) and the lengths of past regimes.

- with past regimes: the typical (median) past length minus the current regime's age, while the
  regime is younger than that; from the typical length to twice it, nothing (the regime is due to
  end); once it has outlived twice the typical length, its age (a regime that has lasted t is, with
  no other information, as likely as not to last another t);
- without past regimes: the current regime's age, by the same rule;

clipped to the configured `floor_s` and `cap_s`. The floor guards a run with too little history
to judge by (fewer than `trust_after` past regimes: one past regime may be a false alarm); once
the run has seen that many, its estimate stands on its own and only `min_s` bounds it below, so a
regime the history says is about to end gets a short horizon and a restart there must pay back
at once. A young regime gets a short horizon too, so a restart must pay back quickly, and the
planner looks again as the regime ages (`replan_due`).
"""
from __future__ import annotations

import dataclasses
import math
import statistics
from collections.abc import Sequence


@dataclasses.dataclass(frozen=True, kw_only=True)
class HorizonSettings:
    """floor_s / cap_s: bounds of the horizon; the floor holds while the run has seen fewer than
    `trust_after` past regimes, and `min_s` (or the floor, if lower) from then on. replan_growth: the planner plans again
    when the regime's age has grown by this factor since its last plan (1.25: at 100 s, 125 s,
    156 s, ...). Each look measures a fresh baseline window first, so looks are at least a window
    apart."""

    floor_s: float
    cap_s: float
    replan_growth: float
    trust_after: int
    min_s: float

    def __post_init__(self) -> None:
        if not (0 < self.floor_s <= self.cap_s and self.min_s > 0):
            raise ValueError("horizon: need 0 < floor_s <= cap_s and min_s > 0, got "
                             f"{self.floor_s}, {self.cap_s}, {self.min_s}")
        if self.trust_after < 1:
            raise ValueError(f"horizon.trust_after: must be >= 1, got {self.trust_after}")
        if not self.replan_growth > 1.0:
            raise ValueError(f"horizon.replan_growth: must be > 1, got {self.replan_growth}")


@dataclasses.dataclass(frozen=True)
class HorizonEstimate:
    horizon_s: float
    age_s: float
    typical_s: float | None  # median length of past regimes (None: none seen)
    basis: str  # how it was estimated, for the decision log

    def to_dict(self) -> dict[str, object]:
        return {"horizon_s": round(self.horizon_s, 1), "age_s": round(self.age_s, 1),
                "typical_regime_s": None if self.typical_s is None else round(self.typical_s, 1),
                "basis": self.basis}


def estimate_horizon(age_s: float, past_lengths_s: Sequence[float], settings: HorizonSettings) -> HorizonEstimate:
    age = max(float(age_s), 0.0)
    past = [x for x in past_lengths_s if math.isfinite(x) and x > 0]
    typical = statistics.median(past) if past else None
    if typical is not None and typical > age:
        raw, basis = typical - age, f"typical past regime {typical:.0f} s minus age {age:.0f} s"
    elif typical is not None and age < 2.0 * typical:
        raw, basis = 0.0, f"age {age:.0f} s: at the typical regime length {typical:.0f} s, due to end"
    else:
        raw = age
        basis = (f"age {age:.0f} s (outlived the typical {typical:.0f} s)" if typical is not None
                 else f"age {age:.0f} s (no past regime)")
    low = min(settings.min_s, settings.floor_s) if len(past) >= settings.trust_after else settings.floor_s
    h = min(max(raw, low), settings.cap_s)
    if h != raw:
        basis += f", clipped to [{low:g}, {settings.cap_s:g}] s"
    return HorizonEstimate(h, age, typical, basis)


class RegimeHorizon:
    """The run's regime history: `start(now)` when a regime begins (a real drift, or the first
    observation); `estimate(now)` the horizon; `replan_due(now)` when the regime has aged enough
    since the last plan that the horizon may have grown (`planned(now)` records a plan)."""

    def __init__(self, settings: HorizonSettings) -> None:
        self.settings = settings
        self.starts: list[float] = []
        self._planned_age: float | None = None

    def start(self, now: float) -> None:
        if self.starts and now <= self.starts[-1]:
            return
        self.starts.append(now)
        self._planned_age = None

    @property
    def past_lengths_s(self) -> list[float]:
        return [b - a for a, b in zip(self.starts, self.starts[1:])]

    def age(self, now: float) -> float:
        return now - self.starts[-1] if self.starts else 0.0

    def estimate(self, now: float) -> HorizonEstimate:
        return estimate_horizon(self.age(now), self.past_lengths_s, self.settings)

    def planned(self, now: float) -> None:
        self._planned_age = max(self.age(now), 1.0)

    def replan_due(self, now: float) -> bool:
        if self._planned_age is None:
            return False
        if self.estimate(now).horizon_s >= self.settings.cap_s and self._planned_age * self.settings.replan_growth \
                > self.settings.cap_s:
            return False  # the horizon is at its cap: another look would price the same
        return self.age(now) >= self._planned_age * self.settings.replan_growth


__all__ = ["HorizonEstimate", "HorizonSettings", "RegimeHorizon", "estimate_horizon"]
