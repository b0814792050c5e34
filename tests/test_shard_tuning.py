"""A sharded leader tunes on the fleet, never on a part of it: the whole runtime (Kubernetes
emulator, real HTTP vLLM endpoints, a real peer replica on 127.0.0.1 with the shared token) on a
fake clock. The live evaluator measures both shards' pods over the trial's exact span (the peer's
`/window?since=&until=`), and when the peer cannot be read (here: it refuses the token after a
rotation) the cycle is skipped, counted and shown in /healthz, the trial in flight untouched; once
the peer answers again the same trial goes on."""
from __future__ import annotations

import os
from pathlib import Path

import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from agent.collect.discovery import StaticTargets
from agent.collect.fleetstore import FleetStore
from agent.collect.shard import shard_of
from agent.runtime.app import Agent
from agent.runtime.assembly import build_runtime
from agent.settings import load_settings
from contracts.tier_model import Target
from tests.support.fake_targets import MetricsServer
from tests.support.kube import NS, FakeTime, deployment, serve
from tests.support.runtime_fakes import FakeVllm
from tuners.planning.plan_runner import InlineExecutor

pytestmark = pytest.mark.timeout(90)
PODS = ("vllm-0", "vllm-4")  # one pod per shard of two


@pytest.fixture
def kube(shared_dir):
    yield from serve(shared_dir)


def _write(path: Path, token: str) -> None:
    tmp = path.with_suffix(".new")
    tmp.write_text(token)
    os.replace(tmp, path)


def _step_errors(rt, kind: str) -> float | None:
    for fam in text_string_to_metric_families(rt.agent.metrics_text()):
        for s in fam.samples:
            if s.name == "tierpilot_tuner_step_errors_total" and s.labels.get("kind") == kind:
                return s.value
    return None


def test_sharded_leader_measures_the_fleet_and_skips_a_cycle_when_a_shard_is_not_readable(kube, tmp_path):
    assert [shard_of(p, 2) for p in PODS] == [0, 1]
    kube.put(deployment("vllm-llama", env=[{"name": "LMCACHE_CHUNK_SIZE", "value": "256"}]))
    fake = FakeTime()
    leader_token, peer_token = tmp_path / "leader-token", tmp_path / "peer-token"
    _write(leader_token, "fleet-token")
    _write(peer_token, "fleet-token")
    targets_file = tmp_path / "targets.yaml"
    targets_file.write_text(yaml.safe_dump({"namespace": NS, "targets": [
        {"kind": "deployment-env", "name": "vllm-llama", "container": "vllm"}],
        "fixed_knobs": {"router": "roundrobin"}, "rollout_poll_s": 1, "rollout_timeout_s": 30}))
    pods = {p: FakeVllm() for p in PODS}
    with MetricsServer() as srv:
        for p, pod in pods.items():
            srv.route(f"/{p}", text=pod.text())
        targets = StaticTargets([Target(srv.url(f"/{p}"), "vllm", p) for p in PODS])
        peer = Agent(load_settings(env={}, server={"host": "127.0.0.1", "port": 0}, scrape={"interval_s": 3600},
                                   shard={"count": 2, "index": 1, "token_file": str(peer_token), "token_grace_s": 0}),
                     targets, clock=fake.clock)
        peer.start()
        try:
            base = peer.url.rsplit("/", 1)[0]
            settings = load_settings(
                env={}, server={"host": "127.0.0.1", "port": 0}, scrape={"interval_s": 60, "timeout_s": 5},
                shard={"count": 2, "index": 0, "peers": [base], "token_file": str(leader_token)},
                tuner={"enabled": True, "apply": "all", "storage": f"sqlite:///{tmp_path}/study.db", "sampler": "random",
                       "seed": 7, "step_interval_s": 60, "limits": {"pods": 2, "node_memory_headroom_gib": 16},
                       "guardrails": {"cooldown_s": 0, "max_changes_per_hour": 10},
                       "live": {"settle_s": 0, "window_s": 10, "min_requests": 5},
                       "warm_start": {"trials": 0}, "drift": {"enabled": False}, "planner": {"enabled": False}},
                actuation={"targets_file": str(targets_file), "identity": "agent-0"})
            rt = build_runtime(settings, plan_executor=InlineExecutor(), api_client=kube.api_client(), clock=fake.clock, monotonic=fake.clock,
                               sleep=fake.sleep, now=fake.now, env={}, targets=targets)
            assert isinstance(rt.fleet_store, FleetStore) and rt.fleet_store.strict
            assert rt.elector.try_acquire_or_renew() is True

            def traffic(seconds: float) -> None:
                end = fake.t + seconds
                while fake.t < end:
                    fake.t += 2.5
                    rt.elector.try_acquire_or_renew()
                    for p, pod in pods.items():
                        pod.serve(10)
                        srv.route(f"/{p}", text=pod.text())
                    rt.agent.scrape_now()
                    peer.scrape_now()

            traffic(2.5)
            assert rt.tuning.step().state == "baseline"
            traffic(12.5)
            assert rt.tuning.step().state == "baseline_done"
            # the baseline counted both shards' requests over its window (one shard alone: half)
            measured = rt.tuning.controller.baseline
            own = rt.agent.store.window_between(measured.since, measured.until)
            fleet = rt.fleet_store.window_between(measured.since, measured.until)
            assert set(own["pod"].unique()) == {"vllm-0"} and set(fleet["pod"].unique()) == set(PODS)
            assert measured.evaluation.requests == pytest.approx(2 * 10 * 4, abs=20)
            started = rt.tuning.step()
            assert started.state == "trial_started"
            trial, patches = started.trial, len(kube.requests("PATCH"))

            # the peer's Secret rotates before the leader's: its reads are refused
            _write(peer_token, "rotated-token")
            traffic(12.5)
            skipped = rt.tuning.step()
            assert skipped.state == "partial_fleet" and base in skipped.message and "HTTP 401" in skipped.message
            assert rt.tuning.guardrails.in_flight == trial and rt.tuning.controller.evaluator.pending is not None
            assert len(kube.requests("PATCH")) == patches  # nothing rolled back or applied
            assert _step_errors(rt, "partial_fleet") == 1.0 and _step_errors(rt, "other") == 0.0
            assert "fleet view partial" in rt.agent.checks()["tuner"]
            # the leader's Secret follows: the same trial is read over its own window and finishes
            _write(leader_token, "rotated-token")
            done = rt.tuning.step()
            assert done.state not in ("partial_fleet", "error") and done.trial == trial, done
            assert rt.agent.checks()["tuner"] == "ok"
        finally:
            peer.stop()
