"""Calibrating the twin's latency to what the fleet really serves (pure).

The twin's TTFT of a request is `request_overhead_s + computed tokens x prefill_s_per_token`
(+ queueing, + CPU/L2 loads: small, and left to the profile). The agent sees, per window, how many
requests finished, their mean TTFT minus their mean queue time (vLLM's
`vllm:time_to_first_token_seconds` and `vllm:request_queue_time_seconds` histograms) and how many
prompt tokens were not served from any cache (`vllm:prompt_tokens_total` minus the hit tokens).
`fit_prefill_latency` regresses one on the other over many short windows (weighted by requests);
`calibrated_profile` puts the fitted prefill speed into a hardware profile the twin replays with.
Only the slope is applied: the intercept also absorbs the L2 retrieve overhead and the CPU / L2
load times of the requests that hit (on the twin's own fleet it comes out 30-110 ms above the
profile's `request_overhead_s`, while the slope is within ~15% of `prefill_s_per_token`), so it
is reported, not used.
"""
from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence

import numpy as np

from simulator.profile import HardwareProfile

LatencyPoint = tuple[float, float, float]  # (requests, mean uncached tokens per request, mean TTFT - queue, s)


@dataclasses.dataclass(frozen=True)
class LatencyFit:
    overhead_s: float
    prefill_s_per_token: float
    windows: int
    r2: float


def fit_prefill_latency(points: Sequence[LatencyPoint], *, min_windows: int = 6,
                        min_r2: float = 0.3) -> LatencyFit | None:
    """Weighted least squares of mean service time on mean uncached tokens. None when there are too
    few windows, the uncached tokens barely vary, or the fit is unphysical (a negative term) or
    explains too little (r2 < min_r2): then the profile stays as it is."""
    pts = [(n, c, y) for n, c, y in points if n > 0 and math.isfinite(c) and math.isfinite(y)]
    if len(pts) < min_windows:
        return None
    w, x, y = (np.asarray(v, dtype=float) for v in zip(*pts))
    xm, ym = np.average(x, weights=w), np.average(y, weights=w)
    sxx = float(np.sum(w * (x - xm) ** 2))
    if sxx <= 0 or np.sqrt(sxx / w.sum()) < 0.05 * max(xm, 1.0):
        return None
    slope = float(np.sum(w * (x - xm) * (y - ym)) / sxx)
    intercept = float(ym - slope * xm)
    resid = y - (intercept + slope * x)
    total = float(np.sum(w * (y - ym) ** 2))
    r2 = 1.0 - float(np.sum(w * resid ** 2)) / total if total > 0 else 0.0
    if slope <= 0 or intercept < 0 or r2 < min_r2:
        return None
    return LatencyFit(intercept, slope, len(pts), r2)


def calibrated_profile(profile: HardwareProfile, fit: LatencyFit | None) -> HardwareProfile:
    """`profile` with the fitted prefill speed (unchanged without a fit)."""
    if fit is None:
        return profile
    latency = dataclasses.replace(profile.latency, prefill_s_per_token=fit.prefill_s_per_token)
    return dataclasses.replace(profile, name=f"{profile.name} (calibrated)", latency=latency)


__all__ = ["LatencyFit", "LatencyPoint", "calibrated_profile", "fit_prefill_latency"]
