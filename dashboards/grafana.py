"""A small, typed builder for Grafana dashboard JSON.

Dashboards are declared as frozen records (`Dashboard`, `Panel`, `Query`, `Annotation`) and turned
into importable Grafana JSON by `Dashboard.to_json()`, a pure function. Every panel and every query
points at the `${datasource}` template variable, so one JSON file works against any Prometheus.

Panels are laid out left to right in Grafana's 24-column grid, wrapping to a new line when a panel
does not fit, so declaring them in reading order is all the layout there is.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

SCHEMA_VERSION = 39
GRID_COLUMNS = 24
DATASOURCE_VARIABLE = "datasource"
DATASOURCE_REF: dict[str, str] = {"type": "prometheus", "uid": f"${{{DATASOURCE_VARIABLE}}}"}

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

    def to_json(self) -> dict[str, Any]:
        return {
            "uid": self.uid,
            "title": self.title,
            "description": self.description,
            "tags": list(self.tags),
            "timezone": "browser",
            "editable": True,
            "graphTooltip": 1,
            "schemaVersion": SCHEMA_VERSION,
            "version": 1,
            "time": {"from": self.time_from, "to": "now"},
            "refresh": self.refresh,
            "fiscalYearStartMonth": 0,
            "liveNow": False,
            "links": [
                {"title": title, "type": "dashboards", "tags": [tag], "asDropdown": False,
                 "includeVars": True, "keepTime": True}
                for title, tag in self.links
            ],
            "templating": {"list": [_datasource_variable()] + [_query_variable(v) for v in self.variables]},
            "annotations": {"list": [_builtin_annotation()] + [_annotation(a) for a in self.annotations]},
            "panels": [_panel(p, i + 1, pos) for i, (p, pos) in enumerate(zip(self.panels, layout(self.panels)))],
        }


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


def _datasource_variable() -> dict[str, Any]:
    return {
        "name": DATASOURCE_VARIABLE,
        "label": "Data source",
        "type": "datasource",
        "query": "prometheus",
        "current": {},
        "hide": 0,
        "refresh": 1,
        "regex": "",
        "includeAll": False,
        "multi": False,
        "options": [],
    }


def _query_variable(v: Variable) -> dict[str, Any]:
    return {
        "name": v.name,
        "label": v.name.capitalize(),
        "type": "query",
        "datasource": dict(DATASOURCE_REF),
        "query": v.query,
        "definition": v.query,
        "refresh": 2,
        "includeAll": True,
        "allValue": ".*",
        "multi": True,
        "current": {"selected": True, "text": ["All"], "value": ["$__all"]},
        "hide": 0,
        "sort": 1,
        "regex": "",
        "options": [],
    }


def _builtin_annotation() -> dict[str, Any]:
    return {
        "builtIn": 1,
        "datasource": {"type": "grafana", "uid": "-- Grafana --"},
        "enable": True,
        "hide": True,
        "iconColor": "rgba(0, 211, 255, 1)",
        "name": "Annotations & Alerts",
        "type": "dashboard",
    }


def _annotation(a: Annotation) -> dict[str, Any]:
    return {
        "name": a.name,
        "datasource": dict(DATASOURCE_REF),
        "enable": True,
        "hide": False,
        "iconColor": a.color,
        "expr": a.expr,
        "step": a.step,
        "titleFormat": a.title,
        "textFormat": a.text,
        "useValueForTime": False,
    }


def _target(q: Query, ref_id: str) -> dict[str, Any]:
    return {
        "refId": ref_id,
        "datasource": dict(DATASOURCE_REF),
        "expr": q.expr,
        "legendFormat": q.legend or "__auto",
        "range": not q.instant,
        "instant": q.instant,
        "format": q.format,
        "editorMode": "code",
    }


def _field_defaults(p: Panel) -> dict[str, Any]:
    steps = p.thresholds or (Threshold("green"),)
    defaults: dict[str, Any] = {
        "unit": p.unit,
        "color": {"mode": "palette-classic" if p.kind == "timeseries" else "thresholds"},
        "thresholds": {"mode": "absolute", "steps": [{"color": s.color, "value": s.value} for s in steps]},
        "mappings": [],
    }
    for key in ("min", "max", "decimals"):
        value = getattr(p, key)
        if value is not None:
            defaults[key] = value
    if p.kind == "timeseries":
        defaults["custom"] = {
            "drawStyle": "line",
            "lineWidth": 2,
            "fillOpacity": 10 if p.stack else 0,
            "showPoints": "always" if p.draw_points else "auto",
            "pointSize": 6,
            "spanNulls": False,
            "stacking": {"mode": "normal" if p.stack else "none", "group": "A"},
            "thresholdsStyle": {"mode": "line+area" if p.show_thresholds_as_line else "off"},
            "axisSoftMin": p.min if p.min is not None else None,
        }
        defaults["custom"] = {k: v for k, v in defaults["custom"].items() if v is not None}
    if p.kind == "table":
        defaults["custom"] = {"align": "auto", "cellOptions": {"type": "auto"}}
    return defaults


def _options(p: Panel) -> dict[str, Any]:
    if p.kind == "timeseries":
        return {"legend": {"displayMode": "table", "placement": "bottom", "showLegend": True,
                           "calcs": ["lastNotNull", "max"]},
                "tooltip": {"mode": "multi", "sort": "desc"}}
    if p.kind == "stat":
        return {"reduceOptions": {"calcs": ["lastNotNull"], "fields": "", "values": False},
                "colorMode": "value", "graphMode": "area", "justifyMode": "auto", "orientation": "auto",
                "textMode": "auto"}
    if p.kind == "bargauge":
        return {"reduceOptions": {"calcs": ["lastNotNull"], "fields": "", "values": False},
                "displayMode": "gradient", "orientation": "horizontal", "showUnfilled": True}
    return {"showHeader": True, "cellHeight": "sm", "footer": {"show": False, "reducer": ["sum"]}}


def _transformations(p: Panel) -> list[dict[str, Any]]:
    if p.kind != "table":
        return []
    exclude = {"Time": True}
    if len(p.queries) == 1:
        exclude["Value"] = not p.columns or "Value" not in p.columns
    order = {name: i for i, name in enumerate(p.columns)}
    return [
        {"id": "merge", "options": {}},
        {"id": "organize", "options": {"excludeByName": exclude, "indexByName": order,
                                       "renameByName": dict(p.column_names)}},
    ]


def _overrides(p: Panel) -> list[dict[str, Any]]:
    return [
        {"matcher": {"id": "byName", "options": name}, "properties": [{"id": "unit", "value": unit}]}
        for name, unit in p.column_units
    ]


def _panel(p: Panel, panel_id: int, pos: dict[str, int]) -> dict[str, Any]:
    out: dict[str, Any] = {
        "id": panel_id,
        "type": p.kind,
        "title": p.title,
        "description": p.description,
        "datasource": dict(DATASOURCE_REF),
        "gridPos": pos,
        "fieldConfig": {"defaults": _field_defaults(p), "overrides": _overrides(p)},
        "options": _options(p),
        "targets": [_target(q, chr(ord("A") + i)) for i, q in enumerate(p.queries)],
    }
    transformations = _transformations(p)
    if transformations:
        out["transformations"] = transformations
    return out
