"""Prometheus query results -> the same normalised signals and window frame a direct scrape gives.
Pure functions, no I/O (the queries are made by prom/source.py).

The plan: per role group (a role with its configured selector, or one group for every series
when no selector is configured), one instant query of the raw series the mappings read (a
`__name__` regex: the lifetime totals and the gauges), and one `increase(name{sel}[window])` per
counter or histogram series name that exists (Prometheus drops `__name__` from a function's
result, so a name regex cannot be used there). The results become one `Payload` per pod and
role, exactly as if that pod's endpoint had been scraped, and go through the same mapping files
(`normalise`, `resolve`). A series born inside the window counts from zero (see
`RoleGroup.increase_query`), as a counter does and as the agent's own store counts it. The window frame then holds, per series, the lifetime value (`last`)
and its increase over the window, with `seconds` = the window, so rates are Prometheus' `rate()`.
TTFT and L2 quantiles are `histogram_quantile` over those bucket increases, computed by
`snapshot.py` with the same Prometheus semantics as server-side `histogram_quantile` (one query
per histogram instead of one per quantile and pod).

Who is who: the pod is the series' `pod_label` (Kubernetes service discovery relabels the pod
name to `pod`), else its `instance`. The role is the group's role; without selectors, the `job`
label when it names a role, else the first role (in ROLES order) of the mappings that read that
metric name.

Prometheus' `increase()` extrapolates to the window's edges, while the agent's own store sums the
deltas between its scrapes; both scale a tier's hits and lookups alike, so ratios and quantiles
agree (tests/test_promsource_equivalence.py), and lifetime totals are identical.
"""
from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

import polars as pl

from agent.collect.mapping import MappingSet
from agent.collect.normalise import normalise, resolve
from agent.collect.parse import Payload
from agent.collect.window import WINDOW_SCHEMA
from contracts.tier_model import ROLES, Role, Sample, Signal, Target

GroupKey = tuple[str, str, str]  # (role, pod, namespace)


@dataclass(frozen=True, slots=True)
class RoleGroup:
    """One set of series queried together: a role with its selector, or every role (role None)."""

    role: Role | None
    selector: str  # without braces; "" matches everything
    names: tuple[str, ...]  # wire names the mappings read
    counters: frozenset[str]  # the names whose increase over the window is wanted

    def last_query(self) -> str:
        regex = "|".join(self.names)  # wire names are [a-zA-Z0-9_:] only: nothing to escape
        sel = f",{self.selector}" if self.selector else ""
        return f'{{__name__=~"{regex}"{sel}}}'

    def increase_query(self, name: str, window_s: float) -> str:
        """Per series, `increase()` over the window; a series born inside the window (absent at
        its start: an LMCache histogram appears with its first observation) counts from zero,
        its current value, which `increase()` alone would miss."""
        sel, w = f"{name}{{{self.selector}}}", _duration(window_s)
        return f"({sel} unless {sel} offset {w}) or increase({sel}[{w}])"

    def up_query(self) -> str:
        return f"up{{{self.selector}}}"


def _duration(seconds: float) -> str:
    ms = max(1, round(seconds * 1000))
    return f"{ms // 1000}s" if ms % 1000 == 0 else f"{ms}ms"


def name_roles(mappings: MappingSet) -> dict[str, Role]:
    """Wire name -> the role it identifies when no selector says (first in ROLES order)."""
    out: dict[str, Role] = {}
    for role in ROLES:
        for name in sorted(mappings.wanted.get(role, ())):
            out.setdefault(name, role)
    return out


def counter_names(mappings: MappingSet, names: Iterable[str]) -> frozenset[str]:
    """The names read by at least one counter or histogram rule (gauges have no increase)."""
    out = set()
    for m in mappings.mappings:
        for name, rules in m.wire_names().items():
            if any(r.type != "gauge" for r in rules):
                out.add(name)
    return frozenset(out & set(names))


def plan(mappings: MappingSet, selectors: Mapping[Role, str]) -> tuple[RoleGroup, ...]:
    """The role groups to query: one per configured selector, else one for everything."""
    if selectors:
        groups = []
        for role, sel in selectors.items():
            names = tuple(sorted(mappings.wanted.get(role, ())))
            if names:
                groups.append(RoleGroup(role, _strip_braces(sel), names, counter_names(mappings, names)))
        return tuple(groups)
    names = tuple(sorted(set().union(*mappings.wanted.values())))
    return (RoleGroup(None, "", names, counter_names(mappings, names)),)


def _strip_braces(sel: str) -> str:
    sel = sel.strip()
    return sel[1:-1].strip() if sel.startswith("{") and sel.endswith("}") else sel


@dataclass(frozen=True, slots=True)
class Labelling:
    pod_label: str = "pod"
    namespace_label: str = "namespace"


def series_key(labels: Mapping[str, str], name: str, group_role: Role | None, lab: Labelling,
               roles_by_name: Mapping[str, Role]) -> GroupKey | None:
    """(role, pod, namespace) of one series, None when it cannot be placed."""
    pod = labels.get(lab.pod_label) or labels.get("instance") or ""
    if not pod:
        return None
    role = group_role
    if role is None:
        job = labels.get("job", "")
        role = job if job in ROLES else roles_by_name.get(name)  # type: ignore[assignment]
    if role is None:
        return None
    return role, pod, labels.get(lab.namespace_label, "")


def _float(v: object) -> float:
    try:
        return float(v)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return math.nan


@dataclass
class GroupPayloads:
    """Per (role, pod, namespace): the payload of lifetime values and of window increases."""

    last: dict[GroupKey, Payload] = field(default_factory=dict)
    increase: dict[GroupKey, Payload] = field(default_factory=dict)


def split_vector(result: Sequence[Mapping], group: RoleGroup, lab: Labelling, roles_by_name: Mapping[str, Role],
                 into: dict[GroupKey, Payload], name: str | None = None) -> None:
    """Sort an instant vector's series into per-pod payloads. `name` for results without
    `__name__` (a function's result); else each series' own name. The label dicts are taken over
    (a decoded answer is ours alone), not copied."""
    for item in result:
        labels = item.get("metric") or {}
        own = labels.pop("__name__", "")
        series_name = name or own
        if not series_name:
            continue
        key = series_key(labels, series_name, group.role, lab, roles_by_name)
        if key is None:
            continue
        value = item.get("value") or (None, None)
        p = into.get(key)
        if p is None:
            p = into[key] = Payload()
        samples = p.by_name.get(series_name)
        if samples is None:
            samples = p.by_name[series_name] = []
        samples.append(Sample(series_name, labels, _float(value[1])))
        p.lines += 1


def target_of(base_url: str, key: GroupKey) -> Target:
    role, pod, namespace = key
    return Target(url=f"{base_url}#{role}/{pod}", role=role, pod=pod, namespace=namespace)  # type: ignore[arg-type]


@dataclass(slots=True)
class GroupSignals:
    signals: list[Signal]  # lifetime values, resolved across sources
    increases: dict[tuple, float]  # (pod, model, name, le, source) -> increase over the window
    anomalies: dict[GroupKey, dict[str, int]]


def normalise_groups(payloads: GroupPayloads, base_url: str, mappings: MappingSet) -> GroupSignals:
    """Both payload sets through the mapping files; the increases keep the sources `resolve`
    chose for the lifetime values, so one series never mixes two sources."""
    lasts: list[Signal] = []
    anomalies: dict[GroupKey, dict[str, int]] = {}
    for key, payload in payloads.last.items():
        res = normalise(target_of(base_url, key), payload, mappings)
        lasts.extend(res.signals)
        if res.anomalies:
            anomalies[key] = res.anomalies
    increases: dict[tuple, float] = {}
    for key, payload in payloads.increase.items():
        for s in normalise(target_of(base_url, key), payload, mappings).signals:
            if s.kind == "counter":
                increases[_ident(s)] = s.value
    return GroupSignals(resolve(lasts, mappings), increases, anomalies)


def _ident(s: Signal) -> tuple:
    return (s.pod, s.model, s.name, None if s.le != s.le else s.le, s.source)


def window_frame(signals: Sequence[Signal], increases: Mapping[tuple, float], window_s: float) -> pl.DataFrame:
    """The frame `build_snapshot` reads (store.WINDOW_SCHEMA), from lifetime values and window
    increases. A counter without an increase (fewer than two samples in the window) reports its
    lifetime total, as the agent's own store does."""
    cols: dict[str, list] = {k: [] for k in WINDOW_SCHEMA}
    for s in signals:
        ident = _ident(s)
        inc = increases.get(ident) if s.kind == "counter" else None
        cols["pod"].append(s.pod)
        cols["model"].append(s.model)
        cols["signal"].append(s.name)
        cols["le"].append(ident[3])
        cols["source"].append(s.source)
        cols["kind"].append(s.kind)
        cols["increase"].append(s.value if inc is None else inc)
        cols["last"].append(s.value)
        cols["seconds"].append(None if inc is None else window_s)
        cols["n"].append(0 if inc is None else 1)
    return pl.DataFrame(cols, schema=WINDOW_SCHEMA)


def up_statuses(result: Sequence[Mapping], group: RoleGroup, lab: Labelling) -> dict[tuple[str, str], str]:
    """(role or "", pod) -> instance, for every target Prometheus reports as down (`up == 0`)."""
    down: dict[tuple[str, str], str] = {}
    for item in result:
        labels = item.get("metric") or {}
        value = item.get("value") or (None, None)
        if _float(value[1]) != 0.0:
            continue
        pod = labels.get(lab.pod_label) or labels.get("instance") or ""
        job = labels.get("job", "")
        role = group.role or (job if job in ROLES else "")
        down[(role, pod)] = labels.get("instance", pod)
    return down
