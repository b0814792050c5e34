"""Hit ratio versus capacity per tier, from one pass over the block stream (see docs/twin.md)."""
from simulator.capacity.candidates import (
    SteadyEstimate,
    capacity_candidates,
    chunk_saving_s,
    knee_gib,
    priced_optimum_gib,
    steady_state,
)
from simulator.capacity.curves import TIERS, TierCurve, tier_curves
from simulator.capacity.stack import NEVER, reuse_distances, sampled_reuse_distances

__all__ = [
    "NEVER",
    "TIERS",
    "SteadyEstimate",
    "TierCurve",
    "capacity_candidates",
    "chunk_saving_s",
    "knee_gib",
    "priced_optimum_gib",
    "reuse_distances",
    "sampled_reuse_distances",
    "steady_state",
    "tier_curves",
]
