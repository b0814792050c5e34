"""Dashboard declarations (dashboards/grafana.py) -> Grafana JSON, built with Grafana's own typed
builders from `grafana-foundation-sdk` (https://github.com/grafana/grafana-foundation-sdk), which
track the dashboard schema. A pure function: `dashboard_json(d)` returns the importable dict.

Every panel, query, variable and annotation points at the `${datasource}` template variable, so
one JSON file works against any Prometheus. Grafana adds its built-in "Annotations & Alerts" entry
on load, so it is not written here. The only fields written outside the SDK's models are
the Prometheus annotation fields Grafana reads from an annotation (`step`, `titleFormat`,
`textFormat`, `useValueForTime`); `dashboards/schema.py` names them as the allowed extras.
"""
from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

from grafana_foundation_sdk.builders import bargauge, common, stat, table, timeseries
from grafana_foundation_sdk.builders import dashboard as dash
from grafana_foundation_sdk.builders import prometheus as prom
from grafana_foundation_sdk.cog.encoder import JSONEncoder
from grafana_foundation_sdk.models import common as cm
from grafana_foundation_sdk.models import dashboard as dm
from grafana_foundation_sdk.models import prometheus as pm

from dashboards.grafana import layout

if TYPE_CHECKING:
    from dashboards.grafana import Annotation, Dashboard, Panel, Query, Variable

SCHEMA_VERSION = 39
DATASOURCE_VARIABLE = "datasource"
PROMETHEUS_ANNOTATION_EXTRAS = ("step", "titleFormat", "textFormat", "useValueForTime")


def datasource_ref() -> dm.DataSourceRef:
    return dm.DataSourceRef(type_val="prometheus", uid=f"${{{DATASOURCE_VARIABLE}}}")


def _target(q: Query, ref_id: str) -> prom.Dataquery:
    t = (prom.Dataquery().ref_id(ref_id).datasource(datasource_ref()).expr(q.expr)
         .legend_format(q.legend or "__auto").editor_mode(pm.QueryEditorMode.CODE)
         .format(pm.PromQueryFormat(q.format)))
    return t.instant() if q.instant else t.range()


def _thresholds(p: Panel) -> dash.ThresholdsConfig:
    steps = p.thresholds or ()
    base = [dm.Threshold(value=s.value, color=s.color) for s in steps] or [dm.Threshold(color="green")]
    return dash.ThresholdsConfig().mode(dm.ThresholdsMode.ABSOLUTE).steps(base)


def _common(builder: Any, p: Panel, panel_id: int, pos: dict[str, int]) -> Any:
    b = (builder.id(panel_id).title(p.title).description(p.description).datasource(datasource_ref())
         .grid_pos(dm.GridPos(h=pos["h"], w=pos["w"], x=pos["x"], y=pos["y"]))
         .unit(p.unit).thresholds(_thresholds(p)).mappings([])
         .targets([_target(q, chr(ord("A") + i)) for i, q in enumerate(p.queries)]))
    for key in ("min", "max", "decimals"):
        value = getattr(p, key)
        if value is not None:
            b = getattr(b, key)(value)
    if p.no_value:
        b = b.no_value(p.no_value)
    for name, unit in p.column_units:
        b = b.override_by_name(name, [dm.DynamicConfigValue(id_val="unit", value=unit)])
    return b


def _reduce_last() -> common.ReduceDataOptions:
    return common.ReduceDataOptions().calcs(["lastNotNull"]).fields("").values(False)


def _timeseries(p: Panel) -> timeseries.Panel:
    b = timeseries.Panel()
    b = (b.color_scheme(dash.FieldColor().mode(dm.FieldColorModeId.PALETTE_CLASSIC))
         .legend(common.VizLegendOptions().display_mode(cm.LegendDisplayMode.TABLE)
                 .placement(cm.LegendPlacement.BOTTOM).show_legend(True).calcs(["lastNotNull", "max"]))
         .tooltip(common.VizTooltipOptions().mode(cm.TooltipDisplayMode.MULTI).sort(cm.SortOrder.DESCENDING))
         .draw_style(cm.GraphDrawStyle.LINE).line_width(2).fill_opacity(10 if p.stack else 0)
         .show_points(cm.VisibilityMode.ALWAYS if p.draw_points else cm.VisibilityMode.AUTO).point_size(6)
         .span_nulls(False)
         .stacking(common.StackingConfig().mode(cm.StackingMode.NORMAL if p.stack else cm.StackingMode.NONE)
                   .group("A"))
         .thresholds_style(common.GraphThresholdsStyleConfig().mode(
             cm.GraphTresholdsStyleMode.LINE_AND_AREA if p.show_thresholds_as_line else cm.GraphTresholdsStyleMode.OFF)))
    return b.axis_soft_min(p.min) if p.min is not None else b


def _stat(p: Panel) -> stat.Panel:
    return (stat.Panel().color_scheme(dash.FieldColor().mode(dm.FieldColorModeId.THRESHOLDS))
            .reduce_options(_reduce_last()).color_mode(cm.BigValueColorMode.VALUE)
            .graph_mode(cm.BigValueGraphMode.AREA).justify_mode(cm.BigValueJustifyMode.AUTO)
            .orientation(cm.VizOrientation.AUTO).text_mode(cm.BigValueTextMode.AUTO))


def _bargauge(p: Panel) -> bargauge.Panel:
    return (bargauge.Panel().color_scheme(dash.FieldColor().mode(dm.FieldColorModeId.THRESHOLDS))
            .reduce_options(_reduce_last()).display_mode(cm.BarGaugeDisplayMode.GRADIENT)
            .orientation(cm.VizOrientation.HORIZONTAL).show_unfilled(True))


def _table(p: Panel) -> table.Panel:
    exclude: dict[str, bool] = {"Time": True}
    if len(p.queries) == 1:
        exclude["Value"] = not p.columns or "Value" not in p.columns
    order = {name: i for i, name in enumerate(p.columns)}
    return (table.Panel().color_scheme(dash.FieldColor().mode(dm.FieldColorModeId.THRESHOLDS))
            .show_header(True).cell_height(cm.TableCellHeight.SM)
            .footer(common.TableFooterOptions().show(False).reducer(["sum"]))
            .transformations([
                dm.DataTransformerConfig(id_val="merge", options={}),
                dm.DataTransformerConfig(id_val="organize", options={
                    "excludeByName": exclude, "indexByName": order, "renameByName": dict(p.column_names)}),
            ]))


BUILDERS = {"timeseries": _timeseries, "stat": _stat, "bargauge": _bargauge, "table": _table}


def _query_variable(v: Variable) -> dash.QueryVariable:
    return (dash.QueryVariable(v.name).label(v.name.capitalize()).datasource(datasource_ref())
            .query(v.query).refresh(dm.VariableRefresh.ON_TIME_RANGE_CHANGED).include_all(True)
            .all_value(".*").multi(True).sort(dm.VariableSort.ALPHABETICAL_ASC)
            .current(dm.VariableOption(selected=True, text=["All"], value=["$__all"])))


def _datasource_variable() -> dash.DatasourceVariable:
    return (dash.DatasourceVariable(DATASOURCE_VARIABLE).label("Data source").type("prometheus")
            .multi(False).include_all(False))


def _annotation(a: Annotation) -> dash.AnnotationQuery:
    return (dash.AnnotationQuery().name(a.name).datasource(datasource_ref()).enable(True).hide(False)
            .icon_color(a.color).expr(a.expr))


def builder(d: Dashboard) -> dash.Dashboard:
    """The SDK builder for one declared dashboard."""
    b = (dash.Dashboard(d.title).uid(d.uid).description(d.description).tags(list(d.tags))
         .timezone("browser").editable().tooltip(dm.DashboardCursorSync.CROSSHAIR).time(d.time_from, "now")
         .refresh(d.refresh).fiscal_year_start_month(0).live_now(False).version(1)
         .links([dash.DashboardLink(title).type(dm.DashboardLinkType.DASHBOARDS).tags([tag]).as_dropdown(False)
                 .include_vars(True).keep_time(True) for title, tag in d.links])
         .variables([_datasource_variable(), *(_query_variable(v) for v in d.variables)])
         .annotations([_annotation(a) for a in d.annotations]))
    for i, (p, pos) in enumerate(zip(d.panels, layout(d.panels), strict=True)):
        b = b.with_panel(_common(BUILDERS[p.kind](p), p, i + 1, pos))
    return b


def dashboard_json(d: Dashboard) -> dict[str, Any]:
    """Importable Grafana JSON: the SDK model encoded, plus the Prometheus annotation fields."""
    model = builder(d).build()
    model.schema_version = SCHEMA_VERSION
    out: dict[str, Any] = json.loads(json.dumps(model, cls=JSONEncoder))
    for a, entry in zip(d.annotations, out["annotations"]["list"], strict=True):
        entry.update({"step": a.step, "titleFormat": a.title, "textFormat": a.text, "useValueForTime": False})
    return out
