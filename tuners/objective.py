"""What a trial measured, and how that becomes optuna objective values.

The single objective (default) is TTFT p95 (or p50) plus the memory cost at a stated exchange
rate: `memory_ms_per_gib` milliseconds of TTFT for every GiB of host memory the CPU buffer pins
across the fleet (default 2 ms/GiB: 32 GiB more must buy 64 ms of p95). So a configuration that
uses 2.6x the fleet's memory to gain 4% of p95 loses unless the gain is worth the memory. A rate
of 0 tunes TTFT alone. Hit ratio is recorded on the trial and breaks ties. In multi-objective
mode TTFT, hit ratio and memory are objectives of their own and the study returns a Pareto front
(the rate is not used there).
"""
from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence
from typing import Any, Literal

import numpy as np

Metric = Literal["ttft_p95", "ttft_p50"]
METRICS: tuple[str, ...] = ("ttft_p95", "ttft_p50")
DEFAULT_MEMORY_MS_PER_GIB = 2.0


@dataclasses.dataclass(frozen=True)
class TtftObservations:
    """TTFT observations over a window: raw samples (seconds) and/or histogram bucket deltas.

    `buckets` are (upper bound `le` in seconds, count in that bucket, *not* cumulative), sorted by
    bound, the last bound may be +inf. Either form feeds the regression tests in `tuners.stats`.
    """

    samples: tuple[float, ...] | None = None
    buckets: tuple[tuple[float, float], ...] | None = None

    def __post_init__(self) -> None:
        if self.samples is None and self.buckets is None:
            raise ValueError("TtftObservations needs samples or buckets")
        if self.buckets is not None:
            bounds = [b for b, _ in self.buckets]
            if bounds != sorted(bounds):
                raise ValueError(f"bucket bounds must be sorted, got {bounds}")
            if any(c < 0 for _, c in self.buckets):
                raise ValueError("bucket counts must be >= 0 (deltas of cumulative counters)")

    @classmethod
    def from_cumulative(cls, bounds: Sequence[float], before: Sequence[float],
                        after: Sequence[float]) -> TtftObservations:
        """Per-bucket counts from two scrapes of a Prometheus histogram's cumulative `_bucket`s."""
        delta = np.maximum(np.asarray(after, float) - np.asarray(before, float), 0.0)
        per_bucket = np.diff(np.concatenate([[0.0], delta]))
        return cls(buckets=tuple(zip(map(float, bounds), np.maximum(per_bucket, 0.0).tolist())))

    @property
    def count(self) -> int:
        if self.samples is not None:
            return len(self.samples)
        return int(sum(c for _, c in self.buckets or ()) + 0.5)

    def quantile(self, q: float) -> float:
        if self.samples is not None:
            return float(np.quantile(np.asarray(self.samples), q)) if self.samples else math.nan
        return bucket_quantile(self.buckets or (), q)


def bucket_quantile(buckets: Sequence[tuple[float, float]], q: float) -> float:
    """Quantile from per-bucket counts, interpolated linearly inside a bucket (as PromQL does)."""
    total = sum(c for _, c in buckets)
    if total <= 0:
        return math.nan
    rank = q * total
    lower, seen = 0.0, 0.0
    for le, count in buckets:
        if seen + count >= rank and count > 0:
            if math.isinf(le):
                return lower
            return lower + (le - lower) * (rank - seen) / count
        seen += count
        lower = le if not math.isinf(le) else lower
    return lower


@dataclasses.dataclass(frozen=True)
class Evaluation:
    """The result of evaluating one configuration (on the twin or live)."""

    ttft_p50_s: float
    ttft_p95_s: float
    hit_ratio: float
    memory_gib: float
    requests: int = 0
    ttft: TtftObservations | None = None
    source: str = "twin"

    def metric(self, name: str) -> float:
        if name == "ttft_p95":
            return self.ttft_p95_s
        if name == "ttft_p50":
            return self.ttft_p50_s
        raise ValueError(f"unknown metric {name!r}; valid: {', '.join(METRICS)}")

    def attrs(self) -> dict[str, Any]:
        """JSON-safe summary stored as trial user attributes."""
        return {"ttft_p50_s": self.ttft_p50_s, "ttft_p95_s": self.ttft_p95_s,
                "hit_ratio": self.hit_ratio, "memory_gib": self.memory_gib,
                "requests": self.requests, "source": self.source}


@dataclasses.dataclass(frozen=True)
class ObjectiveSpec:
    """metric: ttft_p95 (default) or ttft_p50. multi: also hit ratio and memory as objectives.
    memory_ms_per_gib: single objective only, the TTFT milliseconds one GiB of fleet host memory
    is worth (0: TTFT alone)."""

    metric: str = "ttft_p95"
    multi: bool = False
    memory_ms_per_gib: float = DEFAULT_MEMORY_MS_PER_GIB

    def __post_init__(self) -> None:
        if self.metric not in METRICS:
            raise ValueError(f"objective metric: invalid value {self.metric!r}; valid: {', '.join(METRICS)}")
        if not (math.isfinite(self.memory_ms_per_gib) and self.memory_ms_per_gib >= 0):
            raise ValueError(f"objective memory_ms_per_gib: must be a number >= 0, got {self.memory_ms_per_gib!r}")

    @property
    def names(self) -> tuple[str, ...]:
        if self.multi:
            return (f"{self.metric}_s", "hit_ratio", "memory_gib")
        return (f"{self.metric}_s + memory" if self.memory_ms_per_gib else f"{self.metric}_s",)

    def memory_cost_s(self, memory_gib: float) -> float:
        """The memory term of the single objective, in seconds of TTFT."""
        return self.memory_ms_per_gib / 1000.0 * memory_gib

    @property
    def directions(self) -> tuple[str, ...]:
        return ("minimize", "maximize", "minimize") if self.multi else ("minimize",)

    def values(self, ev: Evaluation) -> tuple[float, ...]:
        primary = ev.metric(self.metric)
        if not math.isfinite(primary):
            raise ValueError(f"{self.metric} is not finite ({primary}); no requests measured?")
        if self.multi:
            return (primary, ev.hit_ratio, ev.memory_gib)
        memory = ev.memory_gib if math.isfinite(ev.memory_gib) else 0.0
        return (primary + self.memory_cost_s(memory),)

    def sort_key(self, primary: float, ev_attrs: Mapping[str, Any] | None = None) -> tuple[float, float, float]:
        """Single-objective order: primary metric, then higher hit ratio, then less memory."""
        ev_attrs = ev_attrs or {}
        hit = ev_attrs.get("hit_ratio")
        hit = 0.0 if hit is None or not math.isfinite(float(hit)) else float(hit)
        return (primary, -hit, float(ev_attrs.get("memory_gib") or 0.0))
