"""Role detection from a payload, the no-mapped-series warning, and the mappings exact to upstream
(LMCache MP's L2 eviction wire name, vllm-project/router's metrics from a capture of the real
binary)."""
from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner

from agent.cli import main
from agent.collect.discovery import StaticTargets, parse_target_file
from agent.collect.mapping import load_mappings
from agent.collect.normalise import normalise
from agent.collect.parse import parse
from agent.collect.roles import detect_role
from agent.runtime.app import Agent
from agent.settings import load_settings
from contracts.tier_model import AUTO_ROLE, Target
from tests.support.fake_targets import MetricsServer

FIXTURES = Path(__file__).parent / "fixtures"
MAPPINGS = load_mappings()

CURVINE_WORKER = """# TYPE capacity gauge
capacity 1000
# TYPE fs_used gauge
fs_used 250
# TYPE read_blocks counter
read_blocks{type="disk"} 12
# TYPE failed_disks gauge
failed_disks 0
"""


def fixture(name: str) -> str:
    return (FIXTURES / name).read_text()


@pytest.mark.parametrize("name, role", [
    ("vllm_0_33_dp2.prom", "vllm"), ("lmcache_inprocess.prom", "lmcache"), ("lmcache_mp.om", "lmcache"),
    ("curvine_fuse.prom", "curvine-fuse"), ("curvine_master.prom", "curvine-master"),
    ("router.prom", "router"), ("vllm_router_kv_aware.prom", "router"),
])
def test_fixture_roles_are_detected(name, role):
    assert detect_role(parse(fixture(name)).by_name) == role


@pytest.mark.parametrize("name, role", [
    ("datadog_vllm_metrics.prom", "vllm"), ("datadog_ray_vllm_metrics.prom", "vllm"),
    ("datadog_sglang_metrics.prom", "vllm"), ("lmcache_metrics_test_fixture.prom", "lmcache"),
])
def test_shared_sample_roles_are_detected(samples_dir, name, role):
    text = "\n".join(x for x in (samples_dir / name).read_text().split("\n") if x.strip() != "...")
    assert detect_role(parse(text).by_name) == role


def test_curvine_worker_and_unknown_payloads():
    assert detect_role(parse(CURVINE_WORKER).by_name) == "curvine-worker"
    assert detect_role(parse("# TYPE go_goroutines gauge\ngo_goroutines 12\n").by_name) is None


def test_lmcache_mp_l2_evictions_use_the_otel_wire_name():
    # instrument lmcache_mp.l2_evicted_objects, unit chunks -> ..._objects_chunks_total on /metrics
    target = Target("http://l/metrics", "lmcache", "v0")
    out = normalise(target, parse(fixture("lmcache_mp.om"), MAPPINGS.wanted["lmcache"]), MAPPINGS)
    assert [s.value for s in out.signals if s.name == "l2_evicted_chunks"] == [7.0]


def test_vllm_router_metrics_from_the_real_binary_are_mapped():
    target = Target("http://r/metrics", "router", "router-0")
    out = normalise(target, parse(fixture("vllm_router_kv_aware.prom"), MAPPINGS.wanted["router"]), MAPPINGS)
    got = {(s.name, s.le if s.le == s.le else None): s.value for s in out.signals}
    assert got[("router_requests", None)] == 4
    assert got[("router_latency_seconds:count", None)] == 4
    assert got[("router_latency_seconds", 0.01)] == 1 and got[("router_latency_seconds", float("inf"))] == 4
    assert {s.source for s in out.signals} == {"vllm_router"}


def _agent(targets):
    return Agent(load_settings(None, env={}), StaticTargets(targets))


def test_scrape_without_a_role_detects_it_and_keeps_the_detected_role():
    with MetricsServer() as srv:
        master = srv.route("/master", text=fixture("curvine_master.prom"))
        agent = _agent([Target(master, AUTO_ROLE, "cm")])  # type: ignore[arg-type]
        for _ in range(2):
            snap = agent.scrape_now()
            (st,) = snap.targets
            assert (st.up, st.target.role, st.warnings) == (True, "curvine-master", ())
            (l2,) = snap.tiers
            assert (l2.tier, l2.source, l2.usage_ratio) == ("l2", "curvine_master", 0.25)


def test_a_target_yielding_no_mapped_series_is_warned_about_naming_what_was_seen():
    with MetricsServer() as srv:
        fuse = srv.route("/fuse", text=fixture("curvine_fuse.prom"))
        other = srv.route("/other", text="# TYPE go_goroutines gauge\ngo_goroutines 12\n")
        agent = _agent([Target(fuse, "vllm", "v0"), Target(other, AUTO_ROLE, "x")])  # type: ignore[arg-type]
        snap = agent.scrape_now()
        by_url = {st.target.url: st for st in snap.targets}
        (w,) = by_url[fuse].warnings
        assert by_url[fuse].up and w[0] == "no_mapped_series"
        assert "looks like Curvine FUSE client (curvine_fuse_*): give role curvine-fuse" in w[1]
        assert "families: curvine_fuse_active_requests, curvine_fuse_io_bytes_total" in w[1]
        (w,) = by_url[other].warnings
        assert w == ("no_mapped_series", "role not detected from the payload; 1 samples; families: go_goroutines")
        text = agent.metrics_text()
        assert (f'tierpilot_target_warning{{pod="v0",reason="no_mapped_series",role="vllm",target="{fuse}"}} 1.0'
                in text)


def test_scrape_once_detects_roles_and_warns_on_stderr():
    with MetricsServer() as srv:
        url = srv.route("/metrics", text=fixture("curvine_master.prom"))
        junk = srv.route("/junk", text="# TYPE process_cpu_seconds_total counter\nprocess_cpu_seconds_total 3\n")
        result = CliRunner().invoke(main, ["scrape-once", "-t", url, "-t", junk, "--format", "json"])
        assert result.exit_code == 0, result.output
        assert '"role": "curvine-master"' in result.stdout
        assert (f"warning: {junk} (auto): no_mapped_series: role not detected from the payload; "
                "1 samples; families: process_cpu_seconds_total") in result.stderr


def test_target_file_role_is_optional():
    (t,) = parse_target_file("targets:\n  - {url: 'http://a:9001/metrics', pod: cm}\n")
    assert t.role == AUTO_ROLE
    with pytest.raises(ValueError, match="targets.0.role"):
        parse_target_file("targets:\n  - {url: 'http://a/metrics', pod: cm, role: gpu}\n")
