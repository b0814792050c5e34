"""Service-time noise of a pod (optional, per profile).

A real engine's service times scatter around what the latency model predicts, and under load the
scatter has a tail (a slow step, a stall of the process that shares the core). The queue a tail
builds is what moves TTFT p95. A profile may carry `service_noise`: quantiles of the factor by
which a request's busy time differs from the model's, at evenly spaced probabilities from 0 to 1
(`fit_noise_quantiles`, from measured / predicted service times). The twin then multiplies each
request's busy time by a factor drawn from that distribution, from a generator seeded per twin, in
arrival order, so a replay is deterministic and both replay loops draw the same factors. Without
`service_noise` (the GPU profiles) nothing is drawn.
"""
from __future__ import annotations

from collections.abc import Sequence

import numpy as np

NOISE_POINTS = 21  # quantiles at 0, 0.05, ..., 1


class ServiceNoise:
    """`next()`: the next request's factor (1.0 when the profile has no noise)."""

    def __init__(self, quantiles: Sequence[float], seed: int = 0) -> None:
        self.quantiles = np.asarray(quantiles, dtype=float)
        self.active = self.quantiles.size >= 2
        self._probs = np.linspace(0.0, 1.0, self.quantiles.size) if self.active else None
        self._rng = np.random.default_rng(seed)

    def next(self) -> float:
        if not self.active:
            return 1.0
        return float(np.interp(self._rng.random(), self._probs, self.quantiles))


def fit_noise_quantiles(ratios: Sequence[float], points: int = NOISE_POINTS) -> tuple[float, ...]:
    """Quantiles (at `points` evenly spaced probabilities) of measured / predicted service times.
    Measured under load against a model fitted on isolated requests, their mean may exceed 1: a
    request served beside others (another request's HTTP and tokenisation on the same core) is
    slower than one served alone."""
    r = np.asarray([x for x in ratios if np.isfinite(x) and x > 0], dtype=float)
    if r.size < 20:
        raise ValueError(f"service noise: need at least 20 ratios, got {r.size}")
    return tuple(round(float(q), 4) for q in np.quantile(r, np.linspace(0.0, 1.0, points)))


__all__ = ["NOISE_POINTS", "ServiceNoise", "fit_noise_quantiles"]
