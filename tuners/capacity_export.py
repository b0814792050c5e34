"""Publish the capacity curves of an observed history on the tuner's metrics."""
from __future__ import annotations

import polars as pl

from contracts.knobs import Knobs
from simulator.capacity import TierCurve, tier_curves
from simulator.capacity.table import curve_points
from simulator.cluster import ClusterSpec
from simulator.profile import HardwareProfile, get_profile
from tuners.metrics import TunerMetrics


def publish_capacity_curves(metrics: TunerMetrics, history: pl.DataFrame, cluster: ClusterSpec, knobs: Knobs, *,
                            profile: HardwareProfile | str | None = None, points: int = 9
                            ) -> dict[str, TierCurve] | None:
    """Build the curves over `history` at `knobs` and set `tierpilot_tier_capacity_hit_ratio`.

    The CPU grid stops at the profile's host memory per pod. Returns the curves (None and nothing
    published when the history is empty)."""
    if history.height == 0:
        return None
    prof = get_profile(profile) if profile is not None else cluster.hardware
    curves = tier_curves(history, cluster, knobs, profile=prof)
    metrics.set_capacity_curves(curve_points(curves, cap_gib={"cpu": prof.host_memory_gib}, points=points))
    return curves
