"""What the dashboards and rules may query: names from `docs/metrics.md`, names the rules record,
and Prometheus' own series. Used by the structural tests and by `every_query()` consumers."""
from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from dashboards.grafana import Dashboard
from dashboards.promql import metric_names
from dashboards.rulefile import Group, Record

CATALOGUE = Path("docs/metrics.md")
_DOCUMENTED = re.compile(r"`(tierpilot_[a-z0-9_]+)")
SUFFIXES = ("_bucket", "_count", "_sum", "_created")
# Series Prometheus makes itself for every scrape target.
PROMETHEUS_SERIES = frozenset({"up", "scrape_duration_seconds", "scrape_samples_scraped"})


@dataclass(frozen=True)
class QueryRef:
    """One PromQL expression and where it lives, for error messages."""

    where: str
    expr: str


def documented_names(markdown: str) -> set[str]:
    """Every `tierpilot_*` name written in backticks in the catalogue."""
    return set(_DOCUMENTED.findall(markdown))


def recorded_names(groups: tuple[Group, ...]) -> set[str]:
    return {r.record for g in groups for r in g.rules if isinstance(r, Record)}


def is_known(name: str, documented: set[str], recorded: set[str]) -> bool:
    if name in documented or name in recorded or name in PROMETHEUS_SERIES:
        return True
    return any(name.endswith(s) and name[: -len(s)] in documented for s in SUFFIXES)


def dashboard_queries(d: Dashboard) -> Iterator[QueryRef]:
    """Every PromQL a dashboard sends: panel targets, annotations and variable queries."""
    for p in d.panels:
        for i, q in enumerate(p.queries):
            yield QueryRef(f"{d.uid} / {p.title} / query {chr(ord('A') + i)}", q.expr)
    for a in d.annotations:
        yield QueryRef(f"{d.uid} / annotation {a.name}", a.expr)
    for v in d.variables:
        selector = "{%s}" % v.selector if v.selector else ""  # noqa: UP031 - braces are literal
        yield QueryRef(f"{d.uid} / variable ${v.name}", f"{v.metric}{selector}")


def rule_queries(groups: tuple[Group, ...]) -> Iterator[QueryRef]:
    for g in groups:
        for r in g.rules:
            name = r.record if isinstance(r, Record) else r.alert
            yield QueryRef(f"rule group {g.name} / {name}", r.expr)


def unknown_names(refs: list[QueryRef], documented: set[str], recorded: set[str]) -> list[str]:
    """`where: name` for every series name not in the catalogue (sorted, for one clear failure)."""
    return sorted(f"{ref.where}: {name}" for ref in refs for name in metric_names(ref.expr)
                  if not is_known(name, documented, recorded))
