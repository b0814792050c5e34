"""Histogram families from the snapshot's lifetime buckets: per pod with the source's own bucket
bounds, and a fleet histogram per model (TTFT) or per operation (L2 I/O) that sums the pods whose
bounds agree. Pure functions; `exporters/prom.py` serves them.

A fleet sum only adds buckets with the same upper bounds: the bound set most pods share wins (ties:
the finer set), and pods with other bounds are left out of the sum and counted in
`tierpilot_fleet_excluded_pods` so the omission is visible.
"""
from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

from prometheus_client.core import GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.utils import floatToGoString

from contracts.tier_model import HistogramView, Snapshot


@dataclass(frozen=True, slots=True)
class FleetHistogram:
    """Buckets summed over the pods whose bounds agree; `excluded` pods had other bounds."""

    key: str
    bounds: tuple[float, ...]
    cumulative_counts: tuple[float, ...]
    total: float
    pods: int
    excluded: int


def complete(h: HistogramView) -> bool:
    """One cumulative count per finite bound plus the +Inf bucket."""
    return len(h.cumulative_counts) == len(h.bounds) + 1


def fleet_histograms(keyed: Iterable[tuple[str, HistogramView]]) -> list[FleetHistogram]:
    """Sum histograms per key (a model, an operation) over the pods whose bounds agree."""
    by_key: dict[str, list[HistogramView]] = defaultdict(list)
    for key, h in keyed:
        if complete(h):
            by_key[key].append(h)
    out = []
    for key, hs in sorted(by_key.items()):
        votes = Counter(h.bounds for h in hs)
        bounds = max(votes, key=lambda b: (votes[b], len(b)))
        agree = [h for h in hs if h.bounds == bounds]
        counts = tuple(sum(h.cumulative_counts[i] for h in agree) for i in range(len(bounds) + 1))
        out.append(FleetHistogram(key, bounds, counts, sum(h.total for h in agree), len(agree),
                                  len(hs) - len(agree)))
    return out


def _buckets(bounds: tuple[float, ...], counts: tuple[float, ...]) -> list[tuple[str, float]]:
    return [(floatToGoString(b), c) for b, c in zip((*bounds, float("inf")), counts, strict=True)]


def histogram_families(snap: Snapshot) -> Iterator[Metric]:
    ttft = HistogramMetricFamily(
        "tierpilot_ttft_seconds",
        "Time to first token per pod and model, seconds: vLLM's lifetime buckets with its own bounds.",
        labels=["pod", "model"])
    for h in snap.ttft_histograms:
        if complete(h):
            ttft.add_metric([h.pod, h.model], _buckets(h.bounds, h.cumulative_counts), h.total)
    l2 = HistogramMetricFamily(
        "tierpilot_l2_io_latency_seconds",
        "L2 I/O latency per pod and operation, seconds, in the source's buckets: per FUSE I/O (source "
        "curvine_fuse) or per LMCache remote request (source lmcache_*).",
        labels=["pod", "op", "source"])
    l2_keyed = []
    for io in snap.l2_io:
        if io.histogram is not None and complete(io.histogram):
            l2.add_metric([io.pod, io.op, io.source], _buckets(io.histogram.bounds, io.histogram.cumulative_counts),
                          io.histogram.total)
            l2_keyed.append((f"{io.op}\t{io.source}", io.histogram))
    yield ttft
    yield l2

    excluded = GaugeMetricFamily(
        "tierpilot_fleet_excluded_pods",
        "Pods left out of a fleet histogram (family; key = its model or op; source for L2) because their "
        "bucket bounds differ from the fleet's.",
        labels=["family", "key", "source"])
    fleet_ttft = HistogramMetricFamily(
        "tierpilot_fleet_ttft_seconds",
        "Time to first token of all pods of a model whose bucket bounds agree, seconds.", labels=["model"])
    for f in fleet_histograms((h.model, h) for h in snap.ttft_histograms):
        fleet_ttft.add_metric([f.key], _buckets(f.bounds, f.cumulative_counts), f.total)
        excluded.add_metric(["tierpilot_fleet_ttft_seconds", f.key, ""], float(f.excluded))
    fleet_l2 = HistogramMetricFamily(
        "tierpilot_fleet_l2_io_latency_seconds",
        "L2 I/O latency of all pods whose bucket bounds agree, by operation and source, seconds.",
        labels=["op", "source"])
    for f in fleet_histograms(l2_keyed):
        op, source = f.key.split("\t")
        fleet_l2.add_metric([op, source], _buckets(f.bounds, f.cumulative_counts), f.total)
        excluded.add_metric(["tierpilot_fleet_l2_io_latency_seconds", op, source], float(f.excluded))
    yield from (fleet_ttft, fleet_l2, excluded)
