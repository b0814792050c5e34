"""Pacing the real-engine demo to the machine it runs on (pure).

The same tiny model prefills several times faster on a processor with native bf16 (AVX-512 BF16,
AMX) than on an AVX2 one, and a shared machine is slower still. A fixed request rate would
saturate one machine and idle another, and a saturated fleet measures its queue, not its cache.
So the demo measures the engines first and paces the stream from what it measured:

1. `speed_factor`: the warm-up's isolated requests against the `cpu-tiny-llama` profile's
   prediction for the same prompts (median of measured / predicted);
2. `scaled_profile`: the profile with every service-time term scaled by that factor, which is
   also the twin the demo's planner prices moves on;
3. `paced_rate`: the arrival rate at which each core is busy `utilisation` of the time, from the
   mean service time of the workload's requests replayed on that twin. Both fleets share the
   cores (engine i of each fleet on core i), so a core serves one engine of every fleet.
"""
from __future__ import annotations

import dataclasses
import math
import statistics
from collections.abc import Callable, Sequence

import polars as pl

from contracts.knobs import Knobs
from simulator.cluster import ClusterSpec
from simulator.profile import HardwareProfile
from simulator.replay import replay

MIN_RATE_RPS, MAX_RATE_RPS = 0.2, 20.0


@dataclasses.dataclass(frozen=True)
class Sample:
    """One isolated request: its latency, prompt tokens and the tokens its prefix cache served."""

    latency_s: float
    prompt_tokens: int
    cached_tokens: int


def speed_factor(samples: Sequence[Sample], profile: HardwareProfile) -> float:
    """Median of measured / predicted latency over isolated requests (1.0: as the profile says)."""
    lat = profile.latency
    ratios = []
    for s in samples:
        predicted = lat.request_overhead_s + lat.prefill_s(s.prompt_tokens - s.cached_tokens, s.cached_tokens)
        if s.latency_s > 0 and predicted > 0:
            ratios.append(s.latency_s / predicted)
    if not ratios:
        raise ValueError("pacing: no usable warm-up request (each needs a latency and a prompt)")
    return float(statistics.median(ratios))


def scaled_profile(profile: HardwareProfile, factor: float) -> HardwareProfile:
    """`profile` with its overhead, prefill, attention and decode times multiplied by `factor`."""
    if not (factor > 0 and math.isfinite(factor)):
        raise ValueError(f"pacing: speed factor must be a positive number, got {factor!r}")
    lat = profile.latency
    scaled = dataclasses.replace(lat, request_overhead_s=lat.request_overhead_s * factor,
                                 prefill_s_per_token=lat.prefill_s_per_token * factor,
                                 attention_s_per_token2=lat.attention_s_per_token2 * factor,
                                 decode_s_per_token=lat.decode_s_per_token * factor)
    return dataclasses.replace(profile, latency=scaled,
                               description=f"{profile.description}, service times x{factor:.2f} (measured here)")


def mean_service_s(frame: pl.DataFrame, profile: HardwareProfile, *, pods: int, kv_tokens: int,
                   knobs: Knobs) -> float:
    """Mean time a request holds its engine (TTFT minus queueing) on the twin with `profile`."""
    cluster = ClusterSpec(pods=pods, gpu_tokens=kv_tokens, cpu_tokens=0, l2_tokens=0, profile=profile)
    r = replay(frame, cluster, knobs).requests
    return float((r["ttft_s"] - r["queue_delay_s"]).mean())


def paced_rate(workload_at: Callable[[float], pl.DataFrame], profile: HardwareProfile, *, engines: int,
               fleets: int, kv_tokens: int, knobs: Knobs, utilisation: float) -> tuple[float, float]:
    """(rate in requests/s per fleet, mean service time in s) that keeps every core `utilisation`
    busy: each core serves `fleets` engines, each engine 1/`engines` of its fleet's requests.
    `workload_at(rate)` builds the stream at a rate (its structure does not depend on it much)."""
    if not 0 < utilisation < 1:
        raise ValueError(f"pacing: utilisation must be between 0 and 1, got {utilisation!r}")
    service = mean_service_s(workload_at(1.0), profile, pods=engines, kv_tokens=kv_tokens, knobs=knobs)
    rate = utilisation * engines / (fleets * service)
    return min(max(rate, MIN_RATE_RPS), MAX_RATE_RPS), service


__all__ = ["MAX_RATE_RPS", "MIN_RATE_RPS", "Sample", "mean_service_s", "paced_rate", "scaled_profile", "speed_factor"]
