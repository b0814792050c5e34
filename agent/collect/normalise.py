"""Parsed samples -> normalised signals per pod and model. Pure functions, no I/O.

For one target: every mapping that applies to the target's role turns its raw series into
signals (see mapping.SIGNALS), grouped by model and aggregated over all other labels (the
data-parallel `engine` label included). Across all targets of one pod, `resolve` keeps one source
per signal: the mapping with the lowest `preference` wins, and `fallback_only` rules yield to any
other rule.

Judgements made here:
- a series whose value is NaN or +-Inf (counters, histograms; gauges too) is dropped and counted
  as the anomaly `invalid_value`; the rest of the payload is kept;
- a histogram without a `+Inf` bucket gets one from its `_count` (some exporters and the vLLM docs
  excerpt omit it), so quantiles keep Prometheus semantics;
- series carrying a `reject_labels` label (the router's `server`) never count as engine series.
"""
from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field

from agent.collect.mapping import Mapping, MappingSet, MetricRule
from agent.collect.parse import Payload
from contracts.tier_model import NO_LE, Signal, Target

INF = math.inf


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
    rule: MetricRule, mapping: Mapping, payload: Payload, pod: str, invalid: set[int],
    names: tuple[str, ...] | None = None,
) -> list[Signal]:
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
                elif not math.isfinite(value):
                    invalid.add(id(s))
                    continue
                groups[_model_of(labels, model_labels)].append(value * scale)
        for model, values in groups.items():
            out.append(Signal(pod, model, rule.signal, NO_LE, _combine(values, how), kind, mapping.source))
        return out

    # histogram: buckets keyed by (model, le); sums and counts keyed by model
    buckets: dict[tuple[str, float], list[float]] = defaultdict(list)
    sums: dict[str, list[float]] = defaultdict(list)
    counts: dict[str, list[float]] = defaultdict(list)
    bad_models: set[str] = set()
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
                if not math.isfinite(s.value):
                    invalid.add(id(s))
                    bad_models.add(model)
                    continue
                if target is None:
                    try:
                        le = float(labels.get("le", "nan"))
                    except ValueError:
                        bad_models.add(model)
                        continue
                    if math.isnan(le):
                        bad_models.add(model)
                        continue
                    buckets[(model, le * scale if le != INF else INF)].append(s.value)
                elif target is sums:
                    sums[model].append(s.value * scale)
                else:
                    counts[model].append(s.value)
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


def _label_number(text: str | None) -> float | None:
    try:
        v = float(text) if text else math.nan
    except ValueError:
        return None
    return v if math.isfinite(v) else None


def normalise(target: Target, payload: Payload, mappings: MappingSet) -> Normalised:
    """All candidate signals one target's payload yields (every applicable source)."""
    result = Normalised()
    invalid: set[int] = set()  # identities of rejected samples: one count per wire series
    rule_names = mappings.rule_names
    present = payload.by_name.keys()
    for mapping in mappings.by_role.get(target.role, ()):
        for rule in mapping.metrics:
            names, wire = rule_names[id(rule)]
            if wire.isdisjoint(present):
                continue  # nothing to read: the rule would yield no signal
            result.signals.extend(_rule_signals(rule, mapping, payload, target.pod, invalid, names))
    if invalid:
        result.anomalies["invalid_value"] = len(invalid)
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
