"""Prometheus export: a custom Collector over the agent's latest snapshot.

Each `collect()` builds fresh families from the snapshot, so a pod that vanished from discovery
vanishes from /metrics too. Register it in a `CollectorRegistry` of your own (never the global
one) and serve it in the classic text format (`generate_latest`), which keeps colons intact.
The catalogue (names, types, labels, units) is in docs/metrics.md.
"""
from __future__ import annotations

from collections.abc import Callable, Iterator

from prometheus_client import CollectorRegistry
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from contracts.tier_model import Snapshot
from exporters.histograms import histogram_families

TIER_LABELS = ["pod", "model", "tier", "source"]


def _q(q: float) -> str:
    return f"{q:g}"


class SnapshotCollector(Collector):
    """Unified tier metrics and agent health, read from `get_snapshot()` at every scrape."""

    def __init__(self, get_snapshot: Callable[[], Snapshot]):
        self.get_snapshot = get_snapshot

    def describe(self) -> list[Metric]:
        return []  # dynamic label sets: skip describe-time collection

    def collect(self) -> Iterator[Metric]:
        snap = self.get_snapshot()
        yield from tier_families(snap)
        yield from histogram_families(snap)
        yield from pressure_families(snap)
        yield from health_families(snap)


def tier_families(snap: Snapshot) -> Iterator[Metric]:
    lookup = CounterMetricFamily(
        "tierpilot_kv_lookup_tokens", "Tokens that reached this tier's lookup (lifetime total).", labels=TIER_LABELS)
    hit = CounterMetricFamily(
        "tierpilot_kv_hit_tokens", "Tokens served from this tier (lifetime total).", labels=TIER_LABELS)
    hit_ratio = GaugeMetricFamily(
        "tierpilot_kv_hit_ratio", "Tier-conditional hit ratio (hits / lookups at this tier) over the window, 0..1.",
        labels=TIER_LABELS)
    cumulative = GaugeMetricFamily(
        "tierpilot_kv_cumulative_hit_ratio",
        "Share of prompt tokens served by this tier or one above it over the window, 0..1.",
        labels=["pod", "model", "tier"])
    evicted = {
        "chunks": CounterMetricFamily("tierpilot_kv_evicted_chunks", "LMCache chunks evicted from this tier.",
                                      labels=TIER_LABELS),
        "files": CounterMetricFamily("tierpilot_kv_evicted_files",
                                     "Files evicted from the L2 pool (Curvine quota eviction).", labels=TIER_LABELS),
        "bytes": CounterMetricFamily("tierpilot_kv_evicted_bytes",
                                     "Bytes freed by L2 pool eviction (Curvine quota eviction).", labels=TIER_LABELS),
    }
    usage = GaugeMetricFamily("tierpilot_kv_usage_ratio", "Fraction of this tier's capacity in use, 0..1.",
                              labels=TIER_LABELS)
    read_seconds = CounterMetricFamily(
        "tierpilot_kv_read_seconds", "Seconds spent reading chunks of this tier into the tier above (lifetime).",
        labels=TIER_LABELS)
    read_latency = GaugeMetricFamily(
        "tierpilot_kv_read_latency_seconds", "Mean seconds to read one chunk from this tier over the window.",
        labels=TIER_LABELS)
    for t in snap.tiers:
        labels = [t.pod, t.model, t.tier, t.source]
        if t.read_seconds is not None:
            read_seconds.add_metric(labels, t.read_seconds)
        if t.read_latency_seconds is not None:
            read_latency.add_metric(labels, t.read_latency_seconds)
        if t.lookup_tokens is not None:
            lookup.add_metric(labels, t.lookup_tokens)
        if t.hit_tokens is not None:
            hit.add_metric(labels, t.hit_tokens)
        if t.hit_ratio is not None:
            hit_ratio.add_metric(labels, t.hit_ratio)
        if t.cumulative_hit_ratio is not None:
            cumulative.add_metric([t.pod, t.model, t.tier], t.cumulative_hit_ratio)
        for unit, value in (("chunks", t.evicted_chunks), ("files", t.evicted_files), ("bytes", t.evicted_bytes)):
            if value is not None:
                evicted[unit].add_metric(labels, value)
        if t.usage_ratio is not None:
            usage.add_metric(labels, t.usage_ratio)
    yield from (lookup, hit, hit_ratio, cumulative, *evicted.values(), usage, read_seconds, read_latency)

    ttft = GaugeMetricFamily("tierpilot_ttft_quantile_seconds",
                             "Time to first token quantile over the window (histogram_quantile), seconds.",
                             labels=["pod", "model", "q"])
    prompt = CounterMetricFamily("tierpilot_kv_prompt_tokens", "Prompt (prefill) tokens (lifetime total).",
                                 labels=["pod", "model"])
    requests = CounterMetricFamily("tierpilot_requests", "Finished requests (lifetime total).",
                                   labels=["pod", "model"])
    break_even = GaugeMetricFamily(
        "tierpilot_l2_break_even_prompt_tokens",
        "Estimated prompt length above which an L2 read beats recomputing the prefill, tokens.",
        labels=["pod", "model"])
    for p in snap.pods:
        for q, v in sorted(p.ttft_quantiles.items()):
            ttft.add_metric([p.pod, p.model, _q(q)], v)
        if p.prompt_tokens is not None:
            prompt.add_metric([p.pod, p.model], p.prompt_tokens)
        if p.requests is not None:
            requests.add_metric([p.pod, p.model], p.requests)
        if p.l2_break_even_tokens is not None:
            break_even.add_metric([p.pod, p.model], p.l2_break_even_tokens)
    l2 = GaugeMetricFamily("tierpilot_l2_io_latency_quantile_seconds",
                           "L2 I/O latency quantile over the window, seconds: per FUSE I/O (source curvine_fuse) "
                           "or per LMCache remote request (source lmcache_*).",
                           labels=["pod", "op", "source", "q"])
    for io in snap.l2_io:
        for q, v in sorted(io.quantiles.items()):
            l2.add_metric([io.pod, io.op, io.source, _q(q)], v)
    yield from (ttft, prompt, requests, break_even, l2)


def pressure_families(snap: Snapshot) -> Iterator[Metric]:
    """GPU pressure and capacity from vLLM, and the per-tier sampled block ages."""
    pl = ["pod", "model"]
    capacity = GaugeMetricFamily(
        "tierpilot_gpu_capacity_tokens",
        "GPU KV capacity in tokens (vllm:cache_config_info num_gpu_blocks x block_size, summed over engines).",
        labels=pl)
    waiting = GaugeMetricFamily("tierpilot_requests_waiting", "Requests waiting to be scheduled (vLLM gauge).",
                                labels=pl)
    preemptions = CounterMetricFamily("tierpilot_preemptions", "Requests preempted by vLLM (lifetime total).",
                                      labels=pl)
    for p in snap.pods:
        for family, value in ((capacity, p.gpu_capacity_tokens), (waiting, p.requests_waiting),
                              (preemptions, p.preemptions)):
            if value is not None:
                family.add_metric([p.pod, p.model], value)
    ages = GaugeMetricFamily(
        "tierpilot_eviction_age_seconds",
        "Quantile of a sampled block-age histogram of one tier over the window, seconds: measure = lifetime "
        "(allocation to eviction), idle_before_evict (last use to eviction) or reuse_gap.",
        labels=["pod", "tier", "measure", "q"])
    for a in snap.eviction_ages:
        for q, v in sorted(a.quantiles.items()):
            ages.add_metric([a.pod, a.tier, a.measure, _q(q)], v)
    yield from (capacity, waiting, preemptions, ages)


def health_families(snap: Snapshot) -> Iterator[Metric]:
    up = GaugeMetricFamily("tierpilot_target_up", "1 if the last scrape of the target succeeded, else 0 "
                           "(tierpilot_target_down_reason says why).", labels=["target", "role", "pod"])
    down = GaugeMetricFamily(
        "tierpilot_target_down_reason",
        "1 while the target is down, with the reason of its last attempt (connection_refused, timeout, http_5xx, "
        "parse_error, counter_reset, ...; see docs/metrics.md). Absent while it is up.",
        labels=["target", "role", "pod", "reason"])
    duration = GaugeMetricFamily("tierpilot_scrape_duration_seconds", "Duration of the last scrape, seconds.",
                                 labels=["target", "role", "pod"])
    errors = CounterMetricFamily("tierpilot_scrape_errors", "Scrape faults and data anomalies by reason.",
                                 labels=["target", "role", "pod", "reason"])
    samples = GaugeMetricFamily("tierpilot_scrape_samples", "Sample lines in the last successful payload.",
                                labels=["target", "role", "pod"])
    warning = GaugeMetricFamily(
        "tierpilot_target_warning",
        "1 while the last scrape of the target raised this warning (no_mapped_series, lmcache_series_missing; "
        "see docs/runbooks.md). The target stays up.", labels=["target", "role", "pod", "reason"])
    targets_by_role: dict[str, int] = {}
    for st in snap.targets:
        t = st.target
        labels = [t.key, t.role, t.pod]
        up.add_metric(labels, 1.0 if st.up else 0.0)
        if not st.up:
            down.add_metric([*labels, st.reason or "down"], 1.0)
        duration.add_metric(labels, st.duration_s)
        samples.add_metric(labels, float(st.samples))
        for reason, n in sorted(st.errors.items()):
            errors.add_metric([*labels, reason], float(n))
        for reason, _detail in st.warnings:
            warning.add_metric([*labels, reason], 1.0)
        targets_by_role[t.role] = targets_by_role.get(t.role, 0) + 1
    targets = GaugeMetricFamily("tierpilot_targets", "Targets currently discovered, by role.", labels=["role"])
    for role, n in sorted(targets_by_role.items()):
        targets.add_metric([role], float(n))
    cycle = GaugeMetricFamily("tierpilot_scrape_cycle_duration_seconds",
                              "Wall time of the last full scrape cycle (fetch, parse, normalise, store), seconds.")
    cycle.add_metric([], snap.cycle_duration_s)
    rows = GaugeMetricFamily("tierpilot_store_rows", "Rows held in the rolling window store.")
    rows.add_metric([], float(snap.store_rows))
    taken = GaugeMetricFamily("tierpilot_snapshot_timestamp_seconds",
                              "Unix time the served snapshot was computed (0 before the first cycle).")
    taken.add_metric([], snap.taken_at)
    yield from (up, down, duration, errors, samples, warning, targets, cycle, rows, taken)


def build_registry(get_snapshot: Callable[[], Snapshot], extra: tuple[Collector, ...] = ()) -> CollectorRegistry:
    """A fresh registry with the snapshot collector and any extra collectors (tuner, actuation...)."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(SnapshotCollector(get_snapshot))
    for c in extra:
        registry.register(c)
    return registry
