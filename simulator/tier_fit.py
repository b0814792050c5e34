"""The twin's tier transfer terms fitted to a real tiered engine, and a replay's per-tier hit
ratios counted as that engine counts them (pure).

**Transfer terms.** A request that finds part of its prompt in the CPU tier (or in the fs tier)
waits, on top of the base model of profile_fit (overhead, prefill, attention), for a fixed part
(the connector's extra scheduler steps: an asynchronous load, the fs tier's asynchronous lookup and
promotion) and a part per token moved (copies: fs -> CPU tier -> KV cache). The per-token part
comes from the engine's own transfer counters (`kv_offload_load_time / kv_offload_load_bytes`
for CPU tier -> KV cache, plus `kv_offload_tiering_read_time / read_bytes{tier="1:fs"}` for an fs
hit); the fixed part from the TTFTs of calibration requests: the mean of

    measured TTFT - base model(computed, cached) - per-token cost x tokens served by the tier

`fit_transfer` also reports the free two-parameter least squares (fixed + slope), which shows
whether the TTFTs alone could have told the per-token cost apart from the noise.

**Hit ratios as vLLM counts them.** vLLM's prefix cache counts every prompt token as a query
(`prefix_cache_queries`) and the tokens its KV cache served as hits. Its tiering manager
(`vllm/v1/kv_offload/tiering/manager.py`, metrics in `.../tiering/metrics.py`) looks the prompt's
chunks up one at a time after the KV-cache hit, the CPU primary tier first and, on a primary miss,
the fs tier, and stops at the first chunk neither holds; each tier counts a chunk it answered once
per request (`chunk_queries`, `chunk_hits`). The fs tier answers asynchronously: its first answer
for a chunk is "retry" (vllm/v1/kv_offload/tiering/async_lookup.py), and the connector goes on
scanning past a retry (`_maximal_prefix_lookup` in .../offloading/scheduler.py), so on a request's
first pass the CPU tier is asked for every chunk after the KV-cache hit; on the next pass the fs
tier answers for the chunks the CPU tier missed, up to the first chunk it does not hold. So the CPU
tier's queries are every chunk after the KV-cache hit (without an fs tier: its hits and the chunk
that ended the lookup), the fs tier's its hits and that one chunk.
`engine_style_ratios` counts a replay's outcomes the same way, so the twin's and the engine's
ratios mean the same thing.
"""
from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence

import numpy as np
import polars as pl

from simulator.models import get_model
from simulator.profile import HardwareProfile
from simulator.profile_fit import FitError

TINY = 1e-9  # a profile's transfer terms must be positive: what stands for "none"


@dataclasses.dataclass(frozen=True)
class TransferFit:
    """fixed_s + per_token_s x tokens: the TTFT a tier hit adds to the base model."""

    fixed_s: float
    per_token_s: float
    samples: int
    rms_s: float  # RMS of the residuals around fixed + per-token
    free_fixed_s: float  # the unconstrained least squares, for comparison
    free_per_token_s: float

    def predict(self, tokens: float) -> float:
        return self.fixed_s + self.per_token_s * tokens


def fit_transfer(tokens: Sequence[float], extra_s: Sequence[float], per_token_s: float, *,
                 min_samples: int = 5) -> TransferFit:
    """The fixed part, given the per-token cost measured by the engine's counters.

    `tokens`: prompt tokens each request found in the tier; `extra_s`: its TTFT minus the base
    model. The fixed part is the mean of `extra - per_token x tokens`, floored at 0."""
    x = np.asarray(tokens, dtype=float)
    y = np.asarray(extra_s, dtype=float)
    if len(x) != len(y):
        raise FitError(f"transfer fit: column lengths differ ({len(x)}, {len(y)})")
    ok = np.isfinite(x) & np.isfinite(y)
    x, y = x[ok], y[ok]
    if len(y) < min_samples:
        raise FitError(f"transfer fit: need at least {min_samples} samples, got {len(y)}")
    if not per_token_s >= 0 or not math.isfinite(per_token_s):
        raise FitError(f"transfer fit: per-token cost must be a finite number >= 0, got {per_token_s!r}")
    fixed = max(float(np.mean(y - per_token_s * x)), 0.0)
    resid = y - fixed - per_token_s * x
    if np.ptp(x) > 0:
        slope, intercept = np.polyfit(x, y, 1)
    else:
        slope, intercept = 0.0, float(np.mean(y))
    return TransferFit(fixed, float(per_token_s), len(y), math.sqrt(float(np.mean(resid ** 2))),
                       float(intercept), float(slope))


def rate_per_token(seconds: float, nbytes: float, kv_bytes_per_token: int) -> float:
    """Seconds per token of a transfer the engine counted (`time` over `bytes`)."""
    if nbytes <= 0 or seconds < 0:
        raise FitError(f"transfer rate: no bytes moved ({nbytes:.0f} B in {seconds:.6f} s)")
    return seconds / nbytes * kv_bytes_per_token


def with_tier_fit(profile: HardwareProfile, cpu: TransferFit, fs: TransferFit) -> HardwareProfile:
    """`profile` with the fitted CPU-tier load and fs read terms, in the twin's latency keys.

    The per-token costs become byte rates (`pcie_bytes_per_s`, `l2_read_bytes_per_s`) at the
    profile model's KV bytes per token, the bytes the twin moves per token, so a token costs the
    twin what it cost the engine, and the cost follows the chunk size; the per-chunk terms are left
    at nothing. The fixed parts are `cpu_load_overhead_s` and `l2_retrieve_overhead_s`. The fs figure
    covers the whole path of an fs hit (read, promotion, load into the KV cache): the twin charges
    an L2 hit its read only."""
    kv_bytes_per_token = get_model(profile.model).kv_bytes_per_token

    def rate(per_token: float) -> float:
        return kv_bytes_per_token / per_token if per_token > 0 else 1.0e12

    lat = dataclasses.replace(
        profile.latency, pcie_bytes_per_s=rate(cpu.per_token_s), cpu_load_chunk_s=TINY,
        cpu_load_overhead_s=cpu.fixed_s, l2_read_bytes_per_s=rate(fs.per_token_s), l2_read_chunk_s=TINY,
        l2_retrieve_overhead_s=max(fs.fixed_s, TINY))
    return dataclasses.replace(profile, latency=lat)


# -- per-tier hit ratios, counted as vLLM counts them ----------------------------------------------
@dataclasses.dataclass(frozen=True)
class TierRatios:
    """Per-tier (queries, hits): KV cache (L0) in tokens, CPU (L1) and fs (L2) tier in chunks."""

    l0_queries: float
    l0_hits: float
    l1_queries: float
    l1_hits: float
    l2_queries: float
    l2_hits: float

    @staticmethod
    def _ratio(hits: float, queries: float) -> float:
        return hits / queries if queries > 0 else math.nan

    @property
    def l0(self) -> float:
        return self._ratio(self.l0_hits, self.l0_queries)

    @property
    def l1(self) -> float:
        return self._ratio(self.l1_hits, self.l1_queries)

    @property
    def l2(self) -> float:
        return self._ratio(self.l2_hits, self.l2_queries)


def engine_style_ratios(requests: pl.DataFrame, chunk_tokens: int, *, l2: bool = True) -> TierRatios:
    """A replay's per-tier ratios as vLLM's counters count them (module docstring). `requests`:
    `ReplayResult.requests` (prompt, GPU/CPU/L2 hit tokens); `l2`: the engine has an fs tier."""
    c = chunk_tokens
    full = requests["prompt_tokens"] // c
    gpu = requests["gpu_hit_tokens"] // c
    cpu = requests["cpu_hit_tokens"] // c
    fs = requests["l2_hit_tokens"] // c
    rest = (full - gpu).clip(lower_bound=0)  # chunks the connector looks up
    missed = ((rest > 0) & (gpu + cpu + fs < full)).cast(pl.Int64)  # the chunk that ends the lookup
    # with an fs tier, the first pass asks the CPU tier for every chunk (fs answers "retry")
    l1_queries = rest if l2 else cpu + missed
    return TierRatios(
        float(requests["prompt_tokens"].sum()), float(requests["gpu_hit_tokens"].sum()),
        float(l1_queries.sum()), float(cpu.sum()),
        float((fs + missed).sum()) if l2 else 0.0, float(fs.sum()) if l2 else 0.0)


def counter_ratios(before: dict[tuple[str, str], float], after: dict[tuple[str, str], float]) -> TierRatios:
    """The engine's own per-tier ratios over a stream: its counters' increases. Keys are
    (metric name, `tier` label or ''), as `emulator.engines.tier_probe.parse_counters` reads them."""
    def d(name: str, tier: str = "") -> float:
        return after.get((name, tier), 0.0) - before.get((name, tier), 0.0)

    q, h = "vllm:kv_offload_tiering_chunk_queries_total", "vllm:kv_offload_tiering_chunk_hits_total"
    return TierRatios(d("vllm:prefix_cache_queries_total"), d("vllm:prefix_cache_hits_total"),
                      d(q, "0:primary"), d(h, "0:primary"), d(q, "1:fs"), d(h, "1:fs"))


__all__ = ["TierRatios", "TransferFit", "counter_ratios", "engine_style_ratios", "fit_transfer", "rate_per_token",
           "with_tier_fit"]
