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

A plan's cost follows the frame, so the frame is capped whatever one pod claims: at most
`max_requests` requests (the span shrinks as the claimed rate grows; it is not held at 1 s) and at
most `max_block_refs` block references (a claimed prompt length is held to what that budget allows
for a few requests, and the frame is cut where its references reach the budget).
`capped_workload` returns the frame with a note saying which cap it hit, or None.
"""
from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence

import polars as pl

from simulator.chunking import BLOCK_TOKENS
from simulator.synthetic import Phase, generate

MIN_RATE_RPS = 0.05
MIN_CAPPED_REQUESTS = 10  # a claimed prompt length is held so that this many requests fit the block budget
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


def _blocks(tokens: float) -> int:
    return max(1, math.ceil(tokens / BLOCK_TOKENS))


def _held(mean: float, spread: float, max_block_refs: int | None) -> tuple[float, float]:
    """(mean, spread) of prompt length held so that `MIN_CAPPED_REQUESTS` requests fit the budget."""
    if max_block_refs is None:
        return mean, spread
    longest = max(1, max_block_refs // MIN_CAPPED_REQUESTS) * BLOCK_TOKENS
    if mean + spread <= longest:
        return mean, spread
    scale = longest / (mean + spread)
    return mean * scale, spread * scale


def fit_phase(observed: ObservedWorkload, *, duration_s: float, max_requests: int | None = None,
              max_block_refs: int | None = None, name: str = "fitted") -> Phase:
    """One synthetic phase matching the observed rate, length mix and overlap, within the caps."""
    rate = max(observed.arrival_rate_rps or 0.0, MIN_RATE_RPS)
    if not math.isfinite(rate):
        rate = float(max_requests or 1)
    moments = length_moments(observed.prompt_length_mix)
    mean, std = moments if moments is not None else (DEFAULT_PROMPT_TOKENS, DEFAULT_PROMPT_TOKENS / 4)
    spread = min(std * math.sqrt(3.0), mean * 0.9)  # a uniform range with that deviation, kept >= 0
    mean, spread = _held(mean, spread, max_block_refs)
    cap = max_requests
    if max_block_refs is not None:
        by_refs = max(1, max_block_refs // _blocks(mean + spread))
        cap = by_refs if cap is None else min(cap, by_refs)
    if cap is not None and rate * duration_s > cap:
        duration_s = cap / rate
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


def capped_workload(observed: ObservedWorkload, *, duration_s: float, max_requests: int | None,
                    max_block_refs: int | None, seed: int = 0) -> tuple[pl.DataFrame, str | None]:
    """The fitted frame within both caps (arrivals are random: the frame is cut at the caps too),
    and a one-line note when a cap shaped it (None for a workload that fits)."""
    phase = fit_phase(observed, duration_s=duration_s, max_requests=max_requests, max_block_refs=max_block_refs)
    frame = generate((phase,), seed=seed)
    full = frame.height
    if frame.height and max_block_refs is not None:
        frame = frame.filter(frame["hash_ids"].list.len().cum_sum() <= max_block_refs)
    if max_requests is not None:
        frame = frame.head(max_requests)
    moments = length_moments(observed.prompt_length_mix)
    held = moments is not None and _held(moments[0], 0.0, max_block_refs)[0] < moments[0]
    if phase.duration_s >= duration_s and frame.height == full and not held:
        return frame, None
    mean = f"{moments[0]:.3g}" if moments is not None else "unknown"
    refs = int(frame["hash_ids"].list.len().sum()) if frame.height else 0
    note = (f"plan workload capped: the fleet claims {observed.arrival_rate_rps or 0.0:.3g} req/s and "
            f"{mean}-token prompts over {duration_s:g} s; replaying {frame.height} requests and {refs} block "
            f"references (caps: {max_requests} requests, {max_block_refs} block references)")
    return frame, note


def fitted_workload(observed: ObservedWorkload, *, duration_s: float = 300.0, max_requests: int | None = 2000,
                    max_block_refs: int | None = None, seed: int = 0) -> pl.DataFrame:
    """The workload frame (simulator WORKLOAD_SCHEMA) of `capped_workload`, deterministic per seed."""
    return capped_workload(observed, duration_s=duration_s, max_requests=max_requests,
                           max_block_refs=max_block_refs, seed=seed)[0]


__all__ = ["ObservedWorkload", "capped_workload", "fit_phase", "fitted_workload", "length_moments"]
