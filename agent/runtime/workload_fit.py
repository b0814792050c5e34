"""A synthetic workload fitted to what the agent observes, for the twin warm start (pure).

The agent does not see prompts, only signals: the arrival rate, the prompt-length mix (the
`vllm:request_prompt_tokens` histogram) and the workload's prefix overlap (from KV events, or
the cache's cumulative hit ratio as a lower bound). `fit_phase` turns them into one
`simulator.synthetic.Phase` of single-turn requests whose prompts are a shared prefix (a pool of
system prompts) plus a unique user part:

- rate: the observed arrival rate;
- prompt length: mean and spread from the histogram buckets (bucket midpoints; the open last
  bucket counts as 1.5 x its lower bound), reproduced as prefix + user part;
- overlap: the shared prefix is `overlap x mean length`, plus half a block, because the block
  that mixes prefix and user text is never shared (512-token blocks, as in the twin); prefix
  lengths spread over whole blocks (at least one), so that correction holds on average;
- the pool of prefixes is small against the request count, so first sightings (cold blocks)
  do not dilute the overlap.

`fitted_workload(observed, ...)` generates the frame with `simulator.synthetic.generate`.
"""
from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence

import polars as pl

from simulator.chunking import BLOCK_TOKENS
from simulator.synthetic import Phase, generate

MIN_RATE_RPS = 0.05
DEFAULT_PROMPT_TOKENS = 2048.0


@dataclasses.dataclass(frozen=True)
class ObservedWorkload:
    """What the agent measured over a window. `prompt_length_mix` is (lower, upper, share) per
    histogram bucket (`WindowStore.prompt_length_mix`); `overlap` in 0..1, None when unknown."""

    arrival_rate_rps: float | None
    prompt_length_mix: tuple[tuple[float, float, float], ...] = ()
    overlap: float | None = None
    # vLLM's own view of the GPU tier (vllm:cache_config_info, num_requests_waiting,
    # num_preemptions_total): the real per-pod GPU KV capacity in tokens (the twin's GPU size) and
    # the load the latency model sees (mean waiting requests per pod, preemptions per second)
    gpu_tokens: int | None = None
    requests_waiting: float | None = None
    preemption_rate: float | None = None

    def __post_init__(self) -> None:
        if self.overlap is not None and not 0.0 <= self.overlap <= 1.0:
            raise ValueError(f"overlap: must be in 0..1, got {self.overlap!r}")
        if self.gpu_tokens is not None and self.gpu_tokens <= 0:
            raise ValueError(f"gpu_tokens: must be > 0, got {self.gpu_tokens!r}")

    def queue_delay_s(self, pods: int) -> float | None:
        """The load term in seconds: mean time a request waits before it is scheduled, by Little's
        law from vLLM's own queue (mean waiting requests per pod / per-pod arrival rate). None
        without both signals; 0 for an empty queue."""
        if self.requests_waiting is None or not self.arrival_rate_rps or pods < 1:
            return None
        return max(self.requests_waiting, 0.0) / (self.arrival_rate_rps / pods)


def length_moments(mix: Sequence[tuple[float, float, float]]) -> tuple[float, float] | None:
    """(mean, standard deviation) of prompt length from histogram buckets, or None if empty."""
    points = []
    for lo, hi, share in mix:
        if share <= 0:
            continue
        mid = lo * 1.5 if math.isinf(hi) else (lo + hi) / 2.0
        points.append((max(mid, 1.0), share))
    total = sum(w for _, w in points)
    if total <= 0:
        return None
    mean = sum(x * w for x, w in points) / total
    var = sum(w * (x - mean) ** 2 for x, w in points) / total
    return mean, math.sqrt(var)


def _range(center: float, half: float) -> tuple[int, int]:
    lo = max(0, round(center - half))
    return lo, max(lo, round(center + half))


def _block_multiple(half: float) -> float:
    """A half-width whose range spans whole blocks: then the blocks shared by a uniform prefix
    length average out to `length - half a block` (the correction `fit_phase` applies)."""
    step = BLOCK_TOKENS / 2
    return step * max(1, round(half / step))


def fit_phase(observed: ObservedWorkload, *, duration_s: float, max_requests: int | None = None,
              name: str = "fitted") -> Phase:
    """One synthetic phase matching the observed rate, length mix and overlap."""
    rate = max(observed.arrival_rate_rps or 0.0, MIN_RATE_RPS)
    if max_requests is not None and rate * duration_s > max_requests:
        duration_s = max(max_requests / rate, 1.0)
    moments = length_moments(observed.prompt_length_mix)
    mean, std = moments if moments is not None else (DEFAULT_PROMPT_TOKENS, DEFAULT_PROMPT_TOKENS / 4)
    spread = min(std * math.sqrt(3.0), mean * 0.9)  # a uniform range with that deviation, kept >= 0
    overlap = 0.0 if observed.overlap is None else observed.overlap
    shared = min(mean, overlap * mean + BLOCK_TOKENS / 2) if overlap > 0 else 0.0
    share = shared / mean if mean > 0 else 0.0
    expected = rate * duration_s
    pool = max(1, min(64, int(expected // 25)))
    return Phase(
        duration_s=duration_s, rate_rps=rate,
        system_prompts=pool,
        system_prompt_tokens=_range(shared, _block_multiple(spread * share)) if shared > 0 else (0, 0),
        system_share=1.0 if shared > 0 else 0.0,
        user_tokens=_range(mean - shared, spread * (1.0 - share)),
        output_tokens=(100, 400), turns=(1, 1), name=name)


def fitted_workload(observed: ObservedWorkload, *, duration_s: float = 300.0, max_requests: int | None = 2000,
                    seed: int = 0) -> pl.DataFrame:
    """The workload frame (simulator WORKLOAD_SCHEMA) of `fit_phase`, deterministic per seed."""
    return generate((fit_phase(observed, duration_s=duration_s, max_requests=max_requests),), seed=seed)


__all__ = ["ObservedWorkload", "fit_phase", "fitted_workload", "length_moments"]
