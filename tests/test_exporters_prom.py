"""A real Prometheus scrapes the running agent on loopback and answers PromQL on the unified names.
It also scrapes the emulated vLLM endpoint directly, so its own histogram_quantile is the oracle
for the agent's TTFT quantiles."""
from __future__ import annotations

from pathlib import Path
from urllib.parse import urlsplit

import pytest
from prometheus_client.core import GaugeMetricFamily

from agent.collect.discovery import StaticTargets
from agent.runtime.app import Agent
from agent.settings import load_settings
from contracts.tier_model import Snapshot, Target
from exporters.prom import build_registry
from tests.support.fake_targets import OPENMETRICS, MetricsServer
from tests.support.prometheus import prometheus_factory  # noqa: F401

FIXTURES = Path(__file__).parent / "fixtures"
M = "meta-llama/Llama-3.1-8B-Instruct"


class TunerLike:
    """An extra collector as the tuner would provide."""

    def collect(self):
        g = GaugeMetricFamily("tierpilot_tuner_trials", "trials", labels=["study"])
        g.add_metric(["s1"], 3.0)
        yield g


@pytest.mark.slow
def test_prometheus_scrapes_the_agent_and_answers_promql(prometheus_factory):  # noqa: F811
    with MetricsServer() as srv:
        vllm = srv.route("/metrics", text=(FIXTURES / "vllm_0_33_dp2.prom").read_text())
        fuse = srv.route("/fuse", text=(FIXTURES / "curvine_fuse.prom").read_text())
        down = srv.route("/down", status=500)
        settings = load_settings(server={"host": "127.0.0.1", "port": 0}, scrape={"interval_s": 1})
        targets = StaticTargets([Target(vllm, "vllm", "vllm-0"), Target(fuse, "curvine-fuse", "vllm-0"),
                                 Target(down, "vllm", "vllm-1")])
        with Agent(settings, targets, collectors=[TunerLike()]) as agent:
            agent_addr = urlsplit(agent.url).netloc
            prom = prometheus_factory([agent_addr, urlsplit(vllm).netloc])
            prom.wait_for("tierpilot_kv_hit_ratio", min_series=3)
            prom.wait_for("vllm:time_to_first_token_seconds_bucket")
            by_tier = prom.query_by('tierpilot_kv_hit_ratio{pod="vllm-0"}', "tier")
            assert by_tier == {"gpu": 0.375, "cpu": 0.25, "l2": 0.2}
            assert prom.query_by('tierpilot_kv_cumulative_hit_ratio{pod="vllm-0"}', "tier") == {
                "gpu": 0.375, "cpu": 0.53125, "l2": 0.625}
            assert prom.query_value('sum(tierpilot_kv_lookup_tokens_total{tier="gpu"})') == 16000
            assert prom.query_value('tierpilot_kv_usage_ratio{tier="gpu"}') == 0.375
            assert prom.query_by('tierpilot_target_up', "pod") == {"vllm-0": 1.0, "vllm-1": 0.0}
            assert prom.query_value('sum(tierpilot_scrape_errors_total{reason="http_5xx"})') >= 1
            assert prom.query_value('tierpilot_l2_io_latency_quantile_seconds{op="read",q="0.95"}') \
                == pytest.approx(0.047)
            # the L2 histogram aggregates: Prometheus' own quantile over its buckets gives the same figure
            assert prom.query_value('histogram_quantile(0.95, sum by (le) '
                                    '(tierpilot_l2_io_latency_seconds_bucket{op="read"}))') == pytest.approx(0.047)
            assert prom.query_value('histogram_quantile(0.95, tierpilot_fleet_l2_io_latency_seconds_bucket'
                                    '{op="read"})') == pytest.approx(0.047)
            assert prom.query_value("tierpilot_tuner_trials") == 3.0
            # the oracle: Prometheus' own histogram_quantile over the raw vLLM buckets
            for q in ("0.5", "0.95", "0.99"):
                theirs = prom.query_value(
                    f"histogram_quantile({q}, sum by (le) (vllm:time_to_first_token_seconds_bucket))")
                ours = prom.query_value(f'tierpilot_ttft_quantile_seconds{{q="{q}"}}')
                assert ours == pytest.approx(theirs, rel=1e-9), q
                # the exported histograms carry vLLM's buckets: per pod and fleet quantiles agree
                per_pod = prom.query_value(f"histogram_quantile({q}, sum by (le) (tierpilot_ttft_seconds_bucket))")
                fleet = prom.query_value(f"histogram_quantile({q}, sum by (le) (tierpilot_fleet_ttft_seconds_bucket))")
                assert per_pod == pytest.approx(theirs, rel=1e-9) and fleet == pytest.approx(theirs, rel=1e-9), q
            # colons survive (classic text format): the raw vLLM names are queryable as well
            assert prom.query_value('sum(vllm:prefix_cache_hits_total)') == 6000


def test_metrics_text_is_classic_format_and_validated_by_promtool(tmp_path):
    import shutil
    import subprocess

    promtool = shutil.which("promtool") or "/usr/bin/promtool"
    with MetricsServer() as srv:
        vllm = srv.route("/metrics", text=(FIXTURES / "vllm_0_33_dp2.prom").read_text())
        agent = Agent(load_settings(), StaticTargets([Target(vllm, "vllm", "vllm-0")]))
        agent.scrape_now()
        text = agent.metrics_text()
    assert "# TYPE tierpilot_kv_hit_tokens_total counter" in text
    assert "# EOF" not in text
    result = subprocess.run([promtool, "check", "metrics"], check=False, input=text, capture_output=True, text=True)
    # promtool lints (e.g. counters named without a unit); it must not report a parse error
    assert "error while linting" not in (result.stdout + result.stderr)


def test_a_vanished_pod_leaves_no_series():
    snaps = {"a": Snapshot.empty()}
    registry = build_registry(lambda: snaps["a"])
    assert registry.get_sample_value("tierpilot_store_rows") == 0.0
    assert registry.get_sample_value("tierpilot_target_up", {"target": "x", "role": "vllm", "pod": "p"}) is None


def test_every_served_name_is_in_the_catalogue():
    import re

    doc = (Path(__file__).resolve().parent.parent / "docs" / "metrics.md").read_text()
    start = doc.index("## Unified tier metrics (agent)")
    mine = doc[start:doc.index("## KV-event workload signals")]
    documented = set(re.findall(r"`(tierpilot_[a-z0-9_]+)`", mine))
    with MetricsServer() as srv:
        targets = [Target(srv.route("/v", text=(FIXTURES / "vllm_0_33_dp2.prom").read_text()), "vllm", "v0"),
                   Target(srv.route("/f", text=(FIXTURES / "curvine_fuse.prom").read_text()), "curvine-fuse", "v0"),
                   Target(srv.route("/m", text=(FIXTURES / "curvine_master.prom").read_text()), "curvine-master", "m"),
                   Target(srv.route("/l", text=(FIXTURES / "lmcache_mp.om").read_text(), content_type=OPENMETRICS),
                          "lmcache", "v0")]
        agent = Agent(load_settings(), StaticTargets(targets))
        agent.scrape_now()
        served = set(re.findall(r"^# TYPE (tierpilot_[a-z0-9_]+) ", agent.metrics_text(), re.MULTILINE))
    assert served == documented


def test_fleet_histogram_sums_only_pods_whose_bounds_agree():
    from contracts.tier_model import HistogramView
    from exporters.histograms import fleet_histograms

    a = HistogramView("a", "m", (0.1, 1.0), (1.0, 3.0, 4.0), 2.0, 4.0)
    b = HistogramView("b", "m", (0.1, 1.0), (2.0, 2.0, 2.0), 0.1, 2.0)
    odd = HistogramView("c", "m", (0.5,), (5.0, 5.0), 1.0, 5.0)
    broken = HistogramView("d", "m", (0.1, 1.0), (1.0, 1.0), 0.1, 1.0)  # no +Inf bucket: skipped
    (f,) = fleet_histograms([("m", a), ("m", b), ("m", odd), ("m", broken)])
    assert (f.bounds, f.cumulative_counts, f.total, f.pods, f.excluded) == ((0.1, 1.0), (3.0, 5.0, 6.0), 2.1, 2, 1)
    registry = build_registry(lambda: Snapshot(taken_at=1.0, ttft_histograms=(a, b, odd)))
    assert registry.get_sample_value("tierpilot_fleet_ttft_seconds_bucket", {"model": "m", "le": "1.0"}) == 5.0
    assert registry.get_sample_value("tierpilot_ttft_seconds_bucket", {"pod": "c", "model": "m", "le": "+Inf"}) == 5.0
    assert registry.get_sample_value("tierpilot_fleet_excluded_pods",
                                     {"family": "tierpilot_fleet_ttft_seconds", "key": "m", "source": ""}) == 1.0
