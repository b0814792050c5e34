"""Pure renderers: a snapshot of metric values -> exposition text, byte-faithful per source.

Two encoders, because the real systems use two different client libraries:

* vLLM and in-process LMCache register `prometheus_client` instruments and serve
  `generate_latest()` (classic text format). `render_python_client` builds fresh metric families
  from the snapshot and runs them through that same `generate_latest`, so the bytes are what a
  real vLLM 0.33 server writes: counters get `_total` plus a `_created` gauge family, histograms
  get `_bucket{le=...}`, `_count`, `_sum` and `_created`, and labels come out sorted.
* Curvine (Rust) uses the `prometheus` crate's `TextEncoder`: names exactly as registered (no
  `_total` added, no `_created`), integral values without a decimal point, `le` last.
  `render_rust_text` reproduces that format.

Snapshots are plain data (`MetricSpec` catalogue + `{(name, label values): value}`), so tests
can feed hand-built values and compare exact text.
"""
from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterable, Mapping, Sequence

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.metrics_core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.samples import Sample
from prometheus_client.utils import floatToGoString

KINDS = ("counter", "gauge", "histogram")


@dataclasses.dataclass(frozen=True)
class MetricSpec:
    """One metric family as its source declares it.

    name: the declared name (for prometheus_client counters, without `_total`).
    labels: the label names in declaration order (base labels first).
    buckets: finite upper bounds for histograms (+Inf is implicit).
    """

    name: str
    kind: str
    help: str
    labels: tuple[str, ...]
    buckets: tuple[float, ...] = ()

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"{self.name}: kind {self.kind!r} is not one of {', '.join(KINDS)}")
        if self.kind == "histogram" and (not self.buckets or list(self.buckets) != sorted(set(self.buckets))):
            raise ValueError(f"{self.name}: histogram buckets must be strictly increasing")


@dataclasses.dataclass(frozen=True)
class HistogramValue:
    """Per-bucket (non-cumulative) counts, one per finite bound plus one for +Inf, and the sum."""

    counts: tuple[int, ...]
    sum: float

    @property
    def count(self) -> int:
        return sum(self.counts)

    def cumulative(self) -> list[int]:
        out, acc = [], 0
        for c in self.counts:
            acc += c
            out.append(acc)
        return out


Value = float | HistogramValue
SeriesKey = tuple[str, tuple[str, ...]]  # (declared name, label values in spec order)


@dataclasses.dataclass(frozen=True)
class Snapshot:
    """Everything one endpoint serves at one instant.

    values: {(name, label values): value}; series absent from it are not served (like a
    labelled prometheus_client metric whose child was never created).
    created: unix time the process (re)started; every `_created` series carries it.
    """

    specs: tuple[MetricSpec, ...]
    values: Mapping[SeriesKey, Value]
    created: float


def observe(bounds: Sequence[float], counts: list[int], value: float) -> None:
    """Add one observation to non-cumulative bucket `counts` (len(bounds) + 1), in place.

    Bucket i holds bounds[i-1] < v <= bounds[i], like Prometheus `le` semantics."""
    lo, hi = 0, len(bounds)
    while lo < hi:
        mid = (lo + hi) // 2
        if value <= bounds[mid]:
            hi = mid
        else:
            lo = mid + 1
    counts[lo] += 1


# -- prometheus_client (vLLM, LMCache in-process) -------------------------------------------------
class _SnapshotCollector:
    def __init__(self, snapshot: Snapshot) -> None:
        self._snapshot = snapshot

    def collect(self) -> Iterable[Metric]:
        by_name: dict[str, list[tuple[tuple[str, ...], Value]]] = {}
        for (name, label_values), value in self._snapshot.values.items():
            by_name.setdefault(name, []).append((label_values, value))
        created = self._snapshot.created
        for spec in self._snapshot.specs:
            series = by_name.get(spec.name)
            if not series:
                continue
            labels = list(spec.labels)
            if spec.kind == "counter":
                fam: Metric = CounterMetricFamily(spec.name, spec.help, labels=labels)
                for lv, v in series:
                    fam.add_metric(list(lv), float(v), created=created)  # type: ignore[arg-type]
            elif spec.kind == "gauge":
                fam = GaugeMetricFamily(spec.name, spec.help, labels=labels)
                for lv, v in series:
                    fam.add_metric(list(lv), float(v))  # type: ignore[arg-type]
            else:
                fam = HistogramMetricFamily(spec.name, spec.help, labels=labels)
                for lv, v in series:
                    assert isinstance(v, HistogramValue), spec.name
                    bounds = [floatToGoString(b) for b in spec.buckets] + ["+Inf"]
                    fam.add_metric(list(lv), list(zip(bounds, map(float, v.cumulative()))), v.sum)
                    fam.samples.append(Sample(spec.name + "_created", dict(zip(labels, lv)), created))
            yield fam


def python_client_samples(snapshot: Snapshot) -> Iterable[tuple[str, str, list[Sample]]]:
    """(family name, type, samples) exactly as prometheus_client would write them (counters with
    `_total` and `_created`, histograms with `_bucket`/`_sum`/`_count`, `le` as Go floats), without
    the text: for an in-process reader."""
    for fam in _SnapshotCollector(snapshot).collect():
        yield fam.name, fam.type, fam.samples


def render_python_client(snapshot: Snapshot) -> bytes:
    """The classic text format exactly as prometheus_client's `generate_latest` writes it."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_SnapshotCollector(snapshot))  # type: ignore[arg-type]
    return generate_latest(registry)


# -- Rust prometheus crate (Curvine) ---------------------------------------------------------------
def rust_float(v: float) -> str:
    """Format like Rust's `{}` for f64, as the prometheus crate's TextEncoder does."""
    if math.isnan(v):
        return "NaN"
    if math.isinf(v):
        return "+Inf" if v > 0 else "-Inf"
    if v == int(v) and abs(v) < 1e21:
        return str(int(v))
    text = repr(float(v))
    if "e" in text or "E" in text:
        text = f"{v:.20f}".rstrip("0").rstrip(".")
    return text


def _escape_label(v: str) -> str:
    return v.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _label_str(pairs: Sequence[tuple[str, str]]) -> str:
    if not pairs:
        return ""
    return "{" + ",".join(f'{k}="{_escape_label(v)}"' for k, v in pairs) + "}"


def render_rust_text(snapshot: Snapshot) -> bytes:
    """Text format 0.0.4 as written by the Rust `prometheus` crate: families sorted by name,
    series sorted by label values, label pairs sorted by name, `le` appended last."""
    by_name: dict[str, list[tuple[tuple[str, ...], Value]]] = {}
    for (name, lv), value in snapshot.values.items():
        by_name.setdefault(name, []).append((lv, value))
    lines: list[str] = []
    for spec in sorted(snapshot.specs, key=lambda s: s.name):
        series = by_name.get(spec.name)
        if not series:
            continue
        help_text = spec.help.replace("\\", "\\\\").replace("\n", "\\n")
        lines.append(f"# HELP {spec.name} {help_text}")
        lines.append(f"# TYPE {spec.name} {spec.kind}")
        for lv, v in sorted(series, key=lambda item: item[0]):
            pairs = sorted(zip(spec.labels, lv))
            if spec.kind == "histogram":
                assert isinstance(v, HistogramValue), spec.name
                cum = v.cumulative()
                for bound, c in zip(list(spec.buckets) + [math.inf], cum):
                    lines.append(f"{spec.name}_bucket{_label_str(pairs + [('le', rust_float(bound))])} {c}")
                lines.append(f"{spec.name}_sum{_label_str(pairs)} {rust_float(v.sum)}")
                lines.append(f"{spec.name}_count{_label_str(pairs)} {v.count}")
            else:
                lines.append(f"{spec.name}{_label_str(pairs)} {rust_float(float(v))}")  # type: ignore[arg-type]
    return ("\n".join(lines) + "\n").encode() if lines else b""
