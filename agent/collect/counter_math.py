"""Pure numeric helpers with Prometheus semantics: counter increases and histogram quantiles."""
from __future__ import annotations

import itertools
import math
from collections.abc import Iterable, Sequence

INF = math.inf


def counter_delta(previous: float | None, current: float) -> float:
    """Increase between two consecutive samples of a counter. A drop means the counter was reset
    (the process restarted), so the new value is the increase since the reset: never negative."""
    if previous is None:
        return current
    if current < previous:
        return current
    return current - previous


def counter_increase(values: Sequence[float]) -> float:
    """Total increase over consecutive samples, reset-aware (no extrapolation)."""
    total = 0.0
    for prev, cur in itertools.pairwise(values):
        total += counter_delta(prev, cur)
    return total


def _monotonic(counts: list[float]) -> list[float]:
    """Prometheus' ensureMonotonic: a bucket may not be below the one before it."""
    out: list[float] = []
    top = -INF
    for c in counts:
        top = max(top, c)
        out.append(top)
    return out


def histogram_quantile(q: float, buckets: Iterable[tuple[float, float]]) -> float:
    """`histogram_quantile(q, ...)` over (upper bound, cumulative count) pairs, as Prometheus does.

    - q < 0 gives -Inf, q > 1 gives +Inf, NaN q gives NaN;
    - fewer than two buckets, no +Inf bucket, or zero observations give NaN;
    - the rank falling in the +Inf bucket returns the largest finite upper bound;
    - the first bucket interpolates from 0 when its upper bound is positive;
    - otherwise linear interpolation inside the bucket that holds the rank.
    """
    return histogram_quantiles((q,), buckets)[0]


def histogram_quantiles(qs: Sequence[float], buckets: Iterable[tuple[float, float]]) -> list[float]:
    """`histogram_quantile` of each of `qs` over one histogram, which is sorted and made monotonic once."""
    prepared = _prepare_buckets(buckets)
    return [_quantile_of(q, prepared) for q in qs]


def _prepare_buckets(buckets: Iterable[tuple[float, float]]) -> tuple[list[float], list[float]] | None:
    """(bounds, monotonic cumulative counts) with duplicate bounds merged, or None when no quantile
    exists (fewer than two buckets, no +Inf bucket, no observations)."""
    pairs = sorted(buckets)
    if len(pairs) < 2 or pairs[-1][0] != INF:
        return None
    # merge duplicate bounds (summing is what Prometheus does for equal `le` after aggregation)
    merged: list[tuple[float, float]] = []
    for le, c in pairs:
        if merged and merged[-1][0] == le:
            merged[-1] = (le, merged[-1][1] + c)
        else:
            merged.append((le, c))
    counts = _monotonic([c for _, c in merged])
    total = counts[-1]
    if total <= 0 or math.isnan(total):
        return None
    return [le for le, _ in merged], counts


def _quantile_of(q: float, prepared: tuple[list[float], list[float]] | None) -> float:
    if math.isnan(q):
        return math.nan
    if q < 0:
        return -INF
    if q > 1:
        return INF
    if prepared is None:
        return math.nan
    bounds, counts = prepared
    rank = q * counts[-1]
    b = 0
    while b < len(counts) - 1 and counts[b] < rank:
        b += 1
    if b == len(bounds) - 1:
        return bounds[-2]
    if b == 0 and bounds[0] <= 0:
        return bounds[0]
    lower = 0.0 if b == 0 else bounds[b - 1]
    below = 0.0 if b == 0 else counts[b - 1]
    in_bucket = counts[b] - below
    upper = bounds[b]
    if in_bucket <= 0:
        return upper
    return lower + (upper - lower) * ((rank - below) / in_bucket)


def ratio(num: float | None, den: float | None) -> float | None:
    """num / den clipped to 0..1; None when there is no denominator (no traffic, no ratio)."""
    if num is None or den is None or den <= 0 or not math.isfinite(num) or not math.isfinite(den):
        return None
    return min(1.0, max(0.0, num / den))
