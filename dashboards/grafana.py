"""Dashboard declarations: frozen records (`Dashboard`, `Panel`, `Query`, `Annotation`, `Variable`).

The catalogue check, the live tests and the PNG renderer read these records;
`dashboards.sdk.dashboard_json()` turns them into importable Grafana JSON with Grafana's typed
builders (`grafana-foundation-sdk`), and dashboards/schema.py validates that JSON against the
SDK's models.

Panels are laid out left to right in Grafana's 24-column grid, wrapping to a new line when a panel
does not fit, so declaring them in reading order is all the layout there is.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

GRID_COLUMNS = 24

PanelKind = Literal["timeseries", "stat", "table", "bargauge"]
PANEL_KINDS: tuple[str, ...] = ("timeseries", "stat", "table", "bargauge")
QueryFormat = Literal["time_series", "table"]


class DashboardError(ValueError):
    """A dashboard declaration that Grafana would reject or that breaks a project rule."""


@dataclass(frozen=True)
class Query:
    """One PromQL target. `legend` is Grafana's legendFormat (e.g. ``{{tier}}``)."""

    expr: str
    legend: str = ""
    instant: bool = False
    format: QueryFormat = "time_series"


@dataclass(frozen=True)
class Threshold:
    """A colour step; the first step of a panel should have `value=None` (the base colour)."""

    color: str
    value: float | None = None


@dataclass(frozen=True)
class Panel:
    """One visualisation. `unit` is a Grafana unit id (percentunit, s, short, none, ...)."""

    title: str
    kind: PanelKind
    unit: str
    queries: tuple[Query, ...]
    description: str = ""
    width: int = 12
    height: int = 8
    min: float | None = None
    max: float | None = None
    decimals: int | None = None
    thresholds: tuple[Threshold, ...] = ()
    show_thresholds_as_line: bool = False
    stack: bool = False
    draw_points: bool = False
    # table only: column order (labels first, then the values) and display names.
    columns: tuple[str, ...] = ()
    column_names: tuple[tuple[str, str], ...] = ()
    # per-field unit overrides, by field name after the transformations ("Value #B" -> "s").
    column_units: tuple[tuple[str, str], ...] = ()
    # what Grafana shows instead of "No data" (e.g. "no L2 tier" where a deployment has none)
    no_value: str = ""

    def __post_init__(self) -> None:
        if self.kind not in PANEL_KINDS:
            raise DashboardError(f"panel {self.title!r}: kind {self.kind!r} is not one of {PANEL_KINDS}")
        if not self.unit:
            raise DashboardError(f"panel {self.title!r}: every panel needs a unit")
        if not self.queries:
            raise DashboardError(f"panel {self.title!r}: a panel needs at least one query")
        if not 1 <= self.width <= GRID_COLUMNS:
            raise DashboardError(f"panel {self.title!r}: width {self.width} not in 1..{GRID_COLUMNS}")


@dataclass(frozen=True)
class Annotation:
    """A Prometheus-backed annotation: every step where `expr` returns a sample becomes a marker."""

    name: str
    expr: str
    color: str
    title: str
    text: str = ""
    step: str = "1m"


@dataclass(frozen=True)
class Variable:
    """A query template variable over `label_values(metric{selector}, label)`."""

    name: str
    label: str
    metric: str
    selector: str = ""

    @property
    def query(self) -> str:
        selector = f"{{{self.selector}}}" if self.selector else ""
        return f"label_values({self.metric}{selector}, {self.label})"


@dataclass(frozen=True)
class Dashboard:
    uid: str
    title: str
    description: str
    panels: tuple[Panel, ...]
    variables: tuple[Variable, ...] = ()
    annotations: tuple[Annotation, ...] = ()
    tags: tuple[str, ...] = ("tierpilot",)
    time_from: str = "now-3h"
    refresh: str = "30s"
    links: tuple[tuple[str, str], ...] = field(default=())

    def __post_init__(self) -> None:
        if not self.uid or len(self.uid) > 40:
            raise DashboardError(f"dashboard {self.title!r}: uid must be 1..40 characters, got {self.uid!r}")
        titles = [p.title for p in self.panels]
        duplicates = sorted({t for t in titles if titles.count(t) > 1})
        if duplicates:
            raise DashboardError(f"dashboard {self.uid!r}: duplicate panel titles {duplicates}")


def layout(panels: tuple[Panel, ...]) -> list[dict[str, int]]:
    """Grid positions, filling rows left to right; a row is as tall as its tallest panel."""
    positions: list[dict[str, int]] = []
    x = y = row_height = 0
    for p in panels:
        if x + p.width > GRID_COLUMNS:
            x, y, row_height = 0, y + row_height, 0
        positions.append({"h": p.height, "w": p.width, "x": x, "y": y})
        x += p.width
        row_height = max(row_height, p.height)
    return positions
