"""No single pod steers the fleet: the windows the tuner plans and judges on, made robust.

The twin is fitted to fleet sums of per-pod counters (arrival rate, prompt-length mix, cumulative
hit ratio, TTFT sum and count, waiting requests), and the post-trial judge reads the same summed
histograms. One pod reporting 20x the requests, 12k-token prompts and a 9 s TTFT would dominate
every one of them. So, per window:

- each pod's statistics are read from its own rows: request rate, prompt tokens per request,
  prompt tokens per second, mean TTFT and the cumulative hit ratio;
- a pod is an outlier when a statistic is implausible on its own (more than `max_pod_rps`
  requests/s, or more prompt tokens per second than `max_pod_prompt_tokens_per_s`, the most a
  model's prefill can take), or, among at least `min_pods` pods with traffic of the same model,
  when its rate is above `max_ratio` x the median, its prompt length or mean TTFT outside
  [median / max_ratio, median x max_ratio], or its hit ratio more than `max_hit_gap` from the median;
- an outlier pod's rows are replaced by those of the median pod of its model (the inlier with
  the median request count): the fleet's sums stay fleet-sized, each pod weighs at most
  `max_ratio` x the median, and what the outlier claimed has no weight. With no inlier left
  (a one-pod fleet reporting the implausible), its rows are dropped.

`robust_window(window, bounds)` is pure: the window aggregate in, the robust window and the
outliers (pod -> reason) out. `RobustFleet(store, bounds)` serves `window_between` over a store
that way, counts the outliers per pod and reason (`tierpilot_fleet_outlier_windows_total`) and
logs a pod when it becomes an outlier.
"""
from __future__ import annotations

import dataclasses
import logging
import math
import threading
from collections.abc import Iterator, Mapping
from typing import Any

import polars as pl
from prometheus_client.core import CounterMetricFamily, Metric

from agent.collect.window import signal_values
from agent.runtime.tuning_bridge import deepest_cumulative_ratio

log = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class FleetBounds:
    """What one pod may claim (agent.settings.tuner `tuner.fleet_bounds`; the defaults live there)."""

    max_ratio: float
    max_hit_gap: float
    max_pod_rps: float
    max_pod_prompt_tokens_per_s: float
    min_pods: int


@dataclasses.dataclass(frozen=True)
class PodStats:
    pod: str
    model: str
    requests: float
    rate: float
    prompt_per_request: float | None
    prompt_per_s: float | None
    ttft_mean: float | None
    hit_ratio: float | None


def _seconds(rows: pl.DataFrame) -> float:
    secs = [s for s in rows["seconds"].to_list() if s is not None and s > 0] if "seconds" in rows.columns else []
    return max(secs) if secs else 0.0


def pod_stats(window: pl.DataFrame) -> list[PodStats]:
    """Each (pod, model)'s own statistics over a window aggregate."""
    out = []
    for (pod, model), rows in sorted(window.group_by(["pod", "model"]), key=lambda kv: (str(kv[0][0]), str(kv[0][1]))):
        values, _ = signal_values(rows)
        n = values.get("ttft_seconds:count", values.get("requests", 0.0)) or 0.0
        secs = _seconds(rows)
        prompt = values.get("prompt_tokens")
        ttft = values.get("ttft_seconds:sum")
        hit = deepest_cumulative_ratio(rows) if n > 0 else None
        out.append(PodStats(
            pod=str(pod), model=str(model), requests=n, rate=n / secs if secs > 0 else 0.0,
            prompt_per_request=prompt / n if prompt is not None and n > 0 else None,
            prompt_per_s=prompt / secs if prompt is not None and secs > 0 else None,
            ttft_mean=ttft / n if ttft is not None and n > 0 else None,
            hit_ratio=hit if hit is not None and math.isfinite(hit) else None))
    return out


def _median(xs: list[float]) -> float | None:
    xs = sorted(x for x in xs if x is not None and math.isfinite(x))
    if not xs:
        return None
    mid = len(xs) // 2
    return xs[mid] if len(xs) % 2 else (xs[mid - 1] + xs[mid]) / 2.0


def _outside(x: float | None, median: float | None, ratio: float) -> bool:
    if x is None or median is None or median <= 0:
        return False
    return x > median * ratio or x < median / ratio


def _implausible(s: PodStats, b: FleetBounds) -> str | None:
    for name, value in (("requests", s.requests), ("rate", s.rate), ("prompt_per_s", s.prompt_per_s),
                        ("ttft_mean", s.ttft_mean), ("hit_ratio", s.hit_ratio)):
        if value is not None and (not math.isfinite(value) or value < 0):
            return f"{name} not a finite non-negative number"
    if s.rate > b.max_pod_rps:
        return f"{s.rate:.3g} requests/s > {b.max_pod_rps:g} (tuner.fleet_bounds.max_pod_rps)"
    if s.prompt_per_s is not None and s.prompt_per_s > b.max_pod_prompt_tokens_per_s:
        return (f"{s.prompt_per_s:.3g} prompt tokens/s > {b.max_pod_prompt_tokens_per_s:g} "
                "(tuner.fleet_bounds.max_pod_prompt_tokens_per_s, the prefill's most)")
    return None


def fleet_outliers(stats: list[PodStats], bounds: FleetBounds) -> dict[tuple[str, str], str]:
    """(pod, model) -> why it is set aside; pods without a reason are inliers."""
    out: dict[tuple[str, str], str] = {}
    for s in stats:
        why = _implausible(s, bounds)
        if why:
            out[(s.pod, s.model)] = why
    by_model: dict[str, list[PodStats]] = {}
    for s in stats:
        if s.requests > 0 and (s.pod, s.model) not in out:
            by_model.setdefault(s.model, []).append(s)
    r = bounds.max_ratio
    for pods in by_model.values():
        if len(pods) < bounds.min_pods:
            continue
        rate = _median([p.rate for p in pods])
        length = _median([p.prompt_per_request for p in pods if p.prompt_per_request is not None])
        ttft = _median([p.ttft_mean for p in pods if p.ttft_mean is not None])
        hit = _median([p.hit_ratio for p in pods if p.hit_ratio is not None])
        for p in pods:
            why = None
            if rate and p.rate > rate * r:
                why = f"{p.rate:.3g} requests/s, {p.rate / rate:.1f}x the median pod"
            elif _outside(p.prompt_per_request, length, r):
                why = f"{p.prompt_per_request:.3g} prompt tokens per request against a median of {length:.3g}"
            elif _outside(p.ttft_mean, ttft, r):
                why = f"mean TTFT {p.ttft_mean:.3g} s against a median of {ttft:.3g} s"
            elif p.hit_ratio is not None and hit is not None and abs(p.hit_ratio - hit) > bounds.max_hit_gap:
                why = f"hit ratio {p.hit_ratio:.2f} against a median of {hit:.2f}"
            if why:
                out[(p.pod, p.model)] = why
    return out


def robust_window(window: pl.DataFrame, bounds: FleetBounds) -> tuple[pl.DataFrame, dict[tuple[str, str], str]]:
    """The window with each outlier pod's rows replaced by its model's median inlier pod's rows
    (relabelled), or dropped when its model has no inlier; and the outliers."""
    if window.height == 0:
        return window, {}
    stats = pod_stats(window)
    outliers = fleet_outliers(stats, bounds)
    if not outliers:
        return window, {}
    keep = pl.struct(["pod", "model"]).map_elements(
        lambda r: (r["pod"], r["model"]) not in outliers, return_dtype=pl.Boolean)
    parts = [window.filter(keep)]
    for model in sorted({m for _, m in outliers}):
        inliers = sorted((s for s in stats if s.model == model and (s.pod, s.model) not in outliers and s.requests > 0),
                         key=lambda s: (s.requests, s.pod))
        if not inliers:
            continue
        median_pod = inliers[(len(inliers) - 1) // 2].pod
        rows = window.filter((pl.col("pod") == median_pod) & (pl.col("model") == model))
        for pod, m in sorted(outliers):
            if m == model:
                parts.append(rows.with_columns(pl.lit(pod).cast(window.schema["pod"]).alias("pod")))
    return pl.concat(parts, how="vertical"), outliers


class RobustFleet:
    """`window_between(since, until)` and `window(window_s)` of `store`, made robust
    (`robust_window`); outliers counted and logged."""

    def __init__(self, store: Any, bounds: FleetBounds) -> None:
        self.store, self.bounds = store, bounds
        self._lock = threading.Lock()
        self.counts: dict[tuple[str, str], int] = {}  # (pod, reason kind) -> windows set aside
        self._logged: dict[str, str] = {}

    def window_between(self, since: float, until: float) -> pl.DataFrame:
        return self._robust(self.store.window_between(since, until))

    def window(self, window_s: float | None = None, now: float | None = None) -> pl.DataFrame:
        """The store's latest window (`window_s` up to `now`), made robust: what the drift signals
        and the fitted workload's rate read."""
        return self._robust(self.store.window(window_s, now))

    def _robust(self, frame: pl.DataFrame) -> pl.DataFrame:
        window, outliers = robust_window(frame, self.bounds)
        with self._lock:
            for (pod, _model), why in outliers.items():
                kind = _kind(why)
                self.counts[(pod, kind)] = self.counts.get((pod, kind), 0) + 1
                if self._logged.get(pod) != kind:
                    self._logged[pod] = kind
                    log.warning("fleet outlier: pod %s is set aside in the tuner's windows (%s); the median pod "
                                "stands in for it", pod, why)
        return window

    def __getattr__(self, name: str) -> Any:  # everything else is the store's
        return getattr(self.store, name)

    def collector(self) -> RobustFleetCollector:
        return RobustFleetCollector(self)


def planning_view(settings: Any, store: Any) -> RobustFleet:
    """What the tuner plans, judges and watches for drift on: `store` under the settings'
    `tuner.fleet_bounds`. `tierpilot run` and the simulated-clock harness both build it here."""
    return RobustFleet(store, FleetBounds(**settings.tuner.fleet_bounds.model_dump()))


def _kind(why: str) -> str:
    """A short label for a reason: what was out of bounds."""
    for key in ("requests/s", "prompt tokens/s", "prompt tokens per request", "TTFT", "hit ratio"):
        if key in why:
            return key.replace(" ", "_").replace("/", "_per_")
    return "other"


class RobustFleetCollector:
    """`tierpilot_fleet_outlier_windows_total{pod, reason}`."""

    def __init__(self, fleet: RobustFleet) -> None:
        self.fleet = fleet

    def describe(self) -> list[Metric]:
        return []

    def collect(self) -> Iterator[Metric]:
        fam = CounterMetricFamily("tierpilot_fleet_outlier_windows",
                                  "Windows the tuner planned or judged on in which this pod's signals were set "
                                  "aside as an outlier (the median pod stood in for it), by what was out of bounds.",
                                  labels=["pod", "reason"])
        with self.fleet._lock:
            counts: Mapping[tuple[str, str], int] = dict(self.fleet.counts)
        for (pod, reason), n in sorted(counts.items()):
            fam.add_metric([pod, reason], n)
        yield fam


__all__ = ["FleetBounds", "PodStats", "RobustFleet", "fleet_outliers", "planning_view", "pod_stats", "robust_window"]
