"""The running agent: scheduler, /metrics over HTTP, extra jobs and collectors, clean SIGTERM,
config errors, and the CLI."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

import pytest
from click.testing import CliRunner
from prometheus_client.core import CounterMetricFamily

from agent.cli import main
from agent.collect.discovery import StaticTargets
from agent.collect.scheduler import JobSpec
from agent.runtime.app import Agent
from agent.settings import load_settings
from contracts.tier_model import Target
from tests.support.fake_targets import MetricsServer
from tests.support.prometheus import free_port

FIXTURES = Path(__file__).parent / "fixtures"
REPO = Path(__file__).resolve().parent.parent


class KvMisses:
    def collect(self):
        c = CounterMetricFamily("tierpilot_kv_misses", "misses", labels=["cause"])
        c.add_metric(["cold"], 7.0)
        yield c


def test_started_agent_runs_jobs_serves_metrics_and_stops():
    ran = threading.Event()
    calls = []

    def drift_check():
        calls.append(time.monotonic())
        ran.set()

    with MetricsServer() as srv:
        url = srv.route("/metrics", text=(FIXTURES / "vllm_0_33_dp2.prom").read_text())
        settings = load_settings(server={"host": "127.0.0.1", "port": 0, "snapshot": True}, scrape={"interval_s": 0.2})
        agent = Agent(settings, StaticTargets([Target(url, "vllm", "vllm-0")]), collectors=[KvMisses()],
                      jobs=[JobSpec("drift", 0.2, drift_check), ("noop", 0.2, lambda: None)])
        agent.start()
        try:
            assert ran.wait(10)
            deadline = time.monotonic() + 10
            while agent.cycles < 2 and time.monotonic() < deadline:
                time.sleep(0.05)
            assert agent.cycles >= 2
            with urllib.request.urlopen(agent.url) as resp:
                assert resp.headers["Content-Type"].startswith("text/plain; version=0.0.4")
                body = resp.read().decode()
            assert 'tierpilot_kv_misses_total{cause="cold"} 7.0' in body
            assert 'tierpilot_job_runs_total{outcome="ok",task="scrape"}' in body
            assert 'tierpilot_job_runs_total{outcome="ok",task="drift"}' in body
            assert 'tierpilot_kv_hit_tokens_total{model="meta-llama/Llama-3.1-8B-Instruct",pod="vllm-0",' \
                   'source="vllm_v1",tier="gpu"} 6000.0' in body
            health = json.loads(urllib.request.urlopen(agent.url.replace("/metrics", "/healthz")).read())
            assert health["ok"] and health["cycles"] >= 2
            snap = json.loads(urllib.request.urlopen(agent.url.replace("/metrics", "/snapshot")).read())
            assert {t["tier"] for t in snap["tiers"]} == {"gpu", "cpu", "l2"}
            # the store's read API is strictly the window: static counters = no traffic = no ratio
            assert agent.store.hit_ratios(pod="vllm-0") == {}
            assert agent.store.values(pod="vllm-0")[0]["gpu_lookup_tokens"] == 0.0
        finally:
            agent.stop()
        port = int(agent.url.rsplit(":", 1)[1].split("/")[0])
        with pytest.raises(OSError):
            urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2)


def test_tierpilot_run_stops_cleanly_on_sigterm(tmp_path):
    with MetricsServer() as srv:
        url = srv.route("/metrics", text=(FIXTURES / "vllm_0_33_dp2.prom").read_text())
        port = free_port()
        config = tmp_path / "agent.yaml"
        config.write_text(f"server: {{host: 127.0.0.1, port: {port}}}\n"
                          f"scrape: {{interval_s: 0.5}}\n"
                          f"targets:\n  static:\n    - {{url: '{url}', role: vllm, pod: vllm-0}}\n")
        env = {**os.environ, "TIERPILOT_SCRAPE__TIMEOUT_S": "2"}
        proc = subprocess.Popen([sys.executable, "-m", "agent.cli", "run", "--config", str(config)], cwd=REPO,
                                env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True)
        try:
            body = ""
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline and "tierpilot_kv_hit_ratio{" not in body:
                try:
                    body = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2).read().decode()
                except OSError:
                    time.sleep(0.2)
            assert "tierpilot_kv_hit_ratio{" in body
            proc.send_signal(signal.SIGTERM)
            _out, err = proc.communicate(timeout=20)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        assert proc.returncode == 0, err.decode()
        assert b"tierpilot agent stopped" in err


def test_bad_config_is_one_clear_error_naming_the_key(tmp_path):
    config = tmp_path / "agent.yaml"
    config.write_text("scrape:\n  timeout_s: -1\n")
    result = CliRunner().invoke(main, ["run", "--config", str(config)])
    assert result.exit_code == 1
    assert result.output.strip() == f"Error: {config}: key 'scrape.timeout_s': Input should be greater than 0"
    config.write_text("scrape:\n  timeuot_s: 1\n")
    result = CliRunner().invoke(main, ["run", "--config", str(config)])
    assert "key 'scrape.timeuot_s': unknown key" in result.output


def test_environment_overrides_the_file(tmp_path):
    config = tmp_path / "agent.yaml"
    config.write_text("scrape: {interval_s: 30, timeout_s: 4}\n")
    s = load_settings(config, env={"TIERPILOT_SCRAPE__INTERVAL_S": "5"})
    assert (s.scrape.interval_s, s.scrape.timeout_s) == (5.0, 4.0)


def test_scrape_once_formats():
    with MetricsServer() as srv:
        url = srv.route("/metrics", text=(FIXTURES / "vllm_0_33_dp2.prom").read_text())
        fuse = srv.route("/fuse", text=(FIXTURES / "curvine_fuse.prom").read_text())
        runner = CliRunner()
        prom = runner.invoke(main, ["scrape-once", "-t", f"vllm/v0={url}", "-t", f"curvine-fuse/v0={fuse}",
                                    "--format", "prometheus"])
        assert prom.exit_code == 0, prom.output
        # exactly what /metrics would serve: same agent code path, same families
        assert 'tierpilot_kv_hit_ratio{model="meta-llama/Llama-3.1-8B-Instruct",pod="v0",source="vllm_by_source",' \
               'tier="l2"} 0.2' in prom.output
        assert 'tierpilot_l2_io_latency_quantile_seconds{op="write",pod="v0",q="0.5",source="curvine_fuse"} 0.00075' in prom.output
        assert 'tierpilot_l2_io_latency_seconds_bucket{le="+Inf",op="write",pod="v0",source="curvine_fuse"}' in prom.output
        js = runner.invoke(main, ["scrape-once", "-t", url, "--format", "json"])
        data = json.loads(js.output)
        assert {(t["tier"], t["hit_ratio"]) for t in data["tiers"]} == {("gpu", 0.375), ("cpu", 0.25), ("l2", 0.2)}
        table = runner.invoke(main, ["scrape-once", "-t", url], env={"COLUMNS": "200"})
        assert table.exit_code == 0 and "vllm_by_source" in table.output
        down = runner.invoke(main, ["scrape-once", "-t", "http://127.0.0.1:1/metrics", "--timeout", "1"])
        assert down.exit_code == 1
        bad = runner.invoke(main, ["scrape-once", "-t", "gpu=http://x/metrics"])
        assert bad.exit_code == 2 and "unknown role 'gpu'" in bad.output
