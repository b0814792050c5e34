"""The agent's /metrics as a Prometheus user expects it: `promtool check metrics` finds no problem
on a running agent against the emulated cluster (with the tuner, actuation and KV-event
collectors registered) nor on `scrape-once --format prometheus`; no exported `job`/`instance`
label; process_* and tierpilot_build_info; `collector` values that are names; `target` only for
scrape targets; one source per L2 latency series; `/` lists the endpoints; `/window` is loopback
only (or token-guarded)."""
from __future__ import annotations

import asyncio
import random
import shutil
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace

import pytest
from click.testing import CliRunner
from prometheus_client.parser import text_string_to_metric_families

from agent.cli import main
from agent.collect.discovery import StaticTargets
from agent.k8s.metrics import ActuationCollector, ActuationMetrics
from agent.kvevents.collector import KvEventsCollector
from agent.kvevents.signals import KvSignals
from agent.runtime.app import Agent
from agent.settings import load_settings
from contracts.knobs import Knobs
from contracts.tier_model import Target
from emulator.cluster.fleet import ClusterSpec, EmulatedCluster
from emulator.cluster.pod_metrics import RequestOutcome
from tests.support.fake_targets import MetricsServer
from tuners.metrics import TunerMetrics

FIXTURES = Path(__file__).parent / "fixtures"
PROMTOOL = shutil.which("promtool") or "/usr/bin/promtool"


def promtool_problems(text: str) -> list[str]:
    """`promtool check metrics` on an exposition: one line per problem (empty when clean)."""
    proc = subprocess.run([PROMTOOL, "check", "metrics"], input=text, capture_output=True, text=True,
                          timeout=60, check=False)
    problems = [line for line in (proc.stdout + proc.stderr).splitlines() if line.strip()]
    assert (proc.returncode == 0) == (not problems), (proc.returncode, problems)
    return problems


def _traffic(cluster: EmulatedCluster, rng: random.Random) -> None:
    for pod in cluster.pods.values():
        for _ in range(20):
            prompt = rng.randint(2048, 8192)
            gpu = rng.randint(0, prompt // 4)
            cpu = rng.randint(0, (prompt - gpu) // 4)
            l2 = rng.randint(256, (prompt - gpu - cpu) // 2)
            read_s = rng.uniform(0.02, 0.08)
            pod.metrics.record(RequestOutcome(prompt, gpu, cpu, l2, 16, ttft_s=rng.uniform(0.05, 1.5),
                                              l2_read_s=read_s, stored_tokens=256, chunk_tokens=256))
            chunks = -(-l2 // 256)  # the node's FUSE mount times each chunk read
            pod.record_io("read", l2 * 131072, [read_s * 1e6 / chunks] * chunks)


class Clock:
    now = 1_800_000_000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture(scope="module")
def live() -> Iterator[tuple[Agent, str, dict[str, str]]]:
    """A running agent over 2 emulated pods: vllm-0 with its Curvine FUSE target, vllm-1 without
    one (its L2 reads are timed by LMCache), plus the Curvine master."""
    clock, rng = Clock(), random.Random(5)
    with EmulatedCluster(ClusterSpec(pods=2, restart_downtime_s=0.0)) as cluster:
        pods = sorted(cluster.pods)
        targets = [Target(t["url"], t["role"], t["pod"]) for t in cluster.targets()  # type: ignore[arg-type]
                   if not (t["role"] == "curvine-fuse" and t["pod"] == pods[1])]
        tuner = TunerMetrics(target="llm/vllm")
        tuner.set_config(Knobs())
        tuner.actuation("applied")
        actuation = ActuationMetrics()
        actuation.reapplied("deployment-env/llm/vllm")
        collectors = (tuner, ActuationCollector(actuation), KvEventsCollector(KvSignals(clock=clock).snapshot))
        settings = load_settings(server={"host": "127.0.0.1", "port": 0}, scrape={"interval_s": 3600.0})
        with Agent(settings, StaticTargets(targets), collectors=collectors, clock=clock) as agent:
            deadline = time.monotonic() + 20
            while agent.cycles < 1 and time.monotonic() < deadline:
                time.sleep(0.02)
            for _ in range(3):
                _traffic(cluster, rng)
                clock.now += 15.0
                agent.scrape_now()
            with urllib.request.urlopen(agent.url, timeout=10) as resp:
                body = resp.read().decode()
            yield agent, body, {pods[0]: "fuse", pods[1]: "no fuse"}


def test_promtool_finds_no_problem_on_a_running_agents_metrics(live):
    _, body, _ = live
    assert "tierpilot_l2_io_latency_quantile_seconds{" in body and "tierpilot_ttft_quantile_seconds{" in body
    assert "tierpilot_fleet_excluded_pods{" in body
    assert promtool_problems(body) == []


def test_promtool_finds_no_problem_on_scrape_once_output():
    with MetricsServer() as srv:
        url = srv.route("/metrics", text=(FIXTURES / "vllm_0_33_dp2.prom").read_text())
        result = CliRunner().invoke(main, ["scrape-once", "--target", f"vllm/vllm-0={url}", "--format", "prometheus"])
    assert result.exit_code == 0, result.output
    assert "tierpilot_ttft_quantile_seconds{" in result.stdout
    assert promtool_problems(result.stdout) == []


def _families(body: str) -> dict:
    return {f.name: f for f in text_string_to_metric_families(body)}


def test_no_exported_label_is_named_job_or_instance(live):
    _, body, _ = live
    clash = {(s.name, k) for f in _families(body).values() for s in f.samples for k in s.labels
             if k in ("job", "instance")}
    assert not clash
    runs = [s for s in _families(body)["tierpilot_job_runs"].samples if s.name == "tierpilot_job_runs_total"]
    assert {s.labels["task"] for s in runs} >= {"scrape"}


def test_process_metrics_and_build_info_are_served(live):
    _, body, _ = live
    fams = _families(body)
    for name in ("process_cpu_seconds", "process_resident_memory_bytes", "process_open_fds",
                 "process_start_time_seconds"):
        assert name in fams, name
    (info,) = fams["tierpilot_build_info"].samples
    assert info.value == 1.0 and info.labels["version"] and info.labels["python_version"]


def test_collector_label_values_are_names_not_class_names(live):
    _, body, _ = live
    names = {s.labels["collector"] for s in _families(body)["tierpilot_collector_up"].samples}
    assert names == {"tuner", "actuation", "kv_events"}


def test_target_means_a_scrape_target_and_workload_the_tuned_object(live):
    _, body, _ = live
    fams = _families(body)
    for name in ("tierpilot_actuations", "tierpilot_tuner_trials", "tierpilot_config_info", "tierpilot_reapplied",
                 "tierpilot_dry_run"):
        for s in fams[name].samples:
            assert "target" not in s.labels and s.labels["workload"], (name, s.labels)
    for s in fams["tierpilot_target_up"].samples:
        assert s.labels["target"].startswith("http://"), s.labels


def test_each_l2_latency_series_has_one_named_source(live):
    _, body, pods = live
    fams = _families(body)
    fuse_pod = next(p for p, what in pods.items() if what == "fuse")
    bare_pod = next(p for p, what in pods.items() if what == "no fuse")
    for name in ("tierpilot_l2_io_latency_seconds", "tierpilot_l2_io_latency_quantile_seconds"):
        sources = {(s.labels["pod"], s.labels["op"]): s.labels["source"] for s in fams[name].samples}
        assert sources[(fuse_pod, "read")] == "curvine_fuse", name
        assert sources[(bare_pod, "read")].startswith("lmcache"), name
    fleet = {s.labels["source"] for s in fams["tierpilot_fleet_l2_io_latency_seconds"].samples
             if s.labels["op"] == "read"}
    assert "curvine_fuse" in fleet and any(s.startswith("lmcache") for s in fleet)


def test_root_serves_an_index_of_the_endpoints(live):
    agent, _, _ = live
    with urllib.request.urlopen(agent.url.removesuffix("/metrics") + "/", timeout=10) as resp:
        page = resp.read().decode()
        assert resp.headers["Content-Type"].startswith("text/html")
    for path in ("/metrics", "/healthz", "/readyz", "/window"):
        assert f'href="{path}"' in page, path
    assert "loopback clients only" in page  # /window, unsharded and without a token


def _ask(agent: Agent, path: str, remote: str, headers: dict[str, str] | None = None) -> int:
    serve = agent._route(path, agent.routes[path])
    request = SimpleNamespace(remote=remote, headers=headers or {}, query={"window_s": "60"})
    return asyncio.run(serve(request)).status


def test_window_answers_loopback_clients_only_without_a_token(live):
    agent, _, _ = live
    with urllib.request.urlopen(agent.url.removesuffix("/metrics") + "/window?window_s=60", timeout=10) as resp:
        assert resp.status == 200
    assert _ask(agent, "/window", "127.0.0.1") == 200
    assert _ask(agent, "/window", "10.1.2.3") == 403
    assert _ask(agent, "/window", "::1") == 200


def test_window_needs_the_token_from_any_client_when_a_token_is_set(tmp_path):
    token = tmp_path / "token"
    token.write_text("s3cret-token\n")
    agent = Agent(load_settings(server={"host": "127.0.0.1", "port": 0}, shard={"token_file": str(token)}),
                  StaticTargets([]))
    assert _ask(agent, "/window", "127.0.0.1") == 401
    assert _ask(agent, "/window", "10.1.2.3", {"Authorization": "Bearer s3cret-token"}) == 200
    assert [e.access for e in agent.endpoints() if e.path == "/window"] == ["bearer token (shard.token_file)"]


def test_window_is_open_to_peers_when_sharded_without_a_token():
    settings = load_settings(server={"host": "127.0.0.1", "port": 0},
                             shard={"count": 2, "index": 0, "allow_unauthenticated": True})
    agent = Agent(settings, StaticTargets([]))
    assert _ask(agent, "/window", "10.1.2.3") == 200
