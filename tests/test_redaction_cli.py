"""Everything the command line prints passes one redacting formatter: warnings, tables, JSON,
/metrics text, errors and exceptions of every command that takes a URL (`scrape-once -t` and
`--from-prometheus`, `kv-events --endpoint/--metrics`, `dashboards render --prometheus`).
The property runs the commands in-process on generated secret URLs and looks for the secrets in
their stdout and stderr."""
from __future__ import annotations

import io
import socket

import pytest
from click.testing import CliRunner
from hypothesis import HealthCheck, given, settings

from agent.cli import main
from agent.cli.run import parse_target
from tests.support.fake_targets import MetricsServer
from tests.test_agent_vllm_signals import vllm_payload
from tests.test_redaction import MARKS, secret_urls

pytestmark = pytest.mark.timeout(300)


def _leaks(text: str) -> list[str]:
    return [line for line in text.splitlines() if any(m.lower() in line.lower() for m in MARKS)]


def test_the_missing_series_warning_does_not_print_the_password(tmp_path):
    with MetricsServer() as srv:
        srv.route("/m", text=vllm_payload())  # LMCache configured, its series missing: a warning
        url = f"http://user:{MARKS[0]}@ssw0rd@127.0.0.1:{srv.port}/m"
        result = CliRunner().invoke(main, ["scrape-once", "-t", f"vllm={url}"])
    assert "lmcache_series_missing" in result.stderr
    assert _leaks(result.stdout + result.stderr) == []
    assert "http://***@127.0.0.1" in result.stderr


def test_a_pod_named_after_the_url_carries_no_userinfo():
    for url in ("http://u:pw@10.0.0.5:8000/metrics", "http://u:p/w@10.0.0.5:8000/metrics",
                "http://u:p@w@10.0.0.5:8000/metrics"):
        assert parse_target(url).pod == "10.0.0.5:8000"


def test_the_redacting_stream_redacts_whole_lines_and_passes_the_rest():
    from contracts.redact import RedactingStream

    raw = io.StringIO()
    out = RedactingStream(raw)
    out.write("GET http://u:se")  # a URL split across writes is held until its line ends
    out.write("cret@h/m?token=abc done\nnext ")
    assert raw.getvalue() == "GET http://***@h/m?token=*** done\n"
    out.flush()
    assert raw.getvalue().endswith("next ")
    assert out.isatty() is False and RedactingStream.around(out) is out


@pytest.fixture(scope="module")
def served():
    closed = socket.socket()
    closed.bind(("127.0.0.1", 0))  # bound, never listening: connection refused
    with MetricsServer() as srv:
        srv.route("/metrics", text=vllm_payload())
        yield srv.port, closed.getsockname()[1]
    closed.close()


def _scrapes(url: str) -> list[list[str]]:
    return [
        ["scrape-once", "-t", url],
        ["scrape-once", "-t", f"vllm={url}", "--format", "json"],
        ["scrape-once", "-t", f"vllm/p={url}", "--format", "prometheus"],
        ["scrape-once", "--from-prometheus", url, "--timeout", "2"],
        ["scrape-once", "-t", "ftp" + url.removeprefix("http")],
    ]


def _others(url: str, tmp: str, dead_port: int) -> list[list[str]]:
    # the KV-event endpoint is refused (a live non-ZMQ port would hang the command's zmq shutdown)
    tcp = "tcp://" + url.partition("://")[2].partition("/")[0].rpartition(":")[0] + f":{dead_port}"
    return [
        ["kv-events", "--endpoint", f"p0={tcp}", "--metrics", f"p0={url}", "--duration", "0.2", "--interval", "0.1"],
        ["dashboards", "render", "--out", tmp, "--prometheus", url, "--since", "5m"],
    ]


def _check(args: list[str]) -> None:
    result = CliRunner().invoke(main, args)
    printed = result.stdout + result.stderr + (repr(result.exception) if result.exception else "")
    assert _leaks(printed) == [], (args, _leaks(printed)[:3])


SLOW = [HealthCheck.function_scoped_fixture, HealthCheck.too_slow]


def test_no_scrape_prints_a_secret_url(served):
    port, dead_port = served

    @settings(max_examples=15, deadline=None, suppress_health_check=SLOW)
    @given(secret_urls(port, dead_port))
    def check(url: str) -> None:
        for args in _scrapes(url):
            _check(args)

    check()


def test_kv_events_and_dashboards_print_no_secret_url(served, tmp_path):
    port, dead_port = served
    for live in ("http://u:Qz7mark0@pw@127.0.0.1:{}/metrics", "http://u:Qz7mark0/x@127.0.0.1:{}/metrics?token=Qz7mark1"):
        for args in _others(live.format(port), str(tmp_path / "png"), dead_port):  # answered (not by the right server)
            _check(args)

    @settings(max_examples=30, deadline=None, suppress_health_check=SLOW)
    @given(secret_urls(dead_port, dead_port))  # refused at once: the error lines
    def check(url: str) -> None:
        for args in _others(url, str(tmp_path / "png"), dead_port):
            _check(args)

    check()
