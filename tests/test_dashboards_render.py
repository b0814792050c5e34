"""PNG rendering of the overview panels, on a deterministic in-memory source (the live test draws
from a real Prometheus)."""
from __future__ import annotations

import itertools
import math
import re

from click.testing import CliRunner

from agent.cli import main
from dashboards import overview
from dashboards.grafana import Dashboard
from dashboards.render import (
    PanelData,
    choose_step,
    fetch_panel,
    format_value,
    legend_for,
    render_dashboard,
    table_rows,
    template_values,
)
from dashboards.settings import BuildSettings
from dashboards.source import Series, SourceError

PNG = b"\x89PNG\r\n\x1a\n"
LABEL_VALUES = {"tier": ("gpu", "cpu", "l2"), "quantile": ("0.5", "0.95", "0.99"), "op": ("read", "write"),
                "pod": ("vllm-0", "vllm-1"), "model": ("llama-3.1-8b",),
                "cause": ("cold", "capacity", "routing"), "source": ("curvine_fuse", "lmcache_inprocess")}


class FakeSource:
    """Answers any query with one series per combination of its `by (...)` labels; records queries."""

    def __init__(self, fail_on: str = "") -> None:
        self.queries: list[str] = []
        self.fail_on = fail_on

    def query_range(self, expr: str, start: float, end: float, step: float) -> list[Series]:
        self.queries.append(expr)
        if self.fail_on and self.fail_on in expr:
            raise SourceError(f"Prometheus rejected {expr!r}: bad_data")
        grouping = re.match(r"\w+ by \(([^)]*)\)", expr)
        labels = [s.strip() for s in grouping.group(1).split(",")] if grouping else []
        times = tuple(start + i * step for i in range(int((end - start) // step) + 1))
        out = []
        for n, combo in enumerate(itertools.product(*(LABEL_VALUES[label] for label in labels))):
            values = tuple(0.1 + 0.1 * n + 0.05 * math.sin(t / 300) for t in times)
            out.append(Series(tuple(zip(labels, combo)), times, values))
        return out


def test_render_overview_writes_one_png_per_panel_and_a_sheet(tmp_path):
    source = FakeSource()
    dashboard = overview.build(BuildSettings())
    paths = render_dashboard(dashboard, source, tmp_path, 1_700_000_000, 1_700_003_600, scrape_interval=15)
    assert len(paths) == len(dashboard.panels) + 1
    assert paths[0].name == "01-total-hit-ratio.png"
    assert paths[-1].name == "tierpilot-overview.png"
    for p in paths:
        assert p.read_bytes()[:8] == PNG and p.stat().st_size > 5_000, p
    # every query went out with the variables expanded: step 15 s -> $__rate_interval 60 s
    assert all("$" not in q for q in source.queries)
    assert any("[60s]" in q for q in source.queries)
    assert any('pod=~".*"' in q for q in source.queries)


def test_a_failing_query_is_drawn_as_no_data(tmp_path):
    source = FakeSource(fail_on="tierpilot_l2_break_even_prompt_tokens")
    panel = overview.build(BuildSettings()).panels[3]
    data = fetch_panel(panel, source, 0, 3600, 60, template_values(60, 15, 0, 3600))
    assert data.series == () and "bad_data" in data.error
    one = Dashboard("one-panel", "One panel", "", (panel,))
    paths = render_dashboard(one, source, tmp_path, 0, 3600)
    assert [p.name for p in paths] == ["01-l2-break-even-prompt-length.png", "one-panel.png"]
    assert all(p.read_bytes()[:8] == PNG for p in paths)


def test_selection_narrows_template_variables():
    values = template_values(30, 15, 0, 3600, {"model": "llama.*"})
    assert values["model"] == "llama.*" and values["pod"] == ".*"
    assert values["__rate_interval"] == "60s"  # max(30 + 15, 4 x 15)
    assert template_values(120, 15, 0, 3600)["__rate_interval"] == "135s"
    assert choose_step(0, 3600, 15) == 15 and choose_step(0, 86_400, 15) == 360


def test_legend_and_value_formatting():
    s = Series((("quantile", "0.95"), ("tier", "l2")), (0.0,), (0.25,))
    assert legend_for("p{{quantile}} {{ tier }}", s) == "p0.95 l2"
    assert legend_for("", s) == "quantile=0.95, tier=l2"
    assert format_value("percentunit", 0.4567) == "45.7%"
    assert format_value("s", 0.056) == "56 ms"
    assert format_value("s", 2.5) == "2.50 s"
    assert format_value("suffix: tokens", 1875.4) == "1,875 tokens"
    assert format_value("short", math.nan) == "n/a"


def test_pod_table_rows_join_queries_on_pod_and_model():
    panel = next(p for p in overview.build(BuildSettings()).panels if p.kind == "table")
    data = fetch_panel(panel, FakeSource(), 0, 600, 60, template_values(60, 15, 0, 600))
    header, rows = table_rows(data)
    assert header == ["pod", "model", "GPU hit", "CPU hit", "L2 hit", "Cumulative hit", "TTFT p95",
                      "GPU usage", "CPU usage"]
    assert [r[:2] for r in rows] == [["vllm-0", "llama-3.1-8b"], ["vllm-1", "llama-3.1-8b"]]
    # the fake's value at t=600 for series n: 0.1 + 0.1 n + 0.05 sin(2)
    first = 0.1 + 0.05 * math.sin(2)
    assert rows[0][2] == f"{first * 100:.1f}%" and rows[0][6] == f"{first * 1000:.0f} ms"
    assert rows[1][2] == f"{(first + 0.1) * 100:.1f}%"


def test_empty_panel_data_renders_without_series():
    panel = overview.build(BuildSettings()).panels[0]
    assert table_rows(PanelData(panel, ())) == ([], [])


def test_render_cli_reports_an_unreachable_prometheus(tmp_path):
    result = CliRunner().invoke(main, ["dashboards", "render", "--out", str(tmp_path),
                                       "--prometheus", "http://127.0.0.1:9"])
    assert result.exit_code == 1
    assert "cannot reach Prometheus at http://127.0.0.1:9" in result.output


def test_panels_without_data_are_named_with_the_reason():
    from dashboards.render import fetch_dashboard, without_data

    class EmptyFor(FakeSource):
        def query_range(self, expr, start, end, step):
            return [] if "tierpilot_kv_usage_ratio" in expr else super().query_range(expr, start, end, step)

    dashboard = overview.build(BuildSettings())
    data = fetch_dashboard(dashboard, EmptyFor(fail_on="tierpilot_l2_break_even_prompt_tokens"), 0, 3600,
                           scrape_interval=15)
    missing = dict(without_data(data))
    assert "bad_data" in missing["L2 break-even prompt length"]
    assert missing["Usage per tier"] == "no series with a value in the window"
    assert "Total hit ratio" not in missing
