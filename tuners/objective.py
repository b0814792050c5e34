"""What a trial measured, and how that becomes optuna objective values.

The primary objective is TTFT p95 (default) or p50, minimised. Hit ratio (maximised) and memory
cost (host GiB pinned by the CPU buffer across the fleet, minimised) are secondary: in
single-objective mode they are recorded on the trial and break ties; in multi-objective mode
they are objectives of their own and the study returns a Pareto front.
"""
from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence
from typing import Any, Literal

import numpy as np

Metric = Literal["ttft_p95", "ttft_p50"]
METRICS: tuple[str, ...] = ("ttft_p95", "ttft_p50")


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
    """metric: ttft_p95 (default) or ttft_p50. multi: also hit ratio and memory as objectives."""

    metric: str = "ttft_p95"
    multi: bool = False

    def __post_init__(self) -> None:
        if self.metric not in METRICS:
            raise ValueError(f"objective metric: invalid value {self.metric!r}; valid: {', '.join(METRICS)}")

    @property
    def names(self) -> tuple[str, ...]:
        return (f"{self.metric}_s", "hit_ratio", "memory_gib") if self.multi else (f"{self.metric}_s",)

    @property
    def directions(self) -> tuple[str, ...]:
        return ("minimize", "maximize", "minimize") if self.multi else ("minimize",)

    def values(self, ev: Evaluation) -> tuple[float, ...]:
        primary = ev.metric(self.metric)
        if not math.isfinite(primary):
            raise ValueError(f"{self.metric} is not finite ({primary}); no requests measured?")
        if self.multi:
            return (primary, ev.hit_ratio, ev.memory_gib)
        return (primary,)

    def sort_key(self, primary: float, ev_attrs: Mapping[str, Any] | None = None) -> tuple[float, float, float]:
        """Single-objective order: primary metric, then higher hit ratio, then less memory."""
        ev_attrs = ev_attrs or {}
        hit = ev_attrs.get("hit_ratio")
        hit = 0.0 if hit is None or not math.isfinite(float(hit)) else float(hit)
        return (primary, -hit, float(ev_attrs.get("memory_gib") or 0.0))
