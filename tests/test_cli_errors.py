"""One-line errors, never a traceback: a missing or bad kubeconfig, an unreachable API server, and
bad input, through `tierpilot k8s ...`, `python -m agent.k8s ...` and `tierpilot run`."""
from __future__ import annotations

import subprocess
import sys

import pytest
from click.testing import CliRunner

from agent.cli import main
from tests.conftest import REPO_ROOT
from tests.support.prometheus import free_port

TARGETS = str(REPO_ROOT / "deploy" / "overlays" / "plain-vllm" / "targets.yaml")


@pytest.fixture
def no_cluster(tmp_path, monkeypatch):
    """No in-cluster credentials and no default kubeconfig."""
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.delenv("KUBECONFIG", raising=False)
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    return tmp_path


def _one_line_error(result) -> str:
    assert result.exit_code == 1, result.output
    assert result.exception is None or isinstance(result.exception, SystemExit), result.exception
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("Error: "), result.output
    assert "Traceback" not in result.output
    return lines[0]


def _unreachable_kubeconfig(path) -> str:
    port = free_port()  # nothing listens there
    path.write_text(f"""apiVersion: v1
kind: Config
clusters: [{{name: c, cluster: {{server: "https://127.0.0.1:{port}", insecure-skip-tls-verify: true}}}}]
users: [{{name: u, user: {{token: t}}}}]
contexts: [{{name: x, context: {{cluster: c, user: u}}}}]
current-context: x
""")
    return str(path)


@pytest.mark.parametrize("command", [["current", TARGETS], ["rollback", TARGETS]])
def test_k8s_without_any_kubeconfig(no_cluster, command):
    line = _one_line_error(CliRunner().invoke(main, ["k8s", *command]))
    assert "no Kubernetes credentials" in line and "~/.kube/config" in line and "--kubeconfig" in line


def test_k8s_with_a_bad_kubeconfig(no_cluster):
    bad = no_cluster / "bad.yaml"
    bad.write_text("clusters: [\n")
    line = _one_line_error(CliRunner().invoke(main, ["k8s", "--kubeconfig", str(bad), "current", TARGETS]))
    assert line.startswith(f"Error: kubeconfig {bad}:")
    empty = no_cluster / "empty.yaml"
    empty.write_text("apiVersion: v1\nkind: Config\n")
    line = _one_line_error(CliRunner().invoke(main, ["k8s", "--kubeconfig", str(empty), "current", TARGETS]))
    assert line.startswith(f"Error: kubeconfig {empty}:")


def test_k8s_with_an_unreachable_api_server(no_cluster):
    kubeconfig = _unreachable_kubeconfig(no_cluster / "kc.yaml")
    line = _one_line_error(CliRunner().invoke(main, ["k8s", "--kubeconfig", kubeconfig, "current", TARGETS]))
    assert "API server unreachable" in line and "llm/vllm-llama" in line


def test_k8s_bad_knobs_and_bad_targets_are_one_line(no_cluster):
    kubeconfig = _unreachable_kubeconfig(no_cluster / "kc.yaml")
    knobs = no_cluster / "k.yaml"
    knobs.write_text("foo: 1\n")
    line = _one_line_error(CliRunner().invoke(main, ["k8s", "--kubeconfig", kubeconfig, "apply", TARGETS, str(knobs)]))
    assert "unknown key(s) foo" in line
    targets = no_cluster / "t.yaml"
    targets.write_text("targets: 3\n")
    line = _one_line_error(CliRunner().invoke(main, ["k8s", "check", str(targets)]))
    assert "namespace" in line


def test_run_without_kubeconfig_when_the_tuner_needs_one(no_cluster):
    cfg = no_cluster / "agent.yaml"
    cfg.write_text(f"tuner: {{enabled: true}}\nactuation: {{targets_file: {TARGETS}}}\n")
    line = _one_line_error(CliRunner().invoke(main, ["run", "-c", str(cfg)]))
    assert "no Kubernetes credentials" in line


def test_python_m_agent_k8s_prints_one_line(no_cluster):
    bad = no_cluster / "bad.yaml"
    bad.write_text("clusters: [\n")
    env = {"HOME": str(no_cluster), "PATH": "/usr/bin:/bin", "PYTHONPATH": str(REPO_ROOT)}
    proc = subprocess.run([sys.executable, "-m", "agent.k8s", "--kubeconfig", str(bad), "current", TARGETS],
                          capture_output=True, text=True, env=env, timeout=120, check=False)
    assert proc.returncode == 1
    assert proc.stderr.strip().count("\n") == 0 and proc.stderr.startswith("Error: kubeconfig"), proc.stderr


def test_dashboards_build_reports_a_bad_value_in_one_line():
    result = CliRunner().invoke(main, ["dashboards", "build", "--check", "--ttft-slo", "-1"])
    assert result.exit_code == 2
    assert result.output.strip().splitlines()[-1] == "Error: ttft_seconds: Input should be greater than 0"
    assert "pydantic.dev" not in result.output and "validation error" not in result.output
