"""Fitting a hardware profile's latency terms to measured service times (pure).

Input: per request, the prompt tokens the engine computed, the tokens its prefix cache served and
the measured TTFT of requests sent one at a time (no queueing). The twin's model of that TTFT is
(simulator/profile.py)

    request_overhead_s + n x prefill_s_per_token + n x (cached + n / 2) x attention_s_per_token2

with n = max(computed, 1): a fixed cost, the per-token work, and attention (each computed token
attends to the cached prefix and the computed tokens before it). `attention=False` fits the
first two terms only, to show what the third one is worth.

Ordinary least squares; `r2` and the RMS residual say how much of the spread the model explains.
"""
from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence

import numpy as np

from simulator.profile import HardwareProfile


class FitError(ValueError):
    """Too few or degenerate samples for a fit (the message says which)."""


@dataclasses.dataclass(frozen=True)
class ServiceFit:
    overhead_s: float
    prefill_s_per_token: float
    attention_s_per_token2: float  # 0.0 when fitted without the attention term
    samples: int
    r2: float
    rms_s: float

    def predict(self, computed: float, cached: float = 0.0) -> float:
        n = max(computed, 1.0)
        return self.overhead_s + n * self.prefill_s_per_token + n * (cached + 0.5 * n) * self.attention_s_per_token2


def fit_service_latency(computed: Sequence[float], cached: Sequence[float], ttft_s: Sequence[float], *,
                        attention: bool = True, min_samples: int = 10) -> ServiceFit:
    x_c = np.maximum(np.asarray(computed, dtype=float), 1.0)
    x_h = np.asarray(cached, dtype=float)
    y = np.asarray(ttft_s, dtype=float)
    if not len(x_c) == len(x_h) == len(y):
        raise FitError(f"fit: column lengths differ ({len(x_c)}, {len(x_h)}, {len(y)})")
    ok = np.isfinite(x_c) & np.isfinite(x_h) & np.isfinite(y)
    x_c, x_h, y = x_c[ok], x_h[ok], y[ok]
    if len(y) < min_samples:
        raise FitError(f"fit: need at least {min_samples} samples, got {len(y)}")
    if np.ptp(x_c) <= 0:
        raise FitError("fit: the computed tokens do not vary, the per-token cost cannot be separated")
    cols = [np.ones_like(y), x_c] + ([x_c * (x_h + 0.5 * x_c)] if attention else [])
    a = np.column_stack(cols)
    coef, *_ = np.linalg.lstsq(a, y, rcond=None)
    resid = y - a @ coef
    total = float(np.sum((y - y.mean()) ** 2))
    r2 = 1.0 - float(np.sum(resid ** 2)) / total if total > 0 else 0.0
    overhead, per_token = float(coef[0]), float(coef[1])
    if overhead <= 0 or per_token <= 0:
        raise FitError(f"fit: unphysical result (overhead {overhead:.6f} s, {per_token:.3e} s/token)")
    if attention and coef[2] < 0:
        raise FitError(f"fit: unphysical result (attention {float(coef[2]):.3e} s/token^2)")
    return ServiceFit(overhead, per_token, float(coef[2]) if attention else 0.0, len(y), r2,
                      math.sqrt(float(np.mean(resid ** 2))))


def with_service_fit(profile: HardwareProfile, fit: ServiceFit, *, decode_s_per_token: float | None = None,
                     gpu_kv_gib: float | None = None) -> HardwareProfile:
    """`profile` with the fitted overhead, prefill speed and attention cost (and optionally decode speed, KV pool)."""
    lat = dataclasses.replace(profile.latency, request_overhead_s=fit.overhead_s,
                              prefill_s_per_token=fit.prefill_s_per_token,
                              attention_s_per_token2=fit.attention_s_per_token2,
                              decode_s_per_token=decode_s_per_token or profile.latency.decode_s_per_token)
    return dataclasses.replace(profile, latency=lat, gpu_kv_gib=gpu_kv_gib or profile.gpu_kv_gib)


__all__ = ["FitError", "ServiceFit", "fit_service_latency", "with_service_fit"]
