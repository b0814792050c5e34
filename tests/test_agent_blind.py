"""Loud when blind: an agent that reads nothing says so in /healthz (status degraded, with the
reason) and in /metrics (tierpilot_target_down_reason), and logs one line per change of a
target's state, never one per cycle; `tierpilot kv-events` against a dead endpoint fails."""
from __future__ import annotations

import http.server
import json
import logging
import threading
import time
import urllib.request
from collections.abc import Iterator

import pytest
from click.testing import CliRunner

from agent.cli import main
from agent.collect.discovery import StaticTargets
from agent.runtime.app import Agent
from agent.runtime.target_watch import Blindness, TargetLog
from agent.settings import load_settings
from contracts.tier_model import Target, TargetStatus
from tests.support.fake_targets import MetricsServer
from tests.support.prometheus import free_port

VLLM = """# TYPE vllm:prefix_cache_queries counter
vllm:prefix_cache_queries_total{engine="0",model_name="m"} 100
# TYPE vllm:prefix_cache_hits counter
vllm:prefix_cache_hits_total{engine="0",model_name="m"} 40
"""


def _settings(**extra):
    return load_settings(server={"host": "127.0.0.1", "port": 0},
                         scrape={"interval_s": 3600.0, "backoff_base_s": 0.0, "blind_after_cycles": 2}, **extra)


def _health(agent: Agent) -> tuple[int, dict]:
    try:
        with urllib.request.urlopen(agent.url.replace("/metrics", "/healthz"), timeout=10) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def _lines(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == "tierpilot.targets"]


@pytest.fixture
def started() -> Iterator[list[Agent]]:
    agents: list[Agent] = []
    yield agents
    for a in agents:
        a.stop()


def _start(agent: Agent, agents: list[Agent]) -> Agent:
    agents.append(agent)
    agent.start()
    deadline = time.monotonic() + 20
    while agent.cycles < 1 and time.monotonic() < deadline:
        time.sleep(0.02)
    return agent


def test_every_static_target_refusing_is_degraded_with_the_reason(started, caplog):
    caplog.set_level(logging.INFO, logger="tierpilot.targets")
    dead = [Target(f"http://127.0.0.1:{free_port()}/metrics", "vllm", f"vllm-{i}") for i in range(2)]
    agent = _start(Agent(_settings(), StaticTargets(dead)), started)
    status, body = _health(agent)
    assert status == 200 and body["status"] == "ok"  # one blind cycle: not yet
    for _ in range(4):
        agent.scrape_now()
    status, body = _health(agent)
    assert status == 200 and body["ok"] and body["ready"]  # probes unchanged: a restart brings nothing back
    assert body["status"] == "degraded" and "targets" in body["degraded"]
    assert body["reason"].startswith("blind: none of 2 targets read for 5 cycles (connection_refused x2)")
    assert body["targets"] == {"total": 2, "up": 0, "down_by_reason": {"connection_refused": 2}}
    metrics = urllib.request.urlopen(agent.url, timeout=10).read().decode()
    for t in dead:
        assert (f'tierpilot_target_down_reason{{pod="{t.pod}",reason="connection_refused",role="vllm",'
                f'target="{t.url}"}} 1.0') in metrics
    lines = _lines(caplog)
    assert len(lines) == 2, lines  # one per target, not one per cycle
    assert all(" is down: connection_refused" in line for line in lines)


def test_a_target_going_down_and_up_again_logs_once_each_way(started, caplog):
    caplog.set_level(logging.INFO, logger="tierpilot.targets")
    with MetricsServer() as srv:
        url = srv.route("/metrics", text=VLLM)
        agent = _start(Agent(_settings(), StaticTargets([Target(url, "vllm", "vllm-0")])), started)
        agent.scrape_now()
        assert _health(agent)[1]["status"] == "ok" and _lines(caplog) == []
        srv.route("/metrics", status=500)
        for _ in range(3):
            agent.scrape_now()
        metrics = agent.metrics_text()
        assert 'reason="http_5xx"' in metrics.split("tierpilot_target_down_reason{", 1)[1].split("\n", 1)[0]
        srv.route("/metrics", text=VLLM)
        agent.scrape_now()
        agent.scrape_now()
        assert "tierpilot_target_down_reason{" not in agent.metrics_text()
        assert _health(agent)[1]["status"] == "ok"
    lines = _lines(caplog)
    assert len(lines) == 2, lines
    assert f"target {url} (vllm, pod vllm-0) is down: http_5xx" in lines[0]
    assert lines[1] == f"target {url} (vllm, pod vllm-0) is up again after 3 cycles down (http_5xx)"


class _PlainHandler(http.server.BaseHTTPRequestHandler):
    """A plain web server: every path is an HTML page."""

    def log_message(self, *args: object) -> None:
        pass

    def _page(self) -> None:
        body = b"<html><body>hello</body></html>"
        self.send_response(200)
        self.send_header("Content-Type", "text/html")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    do_GET = _page
    do_POST = _page


@pytest.mark.parametrize("server", ["404", "html"])
def test_a_query_source_that_is_not_a_prometheus_is_degraded(started, server):
    if server == "404":
        srv: object = MetricsServer()
        base = srv.url("")  # type: ignore[attr-defined]
    else:
        srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _PlainHandler)
        threading.Thread(target=srv.serve_forever, daemon=True).start()  # type: ignore[attr-defined]
        base = f"http://127.0.0.1:{srv.server_address[1]}"  # type: ignore[attr-defined]
    try:
        agent = _start(Agent(_settings(source="prometheus", prometheus={"url": base, "timeout_s": 2.0})), started)
        for _ in range(2):
            agent.scrape_now()
        status, body = _health(agent)
    finally:
        if server == "404":
            srv.close()  # type: ignore[attr-defined]
        else:
            srv.shutdown()  # type: ignore[attr-defined]
            srv.server_close()  # type: ignore[attr-defined]
    assert status == 200 and body["status"] == "degraded", body
    assert body["reason"].startswith("blind: none of 1 target read for 3 cycles ("), body["reason"]
    assert body["targets"]["up"] == 0


def test_no_targets_at_all_is_blind_too():
    b = Blindness(after_cycles=2)
    b.observe([])
    assert b.problem() is None
    b.observe([])
    assert b.problem() == "blind: no targets for 2 cycles (discovery found none, or the query source lists none)"
    b.observe([TargetStatus(Target("http://x/metrics", "vllm", "p"), True, 0.1)])
    assert b.problem() is None


def test_warnings_and_reason_changes_are_logged_once_per_change():
    log = TargetLog(logging.getLogger("test.targets"))
    t = Target("http://u:secret@x:1/metrics", "vllm", "p")
    up = TargetStatus(t, True, 0.1)
    warned = TargetStatus(t, True, 0.1, warnings=(("no_mapped_series", "saw go_* only"),))
    assert log.observe([up]) == []
    assert log.observe([warned]) == ["target http://***@x:1/metrics (vllm, pod p) warns no_mapped_series: saw go_* only"]
    assert log.observe([warned]) == []
    assert log.observe([up]) == ["target http://***@x:1/metrics (vllm, pod p) no longer warns no_mapped_series"]
    down = TargetStatus(t, False, 0.1, "timeout", "no answer in 5s")
    assert log.observe([down]) == ["target http://***@x:1/metrics (vllm, pod p) is down: timeout: no answer in 5s"]
    skipped = TargetStatus(t, False, 0.0, "timeout", "skipped: backing off", skipped=True)
    assert log.observe([skipped]) == []
    refused = TargetStatus(t, False, 0.1, "connection_refused")
    assert log.observe([refused]) == [
        "target http://***@x:1/metrics (vllm, pod p) is down: connection_refused (was down: timeout)"]
    assert log.observe([up]) == [("target http://***@x:1/metrics (vllm, pod p) is up again after 3 cycles down "
                                 "(connection_refused)")]


def test_kv_events_against_a_dead_endpoint_fails_with_one_line():
    port = free_port()
    result = CliRunner().invoke(main, ["kv-events", "--endpoint", f"pod-a=tcp://127.0.0.1:{port}",
                                       "--interval", "0.2", "--duration", "0.5", "--json"])
    assert result.exit_code == 1, result.output
    assert f"no KV-event publisher answers: pod-a tcp://127.0.0.1:{port} (connection refused)" in result.output
    assert "{" not in result.output  # no zero-filled report
