"""Draw dashboard panels as PNGs with matplotlib, for people without Grafana and for reports.

The panels drawn are the dashboard's own declarations (same queries, units, thresholds), with the
template variables expanded the way Grafana would. Public entry point: `render_overview()`.
"""
from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # headless; must precede pyplot
import matplotlib.dates as mdates
import matplotlib.pyplot as plt
from matplotlib.axes import Axes
from matplotlib.ticker import FuncFormatter, PercentFormatter

from contracts.output_paths import replacing
from dashboards import overview
from dashboards.grafana import Dashboard, Panel
from dashboards.promql import expand
from dashboards.settings import BuildSettings
from dashboards.source import PrometheusSource, RangeSource, Series, SourceError

ALL = ".*"
_LEGEND = re.compile(r"\{\{\s*(\w+)\s*\}\}")
TARGET_POINTS = 240


@dataclass(frozen=True)
class PanelData:
    panel: Panel
    series: tuple[Drawn, ...]
    error: str = ""
    start: float = 0.0  # the window drawn, unix seconds (0: fit to the data)
    end: float = 0.0


@dataclass(frozen=True)
class Drawn:
    """A series with the index of the panel query that produced it and its legend."""

    query: int
    legend: str
    series: Series


def choose_step(start: float, end: float, scrape_interval: float) -> float:
    """About TARGET_POINTS points across the range, never finer than the scrape interval."""
    return max(scrape_interval, math.ceil((end - start) / TARGET_POINTS))


def template_values(step: float, scrape_interval: float, start: float, end: float,
                    selection: Mapping[str, str] | None = None) -> dict[str, str]:
    """Values Grafana would give the variables: all of namespace/model/pod unless chosen, and
    `$__rate_interval` = max(step + scrape interval, 4 x scrape interval)."""
    rate_interval = int(max(step + scrape_interval, 4 * scrape_interval))
    values = {"namespace": ALL, "model": ALL, "pod": ALL, "role": ALL, "datasource": "prometheus",
              "__rate_interval": f"{rate_interval}s", "__interval": f"{int(step)}s",
              "__range": f"{int(end - start)}s"}
    values.update(selection or {})
    return values


def legend_for(fmt: str, series: Series) -> str:
    labels = series.label_map
    if not fmt or fmt == "__auto":
        return ", ".join(f"{k}={v}" for k, v in series.labels if k != "__name__") or "value"
    return _LEGEND.sub(lambda m: labels.get(m.group(1), ""), fmt)


def fetch_panel(panel: Panel, source: RangeSource, start: float, end: float, step: float,
                variables: Mapping[str, str]) -> PanelData:
    """Run every query of the panel. Tables only need the latest values: a short range at `end`."""
    if panel.kind == "table":
        start = max(start, end - 10 * step)
    out: list[Drawn] = []
    try:
        for i, q in enumerate(panel.queries):
            for s in source.query_range(expand(q.expr, variables), start, end, step):
                out.append(Drawn(i, legend_for(q.legend, s), s))
    except SourceError as exc:
        return PanelData(panel, tuple(out), str(exc), start, end)
    return PanelData(panel, tuple(sorted(out, key=lambda d: (d.query, d.legend))), "", start, end)


def format_value(unit: str, v: float) -> str:
    if math.isnan(v):
        return "n/a"
    if unit == "percentunit":
        return f"{v * 100:.1f}%"
    if unit == "s":
        return f"{v * 1000:.0f} ms" if abs(v) < 1 else f"{v:.2f} s"
    if unit.startswith("suffix:"):
        return f"{v:,.0f}{unit.split(':', 1)[1]}" if abs(v) >= 100 else f"{v:.3g}{unit.split(':', 1)[1]}"
    return f"{v:.4g}"


def _axis_formatter(unit: str) -> FuncFormatter | PercentFormatter:
    if unit == "percentunit":
        return PercentFormatter(xmax=1.0, decimals=0)
    return FuncFormatter(lambda v, _pos: format_value(unit, v))


def _times(s: Series) -> list[datetime]:
    return [datetime.fromtimestamp(t) for t in s.times]


def _no_data(ax: Axes, data: PanelData) -> None:
    ax.text(0.5, 0.5, data.error or data.panel.no_value or "no data", ha="center", va="center", wrap=True,
            transform=ax.transAxes, color="grey", fontsize=9)
    ax.set_xticks([])
    ax.set_yticks([])


def draw_timeseries(ax: Axes, data: PanelData) -> None:
    p = data.panel
    if not data.series:
        _no_data(ax, data)
        return
    for d in data.series:
        legend, s = d.legend, d.series
        ax.plot(_times(s), s.values, label=legend, linewidth=1.6,
                marker="o" if p.draw_points or len(s.times) < 3 else None, markersize=3)
    if p.show_thresholds_as_line:
        for t in p.thresholds:
            if t.value is not None and t.color == "red":
                ax.axhline(t.value, color="red", linestyle="--", linewidth=1.2)
                ax.annotate(f"SLO {format_value(p.unit, t.value)}", (0.005, t.value), color="red",
                            xycoords=("axes fraction", "data"), va="bottom", fontsize=8)
    if p.min is not None:
        ax.set_ylim(bottom=p.min)
    if p.max is not None and p.unit == "percentunit":
        ax.set_ylim(top=max(p.max, 0.05) * 1.02)
    ax.yaxis.set_major_formatter(_axis_formatter(p.unit))
    locator = mdates.AutoDateLocator(minticks=3, maxticks=8)
    ax.xaxis.set_major_locator(locator)
    ax.xaxis.set_major_formatter(mdates.ConciseDateFormatter(locator))
    if data.end > data.start:  # the whole requested window, as Grafana draws it
        ax.set_xlim(datetime.fromtimestamp(data.start), datetime.fromtimestamp(data.end))
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=7, loc="best", ncol=2 if len(data.series) > 4 else 1)


def draw_stat(ax: Axes, data: PanelData) -> None:
    p = data.panel
    if not data.series:
        _no_data(ax, data)
        return
    s = data.series[0].series
    value = s.values[-1] if s.values else math.nan
    color = "black"
    for t in p.thresholds:
        if t.value is None or value >= t.value:
            color = {"green": "tab:green", "orange": "tab:orange", "red": "tab:red"}.get(t.color, t.color)
    ax.plot(_times(s), s.values, color=color, alpha=0.35, linewidth=1.2)
    ax.fill_between(_times(s), s.values, color=color, alpha=0.08)
    text = format_value(p.unit, value)
    ax.text(0.5, 0.55, text, ha="center", va="center", transform=ax.transAxes,
            fontsize=26 if len(text) <= 8 else 18, fontweight="bold", color=color)
    if len(data.series) > 1:
        ax.text(0.5, 0.2, "  ".join(f"{d.legend}: {format_value(p.unit, d.series.values[-1])}"
                                    for d in data.series if d.series.values),
                ha="center", transform=ax.transAxes, fontsize=8)
    ax.set_xticks([])
    ax.set_yticks([])


def table_rows(data: PanelData) -> tuple[list[str], list[list[str]]]:
    """Rows keyed by the panel's label columns, one value column per query (last point)."""
    p = data.panel
    names = dict(p.column_names)
    label_cols = [c for c in p.columns if not c.startswith("Value")]
    value_cols = [c for c in p.columns if c.startswith("Value")]
    units = dict(p.column_units)
    rows: dict[tuple[str, ...], dict[str, str]] = {}
    for d in data.series:
        col = "Value" if len(p.queries) == 1 else f"Value #{chr(ord('A') + d.query)}"
        key = tuple(d.series.label_map.get(c, "") for c in label_cols)
        unit = units.get(names.get(col, col), p.unit)
        rows.setdefault(key, {})[col] = format_value(unit, d.series.values[-1]) if d.series.values else "n/a"
    header = label_cols + [names.get(c, c) for c in value_cols]
    body = [list(k) + [cells.get(c, "") for c in value_cols] for k, cells in sorted(rows.items())]
    return header, body


def draw_table(ax: Axes, data: PanelData) -> None:
    if not data.series:
        _no_data(ax, data)
        return
    header, body = table_rows(data)
    ax.axis("off")
    table = ax.table(cellText=body or [["" for _ in header]], colLabels=header, loc="upper center",
                     cellLoc="center")
    table.auto_set_font_size(False)
    table.set_fontsize(8)
    table.auto_set_column_width(col=list(range(len(header))))
    table.scale(1, 1.3)


DRAW = {"timeseries": draw_timeseries, "stat": draw_stat, "bargauge": draw_stat, "table": draw_table}


def slug(title: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", title.lower()).strip("-")


def render_dashboard(dashboard: Dashboard, source: RangeSource, out_dir: Path, start: float, end: float,
                     *, step: float | None = None, scrape_interval: float = 15.0,
                     selection: Mapping[str, str] | None = None) -> list[Path]:
    """One PNG per panel (`NN-title.png`) plus `<uid>.png`, a sheet with every panel."""
    data = fetch_dashboard(dashboard, source, start, end, step=step, scrape_interval=scrape_interval,
                           selection=selection)
    return draw_dashboard(dashboard, data, out_dir, start, end)


def fetch_dashboard(dashboard: Dashboard, source: RangeSource, start: float, end: float, *,
                    step: float | None = None, scrape_interval: float = 15.0,
                    selection: Mapping[str, str] | None = None) -> list[PanelData]:
    """Every panel's series over [start, end], variables expanded as Grafana would."""
    if end <= start:
        raise ValueError(f"end ({end}) must be after start ({start})")
    step = step or choose_step(start, end, scrape_interval)
    variables = template_values(step, scrape_interval, start, end, selection)
    return [fetch_panel(p, source, start, end, step, variables) for p in dashboard.panels]


def without_data(data: Sequence[PanelData]) -> list[tuple[str, str]]:
    """(panel title, why) for every panel drawn as "no data": its query failed or gave no value."""
    out = []
    for d in data:
        if d.error:
            out.append((d.panel.title, d.error))
        elif not any(math.isfinite(v) for x in d.series for v in x.series.values):
            out.append((d.panel.title, "no series with a value in the window"))
    return out


def draw_dashboard(dashboard: Dashboard, data: Sequence[PanelData], out_dir: Path, start: float,
                   end: float) -> list[Path]:
    """Draw fetched panels: one PNG per panel (`NN-title.png`) plus `<uid>.png`, the sheet."""
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = [_save_single(d, out_dir / f"{i + 1:02d}-{slug(d.panel.title)}.png") for i, d in enumerate(data)]
    paths.append(_save_sheet(dashboard, data, out_dir / f"{dashboard.uid}.png", start, end))
    return paths


def _save_single(d: PanelData, path: Path) -> Path:
    height = {"stat": 2.6, "table": 1.2 + 0.3 * max(1, len(table_rows(d)[1]))}.get(d.panel.kind, 4.2)
    fig, ax = plt.subplots(figsize=(10 if d.panel.kind != "stat" else 4.5, height))
    ax.set_title(d.panel.title, fontsize=11, loc="left")
    DRAW[d.panel.kind](ax, d)
    fig.tight_layout()
    with replacing(path) as tmp:
        fig.savefig(tmp, dpi=110)
    plt.close(fig)
    return path


def _save_sheet(dashboard: Dashboard, data: Sequence[PanelData], path: Path, start: float, end: float) -> Path:
    stats = [d for d in data if d.panel.kind in ("stat", "bargauge")]
    others = [d for d in data if d not in stats]
    rows = 1 + math.ceil(len([d for d in others if d.panel.kind != "table"]) / 2) + \
        sum(1 for d in others if d.panel.kind == "table")
    fig = plt.figure(figsize=(16, 3.6 * rows))
    grid = fig.add_gridspec(rows, max(2, len(stats)), height_ratios=[0.7] + [1.0] * (rows - 1))
    for i, d in enumerate(stats):
        ax = fig.add_subplot(grid[0, i])
        ax.set_title(d.panel.title, fontsize=10, loc="left")
        DRAW[d.panel.kind](ax, d)
    row, col = 1, 0
    half = max(2, len(stats)) // 2
    for d in others:
        if d.panel.kind == "table":
            if col:
                row, col = row + 1, 0
            ax = fig.add_subplot(grid[row, :])
            row += 1
        else:
            ax = fig.add_subplot(grid[row, col * half:(col + 1) * half])
            col += 1
            if col == 2:
                row, col = row + 1, 0
        ax.set_title(d.panel.title, fontsize=10, loc="left")
        DRAW[d.panel.kind](ax, d)
    window = f"{datetime.fromtimestamp(start):%Y-%m-%d %H:%M} - {datetime.fromtimestamp(end):%H:%M}"
    fig.suptitle(f"{dashboard.title}   ({window})", fontsize=13)
    fig.tight_layout(rect=(0, 0, 1, 1 - 0.35 / fig.get_figheight()))
    with replacing(path) as tmp:
        fig.savefig(tmp, dpi=90)
    plt.close(fig)
    return path


def render_overview(prometheus_url: str, out_dir: str | Path, start: float, end: float, *,
                    step: float | None = None, scrape_interval: float = 15.0,
                    selection: Mapping[str, str] | None = None, settings: BuildSettings | None = None,
                    source: RangeSource | None = None) -> list[Path]:
    """Draw the Tiered cache overview panels from a running Prometheus into `out_dir`.

    start/end are unix seconds. `selection` narrows the template variables (e.g. {"model": "llama"});
    unset ones mean all. Returns the written PNG paths: one per panel, then the whole sheet last.
    A panel whose query fails or returns nothing is drawn as "no data" rather than raising.
    """
    settings = settings or BuildSettings()
    source = source or PrometheusSource(prometheus_url)
    return render_dashboard(overview.build(settings), source, Path(out_dir), start, end, step=step,
                            scrape_interval=scrape_interval, selection=selection)
