"""Command-line habits of kubectl and Prometheus users: cluster flags before or after the k8s
subcommand, -n/--namespace and --context, `k8s diff` (what apply would change, changing nothing),
one output flag (`--format`, with `--json` an alias), choices listed in --help, examples that
keep their line continuations, and one `[default: X]` style."""
from __future__ import annotations

import http.server
import json
import re
import threading

import pytest
from click.testing import CliRunner

from agent.cli import SUBCOMMANDS, main
from tests.support.fake_targets import MetricsServer
from tests.support.kube import NS, deployment, serve
from tests.support.prometheus import free_port


@pytest.fixture(scope="module")
def kube(shared_dir):
    yield from serve(shared_dir)


@pytest.fixture
def cluster(kube, tmp_path):
    """A Deployment `vllm-llama` in namespace `other` (the targets file says `llm`), and a
    kubeconfig whose current-context points at nothing: only --context good reaches the API."""
    obj = deployment("vllm-llama", env=[{"name": "LMCACHE_CHUNK_SIZE", "value": "256"},
                                        {"name": "LMCACHE_MAX_LOCAL_CPU_SIZE", "value": "5"}])
    obj["metadata"]["namespace"] = "other"
    kube.put(obj)
    targets = tmp_path / "targets.yaml"
    targets.write_text(f"namespace: {NS}\ntargets:\n- {{kind: deployment-env, name: vllm-llama, container: vllm}}\n")
    kc = tmp_path / "kc.yaml"
    kc.write_text(f"""apiVersion: v1
kind: Config
clusters:
- {{name: good, cluster: {{server: "{kube.url}"}}}}
- {{name: dead, cluster: {{server: "http://127.0.0.1:{free_port()}"}}}}
users: [{{name: u, user: {{token: t}}}}]
contexts:
- {{name: good, context: {{cluster: good, user: u}}}}
- {{name: dead, context: {{cluster: dead, user: u}}}}
current-context: dead
""")
    best = tmp_path / "best.yaml"
    best.write_text("chunk_tokens: 512\ncpu_gib: 5.0\n")
    return kube, targets, kc, best


def test_cluster_flags_work_after_the_subcommand(cluster, monkeypatch):
    _kube, targets, kc, _best = cluster
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    after = CliRunner().invoke(main, ["k8s", "current", str(targets), "--kubeconfig", str(kc), "--context", "good",
                                      "-n", "other"])
    assert after.exit_code == 0, after.output
    assert "chunk_tokens: 256" in after.output
    before = CliRunner().invoke(main, ["k8s", "--kubeconfig", str(kc), "--context", "good", "--namespace", "other",
                                       "current", str(targets)])
    assert before.exit_code == 0 and before.output == after.output
    # the current-context (dead) is used without --context; the file's namespace without -n
    dead = CliRunner().invoke(main, ["k8s", "current", str(targets), "--kubeconfig", str(kc), "-n", "other"])
    assert dead.exit_code == 1 and "unreachable" in dead.output
    wrong_ns = CliRunner().invoke(main, ["k8s", "current", str(targets), "--kubeconfig", str(kc), "--context", "good"])
    assert wrong_ns.exit_code == 1 and "llm/vllm-llama" in wrong_ns.output


def test_k8s_diff_shows_what_apply_would_change_and_changes_nothing(cluster):
    kube, targets, kc, best = cluster
    before = kube.get("Deployment", "other", "vllm-llama")
    result = CliRunner().invoke(main, ["k8s", "diff", str(targets), str(best), "--kubeconfig", str(kc),
                                       "--context", "good", "-n", "other"])
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    assert lines[0] == "chunk_tokens: 256 -> 512"
    assert lines[1] == "  Deployment other/vllm-llama container vllm (takes effect by rollout)"
    assert lines[-1].startswith("1 knob(s) would change")
    assert kube.get("Deployment", "other", "vllm-llama") == before
    same = tmp = best.parent / "same.yaml"
    tmp.write_text("chunk_tokens: 256\n")
    result = CliRunner().invoke(main, ["k8s", "diff", str(targets), str(same), "--kubeconfig", str(kc),
                                       "--context", "good", "-n", "other"])
    assert result.exit_code == 0 and result.output.startswith("no change"), result.output


def test_json_is_an_alias_of_format_json():
    args = ["replay", "--pods", "1", "--duration", "30", "--rate", "2"]
    fmt = CliRunner().invoke(main, [*args, "--format", "json"])
    alias = CliRunner().invoke(main, [*args, "--json"])
    assert fmt.exit_code == 0 and alias.exit_code == 0, fmt.output + alias.output
    a, b = json.loads(fmt.output), json.loads(alias.output)
    a.pop("elapsed_s"), b.pop("elapsed_s")
    assert a == b
    for command in (["replay"], ["kv-events"]):
        text = CliRunner().invoke(main, [*command, "--help"], env={"COLUMNS": "200"}).output
        assert "--format [table|json]" in text
        assert re.search(r"--json\s+Same as --format json", text), text


def test_help_lists_choices_keeps_continuations_and_one_default_style():
    tune = CliRunner().invoke(main, ["tune", "--help"], env={"COLUMNS": "200"}).output
    assert "--workload [rag|sessions|shift|short]" in tune
    for line in tune.splitlines():  # an example line ending in a continuation shows its backslash
        if line.strip().startswith("tierpilot") and "--targets" in line and "--out" not in line:
            assert line.rstrip().endswith("\\"), line
    assert "--out best.yaml && tierpilot k8s check" in tune
    old_style = re.compile(r"\[default [^:]|\(default[: ]")
    for name in SUBCOMMANDS:
        for sub in ([], ["build"], ["render"]) if name == "dashboards" else ([],):
            text = CliRunner().invoke(main, [name, *sub, "--help"], env={"COLUMNS": "200"}).output
            assert not old_style.search(text), f"{name} {sub}: {old_style.search(text).group(0)!r}"
    for sub in ("current", "diff", "apply", "rollback"):
        text = CliRunner().invoke(main, ["k8s", sub, "--help"], env={"COLUMNS": "200"}).output
        assert "--kubeconfig" in text and "-n, --namespace" in text and "--context" in text


def test_scrape_once_exits_1_when_its_only_target_feeds_nothing():
    with MetricsServer() as srv:
        url = srv.route("/metrics", text="# HELP foo x\n# TYPE foo counter\nfoo_total 3\n")
        result = CliRunner().invoke(main, ["scrape-once", "-t", url, "--format", "json"])
    assert result.exit_code == 1, result.output
    assert "no_mapped_series" in result.output and "no target fed a tierpilot signal" in result.output


class _JsonNotPrometheus(http.server.BaseHTTPRequestHandler):
    def do_POST(self) -> None:
        body = b'{"hello": "world"}'
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    do_GET = do_POST

    def log_message(self, *args: object) -> None:
        pass


def test_from_prometheus_at_a_wrong_url_says_what_to_fix():
    with MetricsServer() as srv:  # a pod's /metrics server: no query API
        srv.route("/metrics", text="vllm:num_requests_running 1\n")
        base = srv.url("")
        plain = CliRunner().invoke(main, ["scrape-once", "--from-prometheus", base, "--timeout", "2"])
    assert plain.exit_code == 1
    assert f"error: {base}: Prometheus query failed: HTTP 404 on /api/v1/query; is this a Prometheus-compatible query API? Give the URL " \
           "prefix before /api/v1" in plain.output, plain.output
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _JsonNotPrometheus)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    try:
        url = f"http://127.0.0.1:{httpd.server_address[1]}"
        other = CliRunner().invoke(main, ["scrape-once", "--from-prometheus", url, "--timeout", "2"])
    finally:
        httpd.shutdown()
        httpd.server_close()
    assert other.exit_code == 1
    assert f"error: {url}: Prometheus query failed: not a Prometheus API answer (HTTP 200); is this a Prometheus-compatible" in other.output


def test_a_404_on_the_query_api_names_the_prefix():
    from agent.collect.prom.api import _decode

    failure = _decode(404, b"404 page not found\n", "up", 0.01)
    assert failure.reason == "http_4xx"
    assert "HTTP 404 on /api/v1/query" in failure.detail and "prefix before /api/v1" in failure.detail
