"""Capacity candidates from the capacity curves, for the planner.

Over the whole observed history (not a replay window), at the configuration in force, with each
request on the pod that served it where the history knows it (a stream rebuilt from KV events):
- `cpu_candidates(current)`: the CPU curve's knee, the size where the next GiB buys less mean TTFT
  than the memory price, and the size from which every reuse hits, within the operator's headroom
  (priced by the planner's twin);
- `l2_pool(current)`: the shared L2 pool's sizes worth knowing (its curve's knee and the size from
  which every reuse hits) with the hit ratio at each and at the pool in force. The pool's size is
  the operator's (`limits.l2_pool_gib`), not a knob the tuner sets, so these are reported with
  every plan, not priced.
Each rebuild also publishes the curves on the tuner's metrics (`tierpilot_tier_capacity_hit_ratio`)
when given them.
"""
from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from typing import Any

import polars as pl

from contracts.knobs import Knobs
from simulator.capacity import TierCurve, capacity_candidates, knee_gib, tier_curves
from simulator.capacity.table import curve_points
from simulator.cluster import ClusterSpec
from simulator.profile import HardwareProfile
from tuners.metrics import TunerMetrics
from tuners.planning.planner import CapacitySource
from tuners.space.limits import DeploymentLimits


@dataclasses.dataclass
class CurveCapacity:
    """`history()`: the observed requests so far (a workload frame, arrival order). `headroom_gib`:
    the largest CPU buffer per pod the operator allows; `step_gib`: the buffer's resolution."""

    history: Callable[[], pl.DataFrame]
    cluster: ClusterSpec
    headroom_gib: float
    memory_ms_per_gib: float
    step_gib: float = 0.25
    profile: HardwareProfile | str | None = None
    min_requests: int = 200
    metrics: TunerMetrics | None = None
    curves: dict[str, TierCurve] | None = dataclasses.field(default=None, init=False)
    _key: tuple | None = dataclasses.field(default=None, init=False, repr=False)

    def refresh(self, current: Knobs) -> dict[str, TierCurve] | None:
        """Rebuild the curves if the history or the knobs changed since the last call."""
        frame = self.history()
        if frame.height < self.min_requests:
            return self.curves
        last_ts = int(frame["timestamp_ms"][-1]) if frame.height else 0
        key = (frame.height, last_ts, current)
        if key != self._key:
            self.curves = tier_curves(frame, self.cluster, current, profile=self.profile)
            self._key = key
            if self.metrics is not None:
                self.metrics.set_capacity_curves(curve_points(self.curves, cap_gib={"cpu": self.headroom_gib}))
        return self.curves

    def cpu_candidates(self, current: Knobs) -> list[float]:
        """Sizes (GiB per pod) worth pricing, the size in force left out; [] before enough history."""
        curves = self.refresh(current)
        if curves is None:
            return []
        sizes = capacity_candidates(curves["cpu"], memory_ms_per_gib=self.memory_ms_per_gib,
                                    headroom_gib=self.headroom_gib, profile=self.profile or self.cluster.hardware,
                                    step_gib=self.step_gib)
        return [g for g in sizes if abs(g - current.cpu_gib) >= self.step_gib / 2]

    def l2_pool(self, current: Knobs) -> dict[str, Any] | None:
        """The L2 pool in force and its curve's knee and useful maximum (GiB, fleet), each with its
        hit ratio; None before enough history or when no request looks L2 up."""
        curves = self.refresh(current)
        curve = curves.get("l2") if curves is not None else None
        if curve is None or not curve.lookup_tokens:
            return None
        sizes = {"knee": knee_gib(curve, step_gib=self.step_gib), "useful": curve.max_useful_gib}
        return {"pool_gib": round(curve.current_gib, 2), "hit_ratio": round(curve.hit_ratio(curve.current_gib), 4),
                **{f"{k}_gib": round(g, 2) for k, g in sizes.items() if g is not None},
                **{f"{k}_hit_ratio": round(curve.hit_ratio(g), 4) for k, g in sizes.items() if g is not None}}


@dataclasses.dataclass(frozen=True)
class HeadroomCapacity:
    """CPU buffer candidates while the capacity curve has too little history: the operator's
    headroom and half of it, when larger than the running buffer."""

    limits: DeploymentLimits

    def cpu_candidates(self, current: Knobs) -> list[float]:
        top = self.limits.cpu_gib_max
        return [g for g in dict.fromkeys((top, math.floor(top / 2))) if g > current.cpu_gib]


@dataclasses.dataclass
class FirstOf:
    """The first source with candidates (the capacity curve, then the headroom)."""

    sources: tuple[CapacitySource, ...]

    def cpu_candidates(self, current: Knobs) -> list[float]:
        for src in self.sources:
            sizes = list(src.cpu_candidates(current))
            if sizes:
                return sizes
        return []


__all__ = ["CurveCapacity", "FirstOf", "HeadroomCapacity"]
