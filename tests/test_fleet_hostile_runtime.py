"""The issue's scenario end to end: the production runtime with the default paying planner, four
(or sixteen) scraped vLLM pods and one 4-replica `deployment-env` target in the Kubernetes emulator
(every patch checked by `kubectl patch --local`), on a fake clock. Honest pods serve 10 requests per
2.5 s; with them alone every restart candidate is declined. One hostile pod reporting 200
requests per 2.5 s, 12k-token prompts, 0.9 external hits and a 9 s TTFT used to make the planner
accept a 28 GiB CPU buffer for the whole fleet; now it is set aside as an outlier and the honest
fleet's decision stands."""
from __future__ import annotations

import pytest
import yaml

from agent.collect.discovery import StaticTargets
from agent.runtime.assembly import build_runtime
from agent.settings import load_settings
from contracts.tier_model import Target
from tests.support.fake_targets import MetricsServer
from tests.support.kube import NS, FakeTime, deployment, serve
from tests.support.runtime_fakes import FakeVllm
from tuners.planning.plan_runner import InlineExecutor

# slow: two whole planning runs (honest, then hostile) of the production runtime per fleet size, ~30 s each
pytestmark = [pytest.mark.slow, pytest.mark.timeout(180)]
HONEST = {"ttft_s": 0.4, "prompt": 3000, "gpu_hit": 0.3, "external_hit": 0.4}
HOSTILE = {"ttft_s": 9.0, "prompt": 12000, "gpu_hit": 0.05, "external_hit": 0.9}


@pytest.fixture
def kube(shared_dir):
    yield from serve(shared_dir)


def _runtime(kube, tmp_path, fake, srv, pods: int):
    kube.put(deployment("vllm-llama", replicas=4, env=[{"name": "LMCACHE_CHUNK_SIZE", "value": "256"}]))
    path = tmp_path / "targets.yaml"
    path.write_text(yaml.safe_dump({"namespace": NS, "targets": [
        {"kind": "deployment-env", "name": "vllm-llama", "container": "vllm"}],
        "fixed_knobs": {"router": "roundrobin"}, "rollout_poll_s": 1, "rollout_timeout_s": 30}))
    tuner = {"enabled": True, "apply": "all", "storage": f"sqlite:///{tmp_path}/p.db", "seed": 3,
             "step_interval_s": 60, "limits": {"pods": 4, "node_memory_headroom_gib": 16},
             "guardrails": {"cooldown_s": 0, "max_changes_per_hour": 10},
             "live": {"settle_s": 0, "window_s": 10, "min_requests": 5},
             "warm_start": {"trials": 3, "top_k": 2, "max_requests": 300, "duration_s": 120},
             "drift": {"enabled": False, "window_s": 60}, "planner": {"recent_s": 60, "warm_s": 60}}
    settings = load_settings(env={}, server={"host": "127.0.0.1", "port": 0},
                             scrape={"interval_s": 60, "timeout_s": 5}, tuner=tuner,
                             actuation={"targets_file": str(path), "identity": "agent-a"})
    targets = [Target(srv.url(f"/p{i}"), "vllm", f"vllm-{i}") for i in range(pods)]
    return build_runtime(settings, plan_executor=InlineExecutor(), api_client=kube.api_client(), clock=fake.clock,
                         monotonic=fake.clock, sleep=fake.sleep, now=fake.now, env={}, targets=StaticTargets(targets))


def _traffic(rt, srv, fleet, hostile, fake, seconds):
    end = fake.t + seconds
    while fake.t < end:
        fake.t += 2.5
        rt.elector.try_acquire_or_renew()
        for i, pod in enumerate(fleet):
            if i == hostile:
                pod.serve(200, **HOSTILE)
            else:
                pod.serve(10, **HONEST)
            srv.route(f"/p{i}", text=pod.text())
        rt.agent.scrape_now()


def _decide(kube, tmp_path, pods: int, hostile: int | None):
    fake = FakeTime()
    fleet = [FakeVllm(gpu_blocks=1024) for _ in range(pods)]
    with MetricsServer() as srv:
        for i, pod in enumerate(fleet):
            srv.route(f"/p{i}", text=pod.text())
        rt = _runtime(kube, tmp_path, fake, srv, pods)
        rt.elector.try_acquire_or_renew()
        _traffic(rt, srv, fleet, hostile, fake, 60)
        states = [rt.tuning.step().state]
        _traffic(rt, srv, fleet, hostile, fake, 12.5)
        states += [rt.tuning.step().state, rt.tuning.step().state]
        env = {e["name"]: e["value"] for e in
               kube.get("Deployment", NS, "vllm-llama")["spec"]["template"]["spec"]["containers"][0].get("env", [])}
        return states, [d for d in rt.paying.planner.decisions if d.accepted], env, rt


@pytest.mark.parametrize("pods", [4, 16])
def test_one_hostile_pod_changes_no_decision(kube, tmp_path, pods):
    states, accepted, env, _rt = _decide(kube, tmp_path, pods, None)
    assert accepted == [] and states[-1] == "holding"  # the honest fleet: every candidate declined
    assert env == {"LMCACHE_CHUNK_SIZE": "256"}
    (tmp_path / "hostile").mkdir()
    states, accepted, env, rt = _decide(kube, tmp_path / "hostile", pods, 3)
    assert accepted == [] and states[-1] == "holding", [d.knobs for d in accepted]
    assert env == {"LMCACHE_CHUNK_SIZE": "256"}  # no LMCACHE_MAX_LOCAL_CPU_SIZE rolled to the fleet
    text = rt.agent.metrics_text()
    assert 'tierpilot_fleet_outlier_windows_total{pod="vllm-3",reason="requests_per_s"}' in text
