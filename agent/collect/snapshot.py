"""Window aggregate + target statuses -> the `Snapshot` the exporters serve. Pure functions.

Per pod and model, `derive_tiers` runs twice: on lifetime totals (the `_total` counters and the
source label) and on window increases (the ratios). A ratio or TTFT quantile whose window saw no
traffic (an idle pod, or a single scrape so far) comes from the lifetime totals instead, so an idle
pod keeps reporting what its cache achieved rather than a gap. Signals without a model (LMCache MP L1 usage,
Curvine FUSE I/O) belong to every model of their pod; a pod with no model at all (a Curvine
master or worker) keeps model "".
"""
from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

import polars as pl

from agent.collect.counter_math import histogram_quantile, histogram_quantiles
from agent.collect.tiers import (
    cumulative_hit_ratios,
    derive_tiers,
    gpu_capacity_tokens,
    l2_break_even_tokens,
    prompt_lookups,
)
from contracts.tier_model import (
    EVICTION_MEASURES,
    QUANTILES,
    EvictionAgeView,
    HistogramView,
    L2IoView,
    PodView,
    Snapshot,
    TargetStatus,
    TierView,
)

# the sampled block-age histograms: signal = f"{tier}_{AGE_SIGNALS[measure]}"
AGE_TIERS = ("gpu", "cpu")
AGE_SIGNALS = {"lifetime": "block_lifetime_seconds", "idle_before_evict": "idle_before_evict_seconds",
               "reuse_gap": "reuse_gap_seconds"}


@dataclass
class SeriesGroup:
    """All window rows of one pod and model, as plain dicts."""

    increase: dict[str, float] = field(default_factory=dict)
    last: dict[str, float] = field(default_factory=dict)
    seconds: dict[str, float] = field(default_factory=dict)
    sources: dict[str, str] = field(default_factory=dict)
    buckets: dict[str, list[tuple[float, float, float]]] = field(default_factory=dict)  # le, inc, last

    def absorb(self, other: SeriesGroup) -> None:
        """Add another group's signals without overriding ours (model-less pod-level signals)."""
        for attr in ("increase", "last", "seconds", "sources", "buckets"):
            mine, theirs = getattr(self, attr), getattr(other, attr)
            for k, v in theirs.items():
                mine.setdefault(k, v)


# the histograms whose buckets the snapshot reads (the others, e.g. prompt length, are the store's)
READ_BUCKETS = ("ttft_seconds", "l2_read_latency_seconds", "l2_write_latency_seconds", "l2_lookup_async_seconds",
                *(f"{tier}_{sig}" for tier in AGE_TIERS for sig in AGE_SIGNALS.values()))


def group_window(window: pl.DataFrame) -> dict[tuple[str, str], SeriesGroup]:
    """Window rows -> per pod and model: scalars by signal, and the histograms the snapshot reads
    as (le, increase, last) rows sorted by `le`. Grouped by polars, so each pod costs a few dict
    builds rather than a Python step per row (2,000 pods: ~70k rows)."""
    groups: dict[tuple[str, str], SeriesGroup] = defaultdict(SeriesGroup)
    cols = window.select("pod", "model", "signal", "le", "source", "increase", "last", "seconds")
    scalars = cols.filter(pl.col("le").is_null()).group_by(["pod", "model"], maintain_order=True).agg(
        "signal", "increase", "last", "seconds", "source")
    for pod, model, signals, incs, lasts, secs, sources in scalars.iter_rows():
        g = groups[(pod, model)]
        g.increase = dict(zip(signals, incs, strict=True))
        g.last = dict(zip(signals, lasts, strict=True))
        g.seconds = {sig: v for sig, v in zip(signals, secs, strict=True) if v is not None}
        g.sources = dict(zip(signals, sources, strict=True))
    buckets = cols.filter(pl.col("le").is_not_null() & pl.col("signal").is_in(READ_BUCKETS)) \
        .sort(["pod", "model", "signal", "le", "increase", "last"]) \
        .group_by(["pod", "model", "signal"], maintain_order=True).agg(
            "le", "increase", "last", source=pl.col("source").first())
    for pod, model, signal, les, incs, lasts, source in buckets.iter_rows():
        g = groups[(pod, model)]
        g.buckets[signal] = list(zip(les, incs, lasts, strict=True))
        g.sources.setdefault(signal, source)
    return merge_model_less(groups)


def merge_model_less(groups: dict[tuple[str, str], SeriesGroup]) -> dict[tuple[str, str], SeriesGroup]:
    by_pod: dict[str, list[str]] = defaultdict(list)
    for pod, model in groups:
        by_pod[pod].append(model)
    out: dict[tuple[str, str], SeriesGroup] = {}
    for pod, models in by_pod.items():
        named = [m for m in models if m]
        bare = groups.get((pod, ""))
        if not named:
            out[(pod, "")] = groups[(pod, "")]
            continue
        for m in named:
            g = groups[(pod, m)]
            if bare is not None:
                g.absorb(bare)
            out[(pod, m)] = g
    return out


def _quantiles(buckets: Iterable[tuple[float, float]], qs: Sequence[float] = QUANTILES) -> dict[float, float]:
    return {q: v for q, v in zip(qs, histogram_quantiles(qs, buckets), strict=True) if not math.isnan(v)}


def build_snapshot(
    window: pl.DataFrame,
    statuses: Iterable[TargetStatus],
    *,
    taken_at: float,
    live_pods: set[str] | None = None,
    kv_bytes_per_token: float | None = None,
    cpu_capacity_bytes: float | None = None,
    cycle_duration_s: float = 0.0,
    store_rows: int = 0,
) -> Snapshot:
    """The unified view. Pods not in `live_pods` (when given) are left out: their series vanish."""
    groups = group_window(window)
    tiers: list[TierView] = []
    pods: list[PodView] = []
    l2_io: list[L2IoView] = []
    ages: list[EvictionAgeView] = []
    hists: list[HistogramView] = []
    io_done: set[str] = set()
    for (pod, model), g in sorted(groups.items()):
        if live_pods is not None and pod not in live_pods:
            continue
        tiers.extend(_tier_views(pod, model, g, kv_bytes_per_token, cpu_capacity_bytes))
        pods.append(_pod_view(pod, model, g, kv_bytes_per_token))
        if pod not in io_done:
            io_done.add(pod)
            for op in ("read", "write"):
                signal = f"l2_{op}_latency_seconds"
                rows = g.buckets.get(signal)
                if rows:
                    idle = rows[-1][1] <= 0  # no I/O in the window: lifetime buckets
                    qs = _quantiles((le, last if idle else inc) for le, inc, last in rows)
                    if qs:
                        l2_io.append(L2IoView(pod, op, qs,  # type: ignore[arg-type]
                                              _histogram_view(pod, "", rows, g.last, signal),
                                              source=g.sources.get(signal, "")))
            for tier in AGE_TIERS:
                for measure in EVICTION_MEASURES:
                    qs = _window_quantiles(g.buckets.get(f"{tier}_{AGE_SIGNALS[measure]}"))
                    if qs:
                        ages.append(EvictionAgeView(pod, tier, measure, qs))  # type: ignore[arg-type]
        ttft = g.buckets.get("ttft_seconds")
        if ttft and model:
            hists.append(_histogram_view(pod, model, ttft, g.last, "ttft_seconds"))
    return Snapshot(
        taken_at=taken_at, tiers=tuple(tiers), pods=tuple(p for p in pods if _has_data(p)),
        l2_io=tuple(l2_io), eviction_ages=tuple(ages), ttft_histograms=tuple(hists), targets=tuple(statuses),
        cycle_duration_s=cycle_duration_s, store_rows=store_rows,
    )


def _window_quantiles(rows: list[tuple[float, float, float]] | None) -> dict[float, float]:
    """Quantiles of a histogram's window increase; lifetime buckets when the window saw nothing."""
    if not rows:
        return {}
    idle = rows[-1][1] <= 0
    return _quantiles((le, last if idle else inc) for le, inc, last in rows)


def _has_data(p: PodView) -> bool:
    return any(v is not None for v in (p.prompt_tokens, p.requests, p.l2_break_even_tokens, p.gpu_capacity_tokens,
                                       p.requests_waiting)) or bool(p.ttft_quantiles)


def _tier_views(pod: str, model: str, g: SeriesGroup, kvbpt: float | None,
                cpu_cap: float | None) -> list[TierView]:
    life = derive_tiers(g.last, g.sources, kv_bytes_per_token=kvbpt, cpu_capacity_bytes=cpu_cap)
    win = {t.tier: t for t in derive_tiers(g.increase, g.sources, kv_bytes_per_token=kvbpt,
                                           cpu_capacity_bytes=cpu_cap)}
    cumulative = cumulative_hit_ratios(list(win.values()), prompt_lookups(g.increase))
    if not cumulative:  # nothing entered the cache in the window: lifetime totals
        cumulative = cumulative_hit_ratios(life, prompt_lookups(g.last))
    out = []
    for t in life:
        w = win.get(t.tier)
        ratio = w.hit_ratio if w is not None else None
        out.append(TierView(
            pod=pod, model=model, tier=t.tier, source=t.source,
            lookup_tokens=t.lookup, hit_tokens=t.hit,
            hit_ratio=ratio if ratio is not None else t.hit_ratio,  # idle window: lifetime totals
            cumulative_hit_ratio=cumulative.get(t.tier),
            evicted_chunks=t.evicted_chunks, evicted_files=t.evicted_files, evicted_bytes=t.evicted_bytes,
            usage_ratio=t.usage, read_seconds=t.read_seconds,
            read_latency_seconds=_first_known(w.read_latency if w is not None else None, t.read_latency),
        ))
    return out


def _first_known(window: float | None, lifetime: float | None) -> float | None:
    return window if window is not None else lifetime


def _rate(g: SeriesGroup, signal: str) -> float | None:
    secs = g.seconds.get(signal)
    if not secs or signal not in g.increase:
        return None
    return g.increase[signal] / secs


def _l2_read_costs(g: SeriesGroup, kvbpt: float | None
                   ) -> tuple[float | None, float | None, float | None, float | None]:
    """(read seconds, read bytes, fixed seconds per read, KV bytes per token) over the window. From
    the L2 read histogram (Curvine FUSE, LMCache) when there is one; for vLLM's native tiering,
    which has none: its fs tier's read time and bytes, the median fs lookup (first retry to
    resolution) as the fixed cost, and the bytes it read per disk-cached token as the KV size."""
    l2_read = g.buckets.get("l2_read_latency_seconds", [])
    inc = g.increase
    if l2_read or "l2_read_seconds" not in inc:
        fixed = histogram_quantile(0.5, [(le, n) for le, n, _ in l2_read]) if l2_read else None
        return inc.get("l2_read_latency_seconds:sum"), inc.get("l2_read_bytes"), fixed, kvbpt
    lookup = g.buckets.get("l2_lookup_async_seconds", [])
    fixed = histogram_quantile(0.5, [(le, n) for le, n, _ in lookup]) if lookup else None
    read_bytes, disk = inc.get("l2_read_bytes"), inc.get("cached_disk_tokens")
    per_token = read_bytes / disk if read_bytes and disk else kvbpt
    return inc["l2_read_seconds"], read_bytes, fixed, per_token


def _pod_view(pod: str, model: str, g: SeriesGroup, kvbpt: float | None) -> PodView:
    ttft = g.buckets.get("ttft_seconds", [])
    if ttft and ttft[-1][1] <= 0:  # no request finished in the window: lifetime buckets
        ttft = [(le, last, last) for le, _, last in ttft]
    break_even = l2_break_even_tokens(
        g.increase.get("prefill_seconds:sum"), g.increase.get("prompt_computed_tokens"),
        *_l2_read_costs(g, kvbpt),
    )
    return PodView(
        pod=pod, model=model,
        prompt_tokens=g.last.get("prompt_tokens"), requests=g.last.get("requests"),
        ttft_quantiles=_quantiles((le, inc) for le, inc, _ in ttft) if ttft else {},
        prompt_token_rate=_rate(g, "prompt_tokens"), request_rate=_rate(g, "requests"),
        l2_break_even_tokens=break_even,
        gpu_capacity_tokens=gpu_capacity_tokens(g.last),
        requests_waiting=g.last.get("requests_waiting"),
        preemptions=g.last.get("preemptions"), preemption_rate=_rate(g, "preemptions"),
    )


def _histogram_view(pod: str, model: str, rows: list[tuple[float, float, float]],
                    last: Mapping[str, float], signal: str) -> HistogramView:
    bounds = tuple(le for le, _, _ in rows if le != math.inf)
    counts = tuple(cum for _, _, cum in rows)
    return HistogramView(pod, model, bounds, counts, last.get(f"{signal}:sum", 0.0),
                         last.get(f"{signal}:count", counts[-1] if counts else 0.0))
