"""The normaliser in three steps, so the part that depends only on the series (their names and
labels, not their values) is done once per payload shape. Pure functions, no I/O.

1. `route`: which samples (by index into the payload's flat sample list, in `Payload.by_name`
   order) each mapping rule reads, grouped by model, with every label already read: `where` and
   `reject_labels` filters, the model, a bucket's `le`, a value taken from a label;
2. `judge`: the values' faults, exactly as normalise.py states them (`invalid_value`,
   `negative_counter`, `value_out_of_range`, `malformed_histogram`, `non_monotone_buckets`): the
   identities of the refused series by reason, and per rule the models dropped;
3. `assemble`: the signals the rules yield once those models are dropped, as `Template`s (a
   signal without its value: the sample indices it combines), and `values_of` their values.

A payload of a known shape whose values are all clean (`Clean.holds`: finite, 0 to 2^63, bucket
counts not going down as `le` grows) skips step 2, and its templates are those of step 3 with
nothing dropped, kept from the first time the shape was seen.
"""
from __future__ import annotations

import itertools
import math
import operator
from collections import defaultdict
from collections.abc import Callable
from collections.abc import Mapping as MappingType
from dataclasses import dataclass

from agent.collect.mapping import Mapping, MappingSet, MetricRule
from contracts.tier_model import NO_LE, Sample, Signal

INF = math.inf
MAX_VALUE = float(2 ** 63)
BUCKET, SUM, COUNT = 0, 1, 2


def judge_value(value: float, counter: bool) -> str | None:
    """The anomaly a mapped value is, or None when it can be true."""
    if not math.isfinite(value):
        return "invalid_value"
    if counter and value < 0:
        return "negative_counter"
    if abs(value) > MAX_VALUE:
        return "value_out_of_range"
    return None


def combine(values: list[float], how: str) -> float:
    if len(values) == 1:
        return values[0]
    if how == "sum":
        return math.fsum(values)
    if how == "max":
        return max(values)
    return math.fsum(values) / len(values)


@dataclass(frozen=True, slots=True)
class Template:
    """One signal before its value: `combine` of the samples `idx` (each times `scale` first when
    set), or the constant `const` (a value read from a label)."""

    model: str
    name: str
    le: float
    kind: str
    source: str
    idx: tuple[int, ...]
    scale: float | None
    how: str
    const: float | None = None


@dataclass(frozen=True, slots=True)
class PlainRoute:
    """A counter or gauge rule: per model (in order of its first sample) the samples it sums."""

    rule: str
    signal: str
    kind: str
    how: str
    scale: float
    source: str
    groups: tuple[tuple[str, tuple[int, ...]], ...]
    consts: tuple[tuple[str, float], ...]  # value_from_label rules: the combined value per model


@dataclass(frozen=True, slots=True)
class HistRoute:
    """A histogram rule: its bucket, sum and count samples in reading order, each as
    (index, model, part, le (None: missing or not a number), bucket series id)."""

    rule: str
    signal: str
    how: str
    scale: float
    source: str
    buckets: bool
    entries: tuple[tuple[int, str, int, float | None, int], ...]


Route = PlainRoute | HistRoute


def _model_of(labels: MappingType[str, str], model_labels: tuple[str, ...]) -> str:
    for key in model_labels:
        v = labels.get(key)
        if v:
            return v
    return ""


def _le(text: str | None) -> float | None:
    """A bucket's upper bound, or None when it has none or it is not a number (`+Inf` is one)."""
    if not text or "_" in text:
        return None
    try:
        le = float(text)
    except ValueError:
        return None
    return None if math.isnan(le) else le


def _label_number(text: str | None) -> float | None:
    try:
        v = float(text) if text and "_" not in text else math.nan
    except ValueError:
        return None
    return v if math.isfinite(v) and abs(v) <= MAX_VALUE else None


def _read(by_name: MappingType[str, list[Sample]], offsets: dict[str, int], name: str, rule: MetricRule,
          mapping: Mapping) -> list[tuple[int, dict[str, str]]]:
    """(index, labels) of the samples of `name` the rule's filters let through."""
    samples = by_name.get(name)
    if not samples:
        return []
    where = rule.where.items()
    reject = mapping.reject_labels
    start = offsets[name]
    out = []
    for j, s in enumerate(samples):
        labels = s.labels
        if where and not where <= labels.items():  # a C-level subset test of (label, value) pairs
            continue
        if reject and not labels.keys().isdisjoint(reject):
            continue
        out.append((start + j, labels))
    return out


def _plain_route(rule: MetricRule, mapping: Mapping, by_name: MappingType[str, list[Sample]],
                 offsets: dict[str, int], names: tuple[str, ...]) -> PlainRoute:
    groups: dict[str, list[int]] = {}
    consts: dict[str, list[float]] = {}
    label_value = rule.value_from_label
    for name in names:
        for i, labels in _read(by_name, offsets, name, rule, mapping):
            model = _model_of(labels, mapping.model_labels)
            if label_value is None:
                groups.setdefault(model, []).append(i)
                continue
            value = _label_number(labels.get(label_value))
            if value is not None:  # e.g. num_gpu_blocks="None" before the profiling run: skipped
                consts.setdefault(model, []).append(value * rule.scale)
    how = rule.aggregation
    return PlainRoute(rule.name, rule.signal, "gauge" if rule.type == "gauge" else "counter", how, rule.scale,
                      mapping.source, tuple((m, tuple(ix)) for m, ix in groups.items()),
                      tuple((m, combine(vs, how)) for m, vs in consts.items()))


def _hist_route(rule: MetricRule, mapping: Mapping, by_name: MappingType[str, list[Sample]],
                offsets: dict[str, int], names: tuple[str, ...]) -> HistRoute:
    entries: list[tuple[int, str, int, float | None, int]] = []
    series: dict[tuple[str, str, frozenset], int] = {}  # a bucket series without its `le`
    for base in names:
        for suffix, part in (("_bucket", BUCKET), ("_sum", SUM), ("_count", COUNT)):
            if part == BUCKET and not rule.buckets:
                continue
            for i, labels in _read(by_name, offsets, base + suffix, rule, mapping):
                model = _model_of(labels, mapping.model_labels)
                if part != BUCKET:
                    entries.append((i, model, part, None, -1))
                    continue
                le = labels.get("le")
                others = frozenset(labels.items())
                key = (model, base, others if le is None else others.difference((("le", le),)))
                entries.append((i, model, part, _le(le), series.setdefault(key, len(series))))
    return HistRoute(rule.name, rule.signal, rule.aggregation, rule.scale, mapping.source, rule.buckets,
                     tuple(entries))


def route(by_name: MappingType[str, list[Sample]], role: str, mappings: MappingSet) -> tuple[Route, ...]:
    """The routes of every rule of the role's mappings that reads a name present in `by_name`."""
    offsets: dict[str, int] = {}
    n = 0
    for name, group in by_name.items():
        offsets[name] = n
        n += len(group)
    out: list[Route] = []
    rule_names = mappings.rule_names
    present = by_name.keys()
    for mapping in mappings.by_role.get(role, ()):
        for rule in mapping.metrics:
            names, wire = rule_names[id(rule)]
            if wire.isdisjoint(present):
                continue  # nothing to read: the rule would yield no signal
            build = _hist_route if rule.type == "histogram" else _plain_route
            out.append(build(rule, mapping, by_name, offsets, names))
    return tuple(out)


def _monotone(points: list[tuple[float, float]]) -> bool:
    points.sort()
    return all(a[1] <= b[1] for a, b in itertools.pairwise(points))


def judge(routes: tuple[Route, ...], values: list[float]) -> tuple[dict[str, set], list[set[str]]]:
    """The refused series' identities by reason (a sample's index, or a histogram's (rule name,
    model)), and per route the models it drops."""
    rejected: dict[str, set] = {}
    dropped: list[set[str]] = []
    for r in routes:
        bad: set[str] = set()
        if isinstance(r, PlainRoute):
            counter = r.kind == "counter"
            for model, idx in r.groups:
                for i in idx:
                    fault = judge_value(values[i], counter)
                    if fault is not None:
                        rejected.setdefault(fault, set()).add(i)
                        bad.add(model)
        else:
            points: dict[int, tuple[str, list[tuple[float, float]]]] = {}
            for i, model, part, le, series in r.entries:
                value = values[i]
                fault = judge_value(value, True)
                if fault is not None:
                    rejected.setdefault(fault, set()).add(i)
                    bad.add(model)
                elif part == BUCKET and le is None:
                    rejected.setdefault("malformed_histogram", set()).add((r.rule, model))
                    bad.add(model)
                elif part == BUCKET:
                    points.setdefault(series, (model, []))[1].append((le, value))
            for model, pts in points.values():
                if model not in bad and not _monotone(pts):
                    rejected.setdefault("non_monotone_buckets", set()).add((r.rule, model))
                    bad.add(model)
        dropped.append(bad)
    return rejected, dropped


def _hist_templates(r: HistRoute, bad: set[str]) -> list[Template]:
    buckets: dict[tuple[str, float], list[int]] = defaultdict(list)
    sums: dict[str, list[int]] = defaultdict(list)
    counts: dict[str, list[int]] = defaultdict(list)
    # a bucket without a numeric `le` drops its model (Clean sends such a shape the full way)
    bad = bad | {model for _, model, part, le, _ in r.entries if part == BUCKET and le is None}
    for i, model, part, le, _ in r.entries:
        if model in bad:
            continue
        if part == BUCKET:
            assert le is not None
            buckets[(model, le * r.scale if le != INF else INF)].append(i)
        else:
            (sums if part == SUM else counts)[model].append(i)
    out: list[Template] = []
    with_inf: set[str] = set()
    for (model, le), idx in sorted(buckets.items()):
        if le == INF:
            with_inf.add(model)
        out.append(Template(model, r.signal, le, "counter", r.source, tuple(idx), None, r.how))
    for model, idx in sums.items():
        out.append(Template(model, r.signal + ":sum", NO_LE, "counter", r.source, tuple(idx), r.scale, r.how))
    for model, idx in counts.items():
        out.append(Template(model, r.signal + ":count", NO_LE, "counter", r.source, tuple(idx), None, r.how))
        # a histogram without a +Inf bucket gets one from its _count (Prometheus semantics)
        if r.buckets and model not in with_inf and any(m == model for m, _ in buckets):
            out.append(Template(model, r.signal, INF, "counter", r.source, tuple(idx), None, r.how))
    return out


def assemble(routes: tuple[Route, ...], dropped: list[set[str]] | None = None) -> list[Template]:
    """The signals' templates, in the normaliser's order, without the models `dropped` per route
    (None: nothing dropped)."""
    out: list[Template] = []
    for k, r in enumerate(routes):
        bad = dropped[k] if dropped is not None else set()
        if isinstance(r, HistRoute):
            out.extend(_hist_templates(r, bad))
            continue
        for model, idx in r.groups:
            if model not in bad:
                out.append(Template(model, r.signal, NO_LE, r.kind, r.source, idx, r.scale, r.how))
        for model, value in r.consts:
            out.append(Template(model, r.signal, NO_LE, r.kind, r.source, (), None, r.how, value))
    return out


def values_of(templates: list[Template], values: list[float] | tuple[float, ...], pod: str) -> list[Signal]:
    out: list[Signal] = []
    append, new = out.append, tuple.__new__  # a Signal without NamedTuple's Python-level __new__
    for t in templates:
        idx, scale = t.idx, t.scale
        if t.const is not None:
            value = t.const
        elif len(idx) == 1:  # combine() of one value is that value
            value = values[idx[0]] if scale is None else values[idx[0]] * scale
        elif scale is None:
            value = combine([values[i] for i in idx], t.how)
        else:
            value = combine([values[i] * scale for i in idx], t.how)
        append(new(Signal, (pod, t.model, t.name, t.le, value, t.kind, t.source)))
    return out


def _getter(idx: list[int]) -> Callable[[list[float] | tuple[float, ...]], tuple[float, ...]]:
    if not idx:
        return lambda _: ()
    if len(idx) == 1:
        return lambda v, i=idx[0]: (v[i],)
    return operator.itemgetter(*idx)


class Clean:
    """The check that a shape's values need no judging: every kept value finite and within 0 to
    2^63 (never a fault, counter or gauge), and each bucket series' counts not going down as its
    `le` grows. `usable` is False when the shape itself needs judging (a bucket without a numeric
    `le`, or two buckets of one series with the same `le`): the full path then runs."""

    def __init__(self, routes: tuple[Route, ...]) -> None:
        lower: list[int] = []
        upper: list[int] = []
        self.usable = True
        for r in routes:
            if not isinstance(r, HistRoute):
                continue
            series: dict[int, list[tuple[float, int]]] = {}
            for i, _, part, le, s in r.entries:
                if part == BUCKET:
                    if le is None:
                        self.usable = False
                    else:
                        series.setdefault(s, []).append((le, i))
            for points in series.values():
                points.sort()
                for (le_a, a), (le_b, b) in itertools.pairwise(points):
                    if le_a == le_b:
                        self.usable = False
                    lower.append(a)
                    upper.append(b)
        self._lower, self._upper = _getter(lower), _getter(upper)

    def holds(self, values: list[float] | tuple[float, ...]) -> bool:
        if not self.usable:
            return False
        if values:
            total = sum(values)
            if total - total != 0.0 or min(values) < 0.0 or max(values) > MAX_VALUE:
                return False  # (a finite sum that overflows only costs the full path)
        return all(map(operator.le, self._lower(values), self._upper(values)))
