"""The tuner survives its study storage going away (a real PostgreSQL behind a TCP forwarder that
cuts the network) and SIGTERM mid-trial: the trial fails, the candidate is rolled back, the
guardrails' in-flight slot is freed, the outage is counted and shown in /healthz, and when the
storage answers again tuning resumes (the orphaned trial marked failed, the last good
configuration in place). Guardrail timers ignore wall-clock jumps."""
from __future__ import annotations

import uuid

import optuna
import pytest

from agent.collect.discovery import StaticTargets
from agent.runtime.assembly import build_runtime
from agent.settings import load_settings
from contracts.tier_model import Target
from tests.support.kube import NS, FakeTime, deployment
from tests.support.postgres import postgres_url  # noqa: F401  (fixture)
from tests.support.tcp_proxy import TcpProxy
from tests.support.tuner_settings import guardrail_settings
from tests.test_runtime_tuning import kube, run_to_trial, targets_file, traffic, value, vllm  # noqa: F401
from tuners.guardrails import Guardrails
from tuners.metrics import TunerMetrics
from tuners.planning.plan_runner import InlineExecutor
from tuners.space import DeploymentLimits, SearchSpace

pytestmark = pytest.mark.timeout(120)


def runtime(kube, vllm, tmp_path, fake: FakeTime, storage: str, study: str):  # noqa: F811
    _pod, srv = vllm
    tuner = {"enabled": True, "apply": "all", "storage": storage, "study": study, "sampler": "random", "seed": 7,
             "step_interval_s": 60, "limits": {"pods": 2, "node_memory_headroom_gib": 16},
             "guardrails": {"cooldown_s": 0, "max_changes_per_hour": 10},
             "live": {"settle_s": 0, "window_s": 10, "min_requests": 5},
             "warm_start": {"trials": 0}, "drift": {"enabled": False},
             "planner": {"enabled": False}}  # trials from the live search (the planner: test_runtime_tuning.py)
    settings = load_settings(env={}, server={"host": "127.0.0.1", "port": 0},
                             scrape={"interval_s": 60, "timeout_s": 5}, tuner=tuner,
                             actuation={"targets_file": str(targets_file(tmp_path)), "identity": "agent-a"})
    return build_runtime(settings, plan_executor=InlineExecutor(), api_client=kube.api_client(), clock=fake.clock, monotonic=fake.clock,
                         sleep=fake.sleep, now=fake.now, env={},
                         targets=StaticTargets([Target(srv.url("/metrics"), "vllm", "vllm-0")]))


def test_storage_outage_fails_the_trial_rolls_back_and_resumes(kube, vllm, tmp_path, postgres_url):  # noqa: F811
    kube.put(deployment("vllm-llama", env=[{"name": "LMCACHE_CHUNK_SIZE", "value": "256"}]))
    pg_port = int(postgres_url.rsplit(":", 1)[1].split("/")[0])
    study = f"outage-{uuid.uuid4().hex[:8]}"
    with TcpProxy("127.0.0.1", pg_port) as proxy:
        storage = postgres_url.replace(f":{pg_port}/", f":{proxy.port}/")
        fake = FakeTime()
        rt = runtime(kube, vllm, tmp_path, fake, storage, study)
        assert rt.elector.try_acquire_or_renew() is True
        assert run_to_trial(rt, vllm, fake) == ["baseline", "baseline_done", "trial_started"]
        baseline = rt.tuning.controller.baseline.knobs
        candidate = rt.tuning.controller.candidate
        assert rt.actuator.current() == candidate.knobs != baseline

        proxy.cut()  # the database goes away while the trial's result is being recorded
        traffic(rt, vllm, fake, 12.5)
        report = rt.tuning.step()
        assert report.state == "storage_unavailable" and report.trial == candidate.number
        assert "\n" not in report.message and report.message.startswith("OperationalError: server closed"), report
        assert rt.tuning.guardrails.in_flight is None
        assert rt.actuator.current() == baseline  # rolled back without the storage
        assert value(rt, "tierpilot_tuner_step_errors_total", workload=NS, kind="storage") == 1.0
        assert value(rt, "tierpilot_tuner_trial_in_flight", workload=NS) == 0.0
        assert rt.agent.checks()["tuner"].startswith("study storage unavailable: OperationalError")

        traffic(rt, vllm, fake, 10)  # still down: counted again, never wedged on `blocked in_flight`
        report = rt.tuning.step()
        assert report.state == "storage_unavailable"
        assert value(rt, "tierpilot_tuner_step_errors_total", workload=NS, kind="storage") == 2.0

        proxy.restore()
        traffic(rt, vllm, fake, 10)
        report = rt.tuning.step()
        assert report.state not in ("storage_unavailable", "error", "blocked"), report
        assert rt.agent.checks()["tuner"] == "ok"
        assert rt.actuator.current() == baseline
        trials = optuna.load_study(study_name=f"{study}.phase000", storage=storage).trials
        assert [t.state for t in trials if t.number == candidate.number] == [optuna.trial.TrialState.FAIL]

        states = []  # tuning goes on: a new baseline, then the next trial
        for _ in range(4):
            traffic(rt, vllm, fake, 12.5)
            states.append(rt.tuning.step().state)
        assert "trial_started" in states, states


def test_shutdown_mid_trial_rolls_the_candidate_back(kube, vllm, tmp_path):  # noqa: F811
    kube.put(deployment("vllm-llama", env=[{"name": "LMCACHE_CHUNK_SIZE", "value": "256"}]))
    fake = FakeTime()
    rt = runtime(kube, vllm, tmp_path, fake, f"sqlite:///{tmp_path}/s.db", "sigterm")
    rt.elector.try_acquire_or_renew()
    assert run_to_trial(rt, vllm, fake)[-1] == "trial_started"
    baseline = rt.tuning.controller.baseline.knobs
    assert rt.actuator.current() != baseline
    rt.tuning.shutdown(timeout_s=5)  # what Runtime.stop runs on SIGTERM, after the scheduler stopped
    assert rt.actuator.current() == baseline
    assert rt.tuning.guardrails.in_flight is None and rt.tuning.state == "stopped"


class _NoActuator:
    pass


def test_guardrail_timers_ignore_wall_clock_jumps():
    wall, mono = [1_000_000.0], [50.0]
    space = SearchSpace.from_limits(DeploymentLimits())
    g = Guardrails(_NoActuator(), space, TunerMetrics(), guardrail_settings(apply="all", cooldown_s=900, max_changes_per_hour=4),
                   clock=lambda: wall[0], monotonic=lambda: mono[0])
    g._record_change(wall[0])
    wall[0] -= 86_400  # the wall clock goes back a day
    mono[0] += 901
    assert g.blocked() is None  # the cooldown is over after 901 real seconds, not in 24 h 15 min
    g._record_change(wall[0])
    wall[0] += 7200  # the wall clock jumps 2 h ahead: the cooldown is not skipped
    mono[0] += 10
    assert g.blocked() == "cooldown"
    assert g.next_allowed(wall[0]) == pytest.approx(wall[0] + 890)


def test_runtime_stop_rolls_an_in_flight_trial_back(kube, vllm, tmp_path):  # noqa: F811
    """The SIGTERM path: run_forever -> Runtime.stop stops the scheduler, then the tuning loop
    rolls the trial back while the actuator and the Lease are still there."""
    kube.put(deployment("vllm-llama", env=[{"name": "LMCACHE_CHUNK_SIZE", "value": "256"}]))
    fake = FakeTime()
    rt = runtime(kube, vllm, tmp_path, fake, f"sqlite:///{tmp_path}/s.db", "stop")
    rt.elector.try_acquire_or_renew()
    assert run_to_trial(rt, vllm, fake)[-1] == "trial_started"
    baseline = rt.tuning.controller.baseline.knobs
    assert rt.actuator.current() != baseline
    rt.start()
    rt.stop()
    assert rt.actuator.current() == baseline
    assert rt.tuning.guardrails.in_flight is None
