"""What a new user meets on a first afternoon with the CLI: `--json` accepted wherever `--format json`
is, a Prometheus URL given with or without its `/api/v1`, a refused plain-http connection named by
host and port (never aiohttp's `ssl:default`), `--check-config` and `run` agreeing on an empty
config, every config problem named, piped tables printed whole, and `tune` keeping nothing on
disk unless told where (and saying when it resumes)."""
from __future__ import annotations

import http.server
import json
import os
import socket
import subprocess
import sys
import threading
from typing import ClassVar

import pytest
from click.testing import CliRunner

from agent.cli import main
from agent.settings import PrometheusSourceSettings, SettingsError, load_settings
from tests.conftest import REPO_ROOT
from tests.support.fake_targets import MetricsServer
from tests.test_cli_tables import FIXTURES

VLLM = (FIXTURES / "vllm_0_33_dp2.prom").read_text()


def test_scrape_once_takes_json_as_the_alias_of_format_json():
    with MetricsServer() as srv:
        url = srv.route("/metrics", text=VLLM)
        fmt = CliRunner().invoke(main, ["scrape-once", "-t", f"vllm/p={url}", "--format", "json"])
        alias = CliRunner().invoke(main, ["scrape-once", "-t", f"vllm/p={url}", "--json"])
    assert fmt.exit_code == 0 and alias.exit_code == 0, fmt.output + alias.output
    a, b = json.loads(fmt.output), json.loads(alias.output)
    assert [t["tier"] for t in a["tiers"]] == [t["tier"] for t in b["tiers"]] and a["tiers"]


@pytest.mark.parametrize("given", ["http://prom:9090", "http://prom:9090/", "http://prom:9090/api/v1",
                                   "http://prom:9090/api/v1/"])
def test_a_prometheus_url_with_or_without_api_v1_names_the_same_api(given):
    assert PrometheusSourceSettings(url=given).url == "http://prom:9090"
    assert PrometheusSourceSettings(url="http://thanos/q/api/v1").url == "http://thanos/q"


class _RecordPaths(http.server.BaseHTTPRequestHandler):
    paths: ClassVar[list[str]] = []

    def do_POST(self) -> None:
        type(self).paths.append(self.path.split("?", 1)[0])
        self.send_response(404)
        self.send_header("Content-Length", "0")
        self.end_headers()

    do_GET = do_POST

    def log_message(self, *args: object) -> None:
        pass


def test_from_prometheus_with_api_v1_in_the_url_queries_api_v1_once():
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _RecordPaths)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    try:
        base = f"http://127.0.0.1:{httpd.server_address[1]}"
        result = CliRunner().invoke(main, ["scrape-once", "--from-prometheus", base + "/api/v1/", "--timeout", "2"])
    finally:
        httpd.shutdown()
        httpd.server_close()
    paths = _RecordPaths.paths
    assert result.exit_code == 1, result.output
    assert paths and all(p.startswith("/api/v1/") and "/api/v1/api/v1" not in p for p in paths), paths


def _closed_port() -> int:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def test_a_refused_plain_http_target_is_named_by_host_and_port():
    port = _closed_port()
    result = CliRunner().invoke(main, ["scrape-once", "-t", f"vllm/p=http://127.0.0.1:{port}/metrics"],
                                env={"COLUMNS": "200"})
    assert result.exit_code == 1
    assert "ssl:default" not in result.output, result.output
    assert f"cannot connect to 127.0.0.1:{port}: connection refused" in result.output, result.output


def test_check_config_and_run_agree_on_a_config_without_targets(tmp_path):
    empty = tmp_path / "empty.yaml"
    empty.write_text("")
    checked = CliRunner().invoke(main, ["run", "--config", str(empty), "--check-config"])
    assert checked.exit_code == 0, checked.output
    assert "warning: no targets configured" in checked.output, checked.output
    with_target = tmp_path / "one.yaml"
    with_target.write_text("targets: {static: [{url: 'http://127.0.0.1:1/metrics', role: vllm, pod: p}]}\n")
    checked = CliRunner().invoke(main, ["run", "--config", str(with_target), "--check-config"])
    assert checked.exit_code == 0 and "warning" not in checked.output, checked.output


def test_a_config_error_names_every_problem(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("scrape: {interval_s: fast, timeout_s: slow}\nserver: {port: http}\nnonsense: 1\n")
    with pytest.raises(SettingsError) as err:
        load_settings(bad, env={})
    text = str(err.value)
    for key in ("scrape.interval_s", "scrape.timeout_s", "server.port", "nonsense"):
        assert f"'{key}'" in text, text
    assert "more)" not in text
    many = tmp_path / "many.yaml"
    many.write_text("".join(f"unknown_{i}: 1\n" for i in range(20)))
    with pytest.raises(SettingsError) as err:
        load_settings(many, env={})
    assert str(err.value).count("unknown key") == 8 and str(err.value).endswith("(and 12 more)"), str(err.value)


def test_a_piped_scrape_once_table_is_not_folded_at_80_columns(tmp_path):
    with MetricsServer() as srv:
        url = srv.route("/metrics", text=VLLM)
        env = {k: v for k, v in os.environ.items() if k != "COLUMNS"}
        proc = subprocess.run([sys.executable, "-m", "agent.cli", "scrape-once", "-t",
                               f"vllm/a-rather-long-pod-name-for-the-fleet-0={url}"], cwd=REPO_ROOT, env=env,
                              capture_output=True, text=True, timeout=60, check=False)
    assert proc.returncode == 0, proc.stderr
    assert max(map(len, proc.stdout.splitlines())) > 80, proc.stdout  # rows whole, one line each
    assert "a-rather-long-pod-name-for-the-fleet-0" in proc.stdout, proc.stdout
    assert "one scrape: ratios from lifetime totals" in proc.stdout, proc.stdout


TUNE = ["tune", "--workload", "short", "--duration", "30", "--pods", "2", "--trials", "1", "-q"]


def test_tune_keeps_no_study_file_unless_told_and_says_when_it_resumes(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    first = CliRunner().invoke(main, TUNE)
    assert first.exit_code == 0, first.output
    assert list(tmp_path.iterdir()) == [], list(tmp_path.iterdir())
    assert "in memory (not kept" in first.output and "resuming" not in first.output
    store = f"sqlite:///{tmp_path / 'study.db'}"
    kept = CliRunner().invoke(main, [*TUNE, "--storage", store])
    assert kept.exit_code == 0 and "resuming" not in kept.output, kept.output
    again = CliRunner().invoke(main, [*TUNE, "--storage", store])
    assert again.exit_code == 0, again.output
    assert f"resuming study 'tune-short' in {store}" in again.output, again.output
    assert "study now holds 2 trials" in again.output, again.output
