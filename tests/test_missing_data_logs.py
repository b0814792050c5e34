"""Say why data is missing: over real HTTP, a running agent whose one target serves a malformed
histogram (`le="abc"`, then buckets without `le`), then only families no mapping reads, then
nothing at all, logs ONE line per change of the target's state (never one per scrape), and
/metrics carries the reason beside `tierpilot_target_up` while it lasts."""
from __future__ import annotations

import logging
import re
import time
from collections.abc import Iterator

import pytest

from agent.collect.discovery import StaticTargets
from agent.runtime.app import Agent
from agent.settings import load_settings
from contracts.tier_model import Target
from tests.support.fake_targets import MetricsServer

MODEL = 'model_name="m"'
GOOD = f"""# TYPE vllm:prefix_cache_queries counter
vllm:prefix_cache_queries_total{{engine="0",{MODEL}}} 100
# TYPE vllm:prefix_cache_hits counter
vllm:prefix_cache_hits_total{{engine="0",{MODEL}}} 40
# TYPE vllm:time_to_first_token_seconds histogram
vllm:time_to_first_token_seconds_bucket{{engine="0",le="0.1",{MODEL}}} 3
vllm:time_to_first_token_seconds_bucket{{engine="0",le="+Inf",{MODEL}}} 5
vllm:time_to_first_token_seconds_count{{engine="0",{MODEL}}} 5
vllm:time_to_first_token_seconds_sum{{engine="0",{MODEL}}} 0.7
"""
LE_ABC = GOOD.replace('le="0.1"', 'le="abc"')
NO_LE = GOOD.replace('le="0.1",', "")
UNKNOWN = "# TYPE some_other_exporter_total counter\nsome_other_exporter_total 7\n"
SCRAPES_PER_STATE = 3
LOGGER = "tierpilot.targets"


@pytest.fixture
def agent_and_server() -> Iterator[tuple[Agent, MetricsServer]]:
    srv = MetricsServer()
    srv.route("/metrics", text=GOOD)
    settings = load_settings(env={}, server={"host": "127.0.0.1", "port": 0},
                             scrape={"interval_s": 3600.0, "backoff_base_s": 0.0, "timeout_s": 2.0})
    agent = Agent(settings, StaticTargets([Target(srv.url("/metrics"), "vllm", "p")]))
    agent.start()
    deadline = time.monotonic() + 20
    while agent.cycles < 1 and time.monotonic() < deadline:
        time.sleep(0.02)
    try:
        yield agent, srv
    finally:
        agent.stop()
        srv.close()


def _lines(caplog: pytest.LogCaptureFixture) -> list[str]:
    lines = [r.getMessage() for r in caplog.records if r.name == LOGGER]
    caplog.clear()
    return lines


def _down_reasons(metrics: str) -> list[str]:
    return re.findall(r'^tierpilot_target_down_reason\{[^}]*reason="([^"]+)"[^}]*\} 1\.0$', metrics, re.MULTILINE)


def _warnings(metrics: str) -> list[str]:
    return re.findall(r'^tierpilot_target_warning\{[^}]*reason="([^"]+)"[^}]*\} 1\.0$', metrics, re.MULTILINE)


def _up(metrics: str) -> float:
    m = re.search(r"^tierpilot_target_up\{[^}]*\} (\S+)$", metrics, re.MULTILINE)
    assert m is not None, metrics[:2000]
    return float(m.group(1))


def _scrape(agent: Agent, times: int = SCRAPES_PER_STATE) -> None:
    for _ in range(times):
        agent.scrape_now(timeout=20)


def test_each_change_of_state_logs_one_line_with_its_reason(agent_and_server, caplog):
    agent, srv = agent_and_server
    caplog.set_level(logging.INFO, logger=LOGGER)
    _scrape(agent)
    assert _lines(caplog) == []  # a clean target says nothing, however often it is read

    srv.route("/metrics", text=LE_ABC)
    _scrape(agent)
    lines = _lines(caplog)
    assert len(lines) == 1, lines
    assert " is down: malformed_histogram" in lines[0] and "series dropped" in lines[0]
    metrics = agent.metrics_text()
    assert _up(metrics) == 0.0 and _down_reasons(metrics) == ["malformed_histogram"]
    status = agent.scrape_now(timeout=20).targets[0]
    assert status.reason == "malformed_histogram" and "malformed_histogram" in status.detail
    assert _lines(caplog) == []

    srv.route("/metrics", text=NO_LE)  # the same reason: the same state, no new line
    _scrape(agent)
    assert _lines(caplog) == []
    assert _down_reasons(agent.metrics_text()) == ["malformed_histogram"]

    srv.route("/metrics", text=GOOD)
    _scrape(agent)
    lines = _lines(caplog)
    assert len(lines) == 1 and " is up again after " in lines[0] and "(malformed_histogram)" in lines[0], lines
    metrics = agent.metrics_text()
    assert _up(metrics) == 1.0 and _down_reasons(metrics) == [] and _warnings(metrics) == []

    srv.route("/metrics", text=UNKNOWN)  # only families no mapping reads: up, with a warning
    _scrape(agent)
    lines = _lines(caplog)
    assert len(lines) == 1 and " warns no_mapped_series: " in lines[0] and "some_other_exporter" in lines[0], lines
    metrics = agent.metrics_text()
    assert _up(metrics) == 1.0 and _warnings(metrics) == ["no_mapped_series"]

    srv.route("/metrics", status=500)
    _scrape(agent)
    lines = _lines(caplog)
    assert len(lines) == 2 and lines[0].endswith("is down: http_5xx: HTTP 500"), lines
    assert lines[1].endswith("no longer warns no_mapped_series"), lines
    assert _down_reasons(agent.metrics_text()) == ["http_5xx"]

    srv.route("/metrics", text=GOOD)
    _scrape(agent)
    lines = _lines(caplog)
    assert len(lines) == 1 and "is up again after 3 cycles down (http_5xx)" in lines[0], lines
