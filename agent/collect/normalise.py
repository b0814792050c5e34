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

from collections.abc import Iterable
from dataclasses import dataclass, field

from agent.collect.mapping import MappingSet
from agent.collect.parse import Payload
from agent.collect.routes import MAX_VALUE, Route, assemble, judge, judge_value, route, values_of
from contracts.tier_model import Signal, Target

__all__ = ["MAX_VALUE", "REASONS", "Normalised", "anomalies_of", "base_signal", "judge_value", "normalise",
           "resolve"]

REASONS = ("invalid_value", "negative_counter", "value_out_of_range", "non_monotone_buckets",
           "malformed_histogram")


@dataclass(slots=True)
class Normalised:
    """Signals of one target (not yet resolved across sources) and anomaly counts by reason."""

    signals: list[Signal] = field(default_factory=list)
    anomalies: dict[str, int] = field(default_factory=dict)


def anomalies_of(rejected: dict[str, set]) -> dict[str, int]:
    """Counts by reason, in REASONS order: one per refused wire series (a series read by two rules
    counts once)."""
    return {reason: len(rejected[reason]) for reason in REASONS if rejected.get(reason)}


def normalise_routes(routes: tuple[Route, ...], values: list[float] | tuple[float, ...], pod: str) -> Normalised:
    """The signals of routed samples with these values (routes.py): judged, then assembled."""
    rejected, dropped = judge(routes, values)
    return Normalised(values_of(assemble(routes, dropped), values, pod), anomalies_of(rejected))


def normalise(target: Target, payload: Payload, mappings: MappingSet) -> Normalised:
    """All candidate signals one target's payload yields (every applicable source)."""
    routes = route(payload.by_name, target.role, mappings)
    return normalise_routes(routes, [s.value for group in payload.by_name.values() for s in group], target.pod)


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
