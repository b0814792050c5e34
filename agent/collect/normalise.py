"""Parsed samples -> normalised signals per pod and model. Pure functions, no I/O.

For one target: every mapping that applies to the target's role turns its raw series into
signals (see mapping.SIGNALS), grouped by model and aggregated over all other labels (the
data-parallel `engine` label included). Across all targets of one pod, `resolve` keeps one source
per signal: the mapping with the lowest `preference` wins, and `fallback_only` rules yield to any
other rule.

Judgements made here (each refused series is dropped and counted as an anomaly by reason; the rest
of the payload is kept):
- `invalid_value`: a value that is NaN or +-Inf (counters, histograms; gauges too);
- `negative_counter`: a counter, histogram bucket, `_count` or `_sum` below zero (every mapped
  histogram measures seconds, tokens or bytes);
- `value_out_of_range`: a magnitude above 2^63 (MAX_VALUE): no token, byte or request count gets
  there (at a billion a second it takes 292 years), and sums and rates of such values overflow;
- `non_monotone_buckets`: a histogram series whose cumulative bucket counts go down as `le` grows;
  that model's whole histogram is dropped;
- `malformed_histogram`: a bucket without `le`, or with an `le` that is not a number; that model's
  whole histogram is dropped;
- a histogram without a `+Inf` bucket gets one from its `_count` (some exporters and the vLLM docs
  excerpt omit it), so quantiles keep Prometheus semantics;
- series carrying a `reject_labels` label (the router's `server`) never count as engine series.
"""
from __future__ import annotations

import itertools
import math
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field

from agent.collect.mapping import Mapping, MappingSet, MetricRule
from agent.collect.parse import Payload
from contracts.tier_model import NO_LE, Signal, Target

INF = math.inf
MAX_VALUE = float(2 ** 63)

REASONS = ("invalid_value", "negative_counter", "value_out_of_range", "non_monotone_buckets",
           "malformed_histogram")


def judge(value: float, counter: bool) -> str | None:
    """The anomaly a mapped value is, or None when it can be true."""
    if not math.isfinite(value):
        return "invalid_value"
    if counter and value < 0:
        return "negative_counter"
    if abs(value) > MAX_VALUE:
        return "value_out_of_range"
    return None


@dataclass(slots=True)
class Normalised:
    """Signals of one target (not yet resolved across sources) and anomaly counts by reason."""

    signals: list[Signal] = field(default_factory=list)
    anomalies: dict[str, int] = field(default_factory=dict)


def _model_of(labels: dict[str, str], model_labels: tuple[str, ...]) -> str:
    for key in model_labels:
        v = labels.get(key)
        if v:
            return v
    return ""


def _combine(values: list[float], how: str) -> float:
    if len(values) == 1:
        return values[0]
    if how == "sum":
        return math.fsum(values)
    if how == "max":
        return max(values)
    return math.fsum(values) / len(values)


def _rule_signals(
    rule: MetricRule, mapping: Mapping, payload: Payload, pod: str, rejected: dict[str, set],
    names: tuple[str, ...] | None = None,
) -> list[Signal]:
    """`rejected`: reason -> identities of the refused wire series (a sample's id, or a
    histogram's (name, model)), so a series read by two rules counts once."""
    if names is None:
        names = (rule.name,) + tuple(
            alias + rule.name[len(canon):] for alias, canon in mapping.prefixes.items() if rule.name.startswith(canon)
        )
    where = rule.where.items()
    reject = mapping.reject_labels
    model_labels = mapping.model_labels
    how = rule.aggregation
    scale = rule.scale
    out: list[Signal] = []
    if rule.type != "histogram":
        kind = "gauge" if rule.type == "gauge" else "counter"
        label_value = rule.value_from_label
        groups: dict[str, list[float]] = defaultdict(list)
        refused: set[str] = set()  # models with a refused series: no partial sum for them
        for name in names:
            for s in payload.by_name.get(name, ()):
                labels = s.labels
                if where and not where <= labels.items():  # a C-level subset test of (label, value) pairs
                    continue
                if reject and not labels.keys().isdisjoint(reject):
                    continue
                value = s.value
                if label_value is not None:
                    value = _label_number(labels.get(label_value))
                    if value is None:
                        continue  # e.g. num_gpu_blocks="None" before the profiling run
                else:
                    fault = judge(value, kind == "counter")
                    if fault is not None:
                        rejected.setdefault(fault, set()).add(id(s))
                        refused.add(_model_of(labels, model_labels))
                        continue
                groups[_model_of(labels, model_labels)].append(value * scale)
        for model, values in groups.items():
            if model in refused:
                continue
            out.append(Signal(pod, model, rule.signal, NO_LE, _combine(values, how), kind, mapping.source))
        return out

    # histogram: buckets keyed by (model, le); sums and counts keyed by model
    buckets: dict[tuple[str, float], list[float]] = defaultdict(list)
    sums: dict[str, list[float]] = defaultdict(list)
    counts: dict[str, list[float]] = defaultdict(list)
    bad_models: set[str] = set()
    # each bucket series' own (le, value) points, to check that its counts never go down
    series: dict[tuple[str, str, frozenset], list[tuple[float, float]]] = defaultdict(list)
    for base in names:
        for suffix, target in (("_bucket", None), ("_sum", sums), ("_count", counts)):
            if suffix == "_bucket" and not rule.buckets:
                continue
            for s in payload.by_name.get(base + suffix, ()):
                labels = s.labels
                if where and not where <= labels.items():  # a C-level subset test of (label, value) pairs
                    continue
                if reject and not labels.keys().isdisjoint(reject):
                    continue
                model = _model_of(labels, model_labels)
                fault = judge(s.value, True)
                if fault is not None:
                    rejected.setdefault(fault, set()).add(id(s))
                    bad_models.add(model)
                    continue
                if target is None:
                    le = _le(labels.get("le"))
                    if le is None:
                        rejected.setdefault("malformed_histogram", set()).add((rule.name, model))
                        bad_models.add(model)
                        continue
                    series[(model, base, frozenset(kv for kv in labels.items() if kv[0] != "le"))].append(
                        (le, s.value))
                    buckets[(model, le * scale if le != INF else INF)].append(s.value)
                elif target is sums:
                    sums[model].append(s.value * scale)
                else:
                    counts[model].append(s.value)
    for (model, _, _), points in series.items():
        if model not in bad_models and not _monotone(points):
            rejected.setdefault("non_monotone_buckets", set()).add((rule.name, model))
            bad_models.add(model)
    src = mapping.source
    per_model_inf: set[str] = set()
    for (model, le), values in sorted(buckets.items()):
        if model in bad_models:
            continue
        if le == INF:
            per_model_inf.add(model)
        out.append(Signal(pod, model, rule.signal, le, _combine(values, how), "counter", src))
    for model, values in sums.items():
        if model not in bad_models:
            out.append(Signal(pod, model, rule.signal + ":sum", NO_LE, _combine(values, how), "counter", src))
    for model, values in counts.items():
        if model in bad_models:
            continue
        total = _combine(values, how)
        out.append(Signal(pod, model, rule.signal + ":count", NO_LE, total, "counter", src))
        if rule.buckets and model not in per_model_inf and any(m == model for m, _ in buckets):
            out.append(Signal(pod, model, rule.signal, INF, total, "counter", src))
    return out


def _le(text: str | None) -> float | None:
    """A bucket's upper bound, or None when it has none or it is not a number (`+Inf` is one)."""
    if not text or "_" in text:
        return None
    try:
        le = float(text)
    except ValueError:
        return None
    return None if math.isnan(le) else le


def _monotone(points: list[tuple[float, float]]) -> bool:
    points.sort()
    return all(a[1] <= b[1] for a, b in itertools.pairwise(points))


def _label_number(text: str | None) -> float | None:
    try:
        v = float(text) if text and "_" not in text else math.nan
    except ValueError:
        return None
    return v if math.isfinite(v) and abs(v) <= MAX_VALUE else None


def normalise(target: Target, payload: Payload, mappings: MappingSet) -> Normalised:
    """All candidate signals one target's payload yields (every applicable source)."""
    result = Normalised()
    rejected: dict[str, set] = {}  # reason -> identities of refused series: one count per wire series
    rule_names = mappings.rule_names
    present = payload.by_name.keys()
    for mapping in mappings.by_role.get(target.role, ()):
        for rule in mapping.metrics:
            names, wire = rule_names[id(rule)]
            if wire.isdisjoint(present):
                continue  # nothing to read: the rule would yield no signal
            result.signals.extend(_rule_signals(rule, mapping, payload, target.pod, rejected, names))
    for reason in REASONS:
        if rejected.get(reason):
            result.anomalies[reason] = len(rejected[reason])
    return result


def base_signal(name: str) -> str:
    """`ttft_seconds:sum` -> `ttft_seconds`."""
    i = name.find(":")
    return name if i < 0 else name[:i]


def resolve(signals: Iterable[Signal], mappings: MappingSet) -> list[Signal]:
    """Keep, per pod, model and signal, the series of the preferred source only.

    Order: non-fallback rules before fallback-only ones, then the lowest mapping preference, then
    the first seen (so two targets of one pod reporting the same source do not double count)."""
    rank_of = mappings.source_rank
    signals = list(signals)
    bases = [base_signal(s.name) for s in signals]
    best: dict[tuple[str, str, str], tuple[bool, int, str]] = {}
    for s, base in zip(signals, bases, strict=True):
        key = (s.pod, s.model, base)
        rank = rank_of.get((s.source, base)) or (False, 1000, s.source)
        cur = best.get(key)
        if cur is None or rank < cur:
            best[key] = rank
    # A model-less signal (Curvine FUSE I/O on the pod) belongs to every model of its pod, so it
    # competes with the models' own sources too: a fallback-only rule of a model (LMCache
    # `remote_time_to_get`) yields to the pod's preferred model-less source.
    models: dict[str, set[str]] = {}
    for s in signals:
        if s.model:
            models.setdefault(s.pod, set()).add(s.model)
    for (pod, model, base), rank in list(best.items()):
        if model:
            continue
        for m in models.get(pod, ()):
            cur = best.get((pod, m, base))
            if cur is not None and rank < cur:
                best[(pod, m, base)] = rank
    seen: set[tuple[str, str, str, float | None]] = set()
    out: list[Signal] = []
    for s, base in zip(signals, bases, strict=True):
        if best[(s.pod, s.model, base)][2] != s.source:
            continue
        ident = (s.pod, s.model, s.name, s.le if s.le == s.le else None)
        if ident in seen:
            continue
        seen.add(ident)
        out.append(s)
    return out
