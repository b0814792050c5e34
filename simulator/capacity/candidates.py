"""Capacity candidates from a tier's curve, and the steady-state value of a capacity change.

The value of a chunk hit is the prefill it saves minus the cost of loading the chunk from the
tier (the hardware profile's latency model, as the twin charges it). A capacity change's steady
state is the curve over the whole observed history: the change in hit chunks per request times
that value is the mean TTFT saved per request. It counts service time only: less prefill also
shortens queues, which this estimate leaves to the twin.

Candidates per tier:
- the knee: where the curve bends from its rise to its plateau (Kneedle: the point furthest
  above the chord from zero to the useful maximum);
- the priced optimum: the size that maximises mean TTFT saved minus the memory price
  (`memory_ms_per_gib` ms per GiB of fleet memory, the tuner's objective exchange rate); from
  there on the next GiB buys less TTFT than it costs;
- the useful maximum (every reuse hits), clipped to the operator's headroom.
"""
from __future__ import annotations

import dataclasses

import numpy as np

from simulator.capacity.curves import TierCurve
from simulator.profile import HardwareProfile, get_profile


def chunk_saving_s(curve: TierCurve, profile: HardwareProfile | str | None) -> float:
    """Seconds of TTFT one chunk hit in this tier saves against prefilling it."""
    lat = get_profile(profile).latency
    c = curve.chunk_tokens
    nbytes = c * curve.kv_bytes_per_token
    prefill = c * lat.prefill_s_per_token
    if curve.tier == "gpu":
        return prefill
    if curve.tier == "cpu":
        return prefill - lat.cpu_load_s(1, nbytes)
    return prefill - lat.l2_read_s(1, nbytes)


@dataclasses.dataclass(frozen=True)
class SteadyEstimate:
    """A capacity change of one tier in steady state, over the whole observed history."""

    tier: str
    capacity_gib: float  # per pod for GPU/CPU, fleet for L2
    current_gib: float
    hit_ratio: float
    current_hit_ratio: float
    delta_hit_tokens_per_request: float
    ttft_saving_s: float  # mean TTFT per request, > 0 = faster (service time only)
    memory_delta_gib: float  # fleet memory the change adds (< 0 frees)

    def net_gain_s(self, memory_ms_per_gib: float) -> float:
        """Mean TTFT saved minus the memory price, seconds per request."""
        return self.ttft_saving_s - memory_ms_per_gib / 1000.0 * self.memory_delta_gib


def _fleet_gib(curve: TierCurve, gib: float) -> float:
    return gib * curve.pods if curve.per_pod else gib


def steady_state(curve: TierCurve, capacity_gib: float, profile: HardwareProfile | str | None = None
                 ) -> SteadyEstimate:
    """What `capacity_gib` would give over the stream the curve was built from."""
    if not capacity_gib >= 0:
        raise ValueError(f"capacity_gib: must be a number >= 0, got {capacity_gib!r}")
    cur = curve.current_gib
    now = curve.hit_chunks_at(curve.current_chunks)
    new = curve.hit_chunks_at(curve.chunks_for_gib(capacity_gib))
    per_req = (new - now) / curve.requests if curve.requests else 0.0
    return SteadyEstimate(
        tier=curve.tier, capacity_gib=float(capacity_gib), current_gib=cur,
        hit_ratio=curve.hit_ratio(capacity_gib), current_hit_ratio=curve.hit_ratio_at(curve.current_chunks),
        delta_hit_tokens_per_request=per_req * curve.chunk_tokens,
        ttft_saving_s=per_req * chunk_saving_s(curve, profile),
        memory_delta_gib=_fleet_gib(curve, capacity_gib) - _fleet_gib(curve, cur),
    )


def _grid(curve: TierCurve, top_gib: float, step_gib: float) -> np.ndarray:
    return np.round(np.arange(0.0, top_gib + step_gib * 0.5, step_gib), 6)


def knee_gib(curve: TierCurve, headroom_gib: float | None = None, step_gib: float = 0.25) -> float | None:
    """The curve's knee (GiB), or None when the tier never hits on this stream."""
    top = curve.max_useful_gib if headroom_gib is None else min(curve.max_useful_gib, headroom_gib)
    if top <= 0 or curve.hit_chunks_at(curve.chunks_for_gib(top)) <= 0:
        return None
    xs = _grid(curve, top, step_gib)
    ys = np.array([curve.hit_chunks_at(curve.chunks_for_gib(x)) for x in xs])
    if ys[-1] <= 0:
        return None
    gap = ys / ys[-1] - xs / xs[-1]
    return float(xs[int(np.argmax(gap))])


def priced_optimum_gib(curve: TierCurve, memory_ms_per_gib: float, headroom_gib: float,
                       profile: HardwareProfile | str | None = None, step_gib: float = 0.25) -> float:
    """The size in 0..headroom (GiB) maximising mean TTFT saved minus the memory price."""
    if headroom_gib <= 0:
        return 0.0
    xs = _grid(curve, headroom_gib, step_gib)
    save = chunk_saving_s(curve, profile)
    hits = np.array([curve.hit_chunks_at(curve.chunks_for_gib(x)) for x in xs])
    per_req = hits / max(curve.requests, 1) * save
    fleet = xs * curve.pods if curve.per_pod else xs
    net = per_req - memory_ms_per_gib / 1000.0 * fleet
    best = float(net.max())
    # the smallest size within a hair of the best: more memory for no gain is not a candidate
    return float(xs[int(np.flatnonzero(net >= best - 1e-12)[0])])


def capacity_candidates(curve: TierCurve, *, memory_ms_per_gib: float, headroom_gib: float,
                        profile: HardwareProfile | str | None = None, step_gib: float = 0.25) -> list[float]:
    """Sizes worth pricing (GiB, sorted, within 0..headroom, at least two steps apart): the knee,
    the priced optimum, the optimum at memory price 0, and the useful maximum clipped to the
    headroom."""
    out: set[float] = set()
    knee = knee_gib(curve, headroom_gib, step_gib)
    if knee is not None:
        out.add(knee)
    out.add(priced_optimum_gib(curve, memory_ms_per_gib, headroom_gib, profile, step_gib))
    out.add(priced_optimum_gib(curve, 0.0, headroom_gib, profile, step_gib))
    useful = curve.max_useful_gib
    out.add(min(float(np.ceil(useful / step_gib) * step_gib), headroom_gib))
    kept: list[float] = []
    for x in sorted(round(x, 4) for x in out if 0.0 <= x <= headroom_gib + 1e-9):
        if not kept or x - kept[-1] >= 2 * step_gib:  # neighbours a step or two apart: the smaller
            kept.append(x)
    return kept
