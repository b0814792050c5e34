"""Structural checks of the generated dashboards and of the small builders behind them."""
from __future__ import annotations

import json
import re

import pytest

from dashboards import alert_rules, build
from dashboards.catalog import (
    CATALOGUE,
    dashboard_queries,
    documented_names,
    recorded_names,
    rule_queries,
    unknown_names,
)
from dashboards.grafana import DashboardError, Panel, Query, layout
from dashboards.promql import expand, metric_names, selector
from dashboards.sdk import dashboard_json
from dashboards.settings import BuildSettings
from tests.conftest import REPO_ROOT

SETTINGS = BuildSettings()
DASHBOARDS = build.dashboards(SETTINGS)
JSON = [dashboard_json(d) for d in DASHBOARDS]
VARIABLE_REF = re.compile(r"\$\{?(\w+)")


def test_three_dashboards_with_unique_uids_and_panel_ids():
    uids = [j["uid"] for j in JSON]
    assert uids == ["tierpilot-overview", "tierpilot-tuner", "tierpilot-agent-health"]
    assert len(set(uids)) == len(uids)
    for j in JSON:
        ids = [p["id"] for p in j["panels"]]
        assert ids == list(range(1, len(ids) + 1)), j["uid"]


def test_every_panel_has_a_unit_and_uses_the_datasource_variable():
    for j in JSON:
        names = [v["name"] for v in j["templating"]["list"]]
        assert names[0] == "datasource" and j["templating"]["list"][0]["type"] == "datasource"
        for p in j["panels"]:
            where = f"{j['uid']} / {p['title']}"
            assert p["fieldConfig"]["defaults"]["unit"], where
            assert p["datasource"] == {"type": "prometheus", "uid": "${datasource}"}, where
            assert p["targets"], where
            for t in p["targets"]:
                assert t["datasource"] == {"type": "prometheus", "uid": "${datasource}"}, where
                assert t["expr"].strip(), where
        for a in j["annotations"]["list"]:
            assert a["datasource"]["uid"] == "${datasource}", a["name"]
        for v in j["templating"]["list"][1:]:
            assert v["datasource"]["uid"] == "${datasource}", v["name"]


def test_template_variables_cover_datasource_namespace_model_pod():
    overview = JSON[0]
    assert [v["name"] for v in overview["templating"]["list"]] == ["datasource", "namespace", "model", "pod"]
    for j in JSON:
        defined = {v["name"] for v in j["templating"]["list"]}
        used = {m for p in j["panels"] for t in p["targets"] for m in VARIABLE_REF.findall(t["expr"])}
        assert used - {"__rate_interval"} <= defined, (j["uid"], used - defined)


def test_overview_has_every_panel_the_issue_asks_for():
    titles = [p["title"] for p in JSON[0]["panels"]]
    for needed in ("Hit ratio per tier (tier-conditional)", "Cumulative hit ratio per tier",
                   "TTFT p50 / p95 / p99 against the SLO", "L2 read and write latency",
                   "Evictions per tier", "Usage per tier", "Pods", "L2 break-even prompt length"):
        assert needed in titles
    ttft = next(p for p in JSON[0]["panels"] if p["title"].startswith("TTFT p50"))
    steps = ttft["fieldConfig"]["defaults"]["thresholds"]["steps"]
    assert steps[-1] == {"color": "red", "value": SETTINGS.slo.ttft_seconds}
    assert ttft["fieldConfig"]["defaults"]["custom"]["thresholdsStyle"]["mode"] == "line+area"


def test_tuner_dashboard_marks_applies_rollbacks_and_drift():
    tuner = JSON[1]
    names = [a["name"] for a in tuner["annotations"]["list"]]
    assert names == ["Applies", "Rollbacks", "Drift"]
    config = next(p for p in tuner["panels"] if p["title"] == "Current configuration")
    order = config["transformations"][1]["options"]["indexByName"]
    assert list(order)[:4] == ["workload", "chunk_tokens", "cpu_gib", "cpu_eviction"]


def test_every_metric_a_query_uses_is_in_the_catalogue():
    documented = documented_names((REPO_ROOT / CATALOGUE).read_text())
    groups = alert_rules.groups(SETTINGS)
    refs = [r for d in DASHBOARDS for r in dashboard_queries(d)] + list(rule_queries(groups))
    missing = unknown_names(refs, documented, recorded_names(groups))
    assert not missing, "not in docs/metrics.md:\n" + "\n".join(missing)


def test_committed_json_is_valid_and_matches_the_builder():
    for d, j in zip(DASHBOARDS, JSON):
        on_disk = json.loads((REPO_ROOT / build.DASHBOARD_DIR / f"{d.uid}.json").read_text())
        assert on_disk == j


# -- builder units --------------------------------------------------------------------------

def test_metric_names_skips_functions_labels_keywords_and_durations():
    expr = ('sum by (tier) (rate(a_total{pod=~"$pod", x="rate(b)"}[$__rate_interval])) / ignoring(x) '
            'group_left(y) max(c:d:e offset 5m) > bool 1e3 and on() absent(up{job="t"}) '
            'or avg_over_time(f[1h:5m])')
    assert metric_names(expr) == {"a_total", "c:d:e", "up", "f"}


def test_expand_substitutes_known_and_rejects_unknown_variables():
    assert expand('x{pod=~"$pod"}[${__rate_interval}]', {"pod": ".*", "__rate_interval": "1m"}) == \
        'x{pod=~".*"}[1m]'
    with pytest.raises(KeyError, match=r"\$podd"):
        expand('x{pod=~"$podd"}', {"pod": ".*"})


def test_selector_and_layout():
    assert selector('tier="l2"', scope=("pod",)) == '{pod=~"$pod", tier="l2"}'
    panels = tuple(Panel(f"p{i}", "stat", "s", (Query("up"),), width=w, height=h)
                   for i, (w, h) in enumerate([(12, 4), (12, 8), (24, 6), (6, 5)]))
    assert layout(panels) == [{"h": 4, "w": 12, "x": 0, "y": 0}, {"h": 8, "w": 12, "x": 12, "y": 0},
                              {"h": 6, "w": 24, "x": 0, "y": 8}, {"h": 5, "w": 6, "x": 0, "y": 14}]


def test_panel_without_unit_or_query_is_rejected():
    with pytest.raises(DashboardError, match="needs a unit"):
        Panel("x", "stat", "", (Query("up"),))
    with pytest.raises(DashboardError, match="at least one query"):
        Panel("x", "stat", "s", ())
    with pytest.raises(DashboardError, match="kind 'pie'"):
        Panel("x", "pie", "s", (Query("up"),))  # type: ignore[arg-type]


def test_every_dashboard_validates_against_the_grafana_sdk_schema():
    from dashboards.schema import problems

    for j in JSON:
        assert problems(j) == [], j["uid"]


def test_the_schema_check_can_fail():
    import copy

    from dashboards.schema import problems

    bad = copy.deepcopy(JSON[0])
    bad["panels"][0]["options"]["graphMode"] = "sparkle"  # not a BigValueGraphMode
    bad["panels"][0]["gridPos"]["w"] = "wide"  # not an int
    bad["panels"][1]["fieldConfig"]["defaults"]["colour"] = {"mode": "thresholds"}  # misspelt field
    found = problems(bad)
    assert any("graph_mode: 'sparkle'" in f for f in found), found
    assert any("grid_pos.w: 'wide'" in f for f in found), found
    assert "dashboard.panels[1].fieldConfig.defaults.colour: not in the schema" in found


def test_headline_hit_ratio_uses_the_deepest_tier_present():
    """No "no data" without an L2: the stat takes each pod's maximum cumulative ratio over its tiers."""
    stat = next(p for p in DASHBOARDS[0].panels if p.title == "Total hit ratio")
    (q,) = stat.queries
    assert 'tier="l2"' not in q.expr and "max by (namespace, pod, model)" in q.expr
    # the L2 stats say why they are empty instead of "No data"
    l2 = {p["title"]: p["fieldConfig"]["defaults"].get("noValue") for p in JSON[0]["panels"]}
    assert l2["L2 read p95 (worst pod)"] == "no L2 reads" and l2["L2 break-even prompt length"] == "L2 never wins"
