"""User mistakes are one line and a non-zero exit, before any work: a port already in use (before
the banner claims it, with no aiohttp `Unclosed client session`), output paths that cannot be
written (`replay --plot`, `tune --out` / `--plot-dir`, `demo --report-dir`, `dashboards render
--out`), a config file that does not exist, and `run --check-config`."""
from __future__ import annotations

import os
import socket
import subprocess
import sys
import time

import pytest
from click.testing import CliRunner

from agent.cli import main
from tests.conftest import REPO_ROOT


def _one_line(result) -> str:
    assert result.exit_code == 1, result.output
    assert result.exception is None or isinstance(result.exception, SystemExit), repr(result.exception)
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("Error: "), result.output
    return lines[0]


def test_run_on_a_taken_port_is_one_line_and_no_banner(tmp_path):
    holder = socket.socket()
    holder.bind(("127.0.0.1", 0))
    holder.listen(1)
    port = holder.getsockname()[1]
    config = tmp_path / "agent.yaml"
    config.write_text(f"server: {{host: 127.0.0.1, port: {port}}}\n"
                      "targets: {static: [{url: 'http://127.0.0.1:1/metrics', role: vllm, pod: p}]}\n")
    try:
        started = time.monotonic()
        proc = subprocess.run([sys.executable, "-m", "agent.cli", "run", "-c", str(config)], check=False, cwd=REPO_ROOT,
                              capture_output=True, text=True, timeout=60, env={**os.environ, "PYTHONWARNINGS": ""})
    finally:
        holder.close()
    assert proc.returncode == 1, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert lines == [(f"Error: cannot listen on 127.0.0.1:{port}: the address is already in use (another agent "
                      f"or program holds it); choose another with server.port or --port")], proc.stderr
    assert "tierpilot agent:" not in proc.stderr and "Unclosed" not in proc.stderr
    assert time.monotonic() - started < 30


def test_check_config_validates_and_starts_nothing(tmp_path):
    good = tmp_path / "good.yaml"
    good.write_text("server: {port: 9999}\nscrape: {interval_s: 5}\n"
                    "targets: {static: [{url: 'http://127.0.0.1:1/metrics', role: vllm, pod: p}]}\n")
    result = CliRunner().invoke(main, ["run", "--config", str(good), "--check-config"])
    assert result.exit_code == 0, result.output
    assert result.output.strip() == f"{good}: valid (/metrics on 0.0.0.0:9999, scraping every 5s)"
    bad = tmp_path / "bad.yaml"
    bad.write_text("scrape: {interval_s: fast}\n")
    line = _one_line(CliRunner().invoke(main, ["run", "--config", str(bad), "--check-config"]))
    assert str(bad) in line and "scrape.interval_s" in line
    line = _one_line(CliRunner().invoke(main, ["run", "--config", str(tmp_path / "none.yaml"), "--check-config"]))
    assert "none.yaml: cannot read" in line


@pytest.mark.parametrize("args, expected", [
    (["replay", "--pods", "1", "--duration", "20", "--plot", "nodir/x.png"],
     "Error: --plot nodir/x.png: directory nodir does not exist; create it or give another path"),
    (["tune", "--workload", "shift", "--trials", "50", "--out", "nodir/best.yaml"],
     "Error: --out nodir/best.yaml: directory nodir does not exist; create it or give another path"),
    (["tune", "--workload", "shift", "--trials", "50", "--plot-dir", "afile/plots"],
     "Error: --plot-dir afile/plots: afile is not a directory"),
    (["demo", "--duration", "20", "--report-dir", "afile/report"],
     "Error: --report-dir afile/report: afile is not a directory"),
    (["dashboards", "render", "--out", "afile/png", "--prometheus", "http://127.0.0.1:1"],
     "Error: --out afile/png: afile is not a directory"),
    (["dashboards", "build", "--root", "afile/repo"], "Error: --root afile/repo: afile is not a directory"),
])
def test_output_paths_are_checked_before_the_work(tmp_path, monkeypatch, args, expected):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "afile").write_text("")
    started = time.monotonic()
    assert _one_line(CliRunner().invoke(main, args)) == expected
    assert time.monotonic() - started < 10  # no search, replay or demo ran first
    assert sorted(p.name for p in tmp_path.iterdir()) == ["afile"]  # nothing written
