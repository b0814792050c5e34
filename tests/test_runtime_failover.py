"""Shared tuner state in HA: two whole runtimes share one study on a real PostgreSQL
(tests/support/postgres.py) and a Lease on the Kubernetes emulator. The leader measures a baseline
and starts a trial, then dies; the standby takes the Lease and continues the same study: the same
phase, the leader's finished trials, its last good configuration, and the trial that was in flight
measured again (no trial lost)."""
from __future__ import annotations

import optuna
import pytest

from agent.collect.discovery import StaticTargets
from agent.runtime.assembly import build_runtime
from agent.settings import load_settings
from contracts.tier_model import Target
from tests.support.kube import NS, FakeTime, deployment
from tests.support.postgres import postgres_url  # noqa: F401  (fixture)
from tests.test_runtime_tuning import kube, targets_file, traffic, vllm  # noqa: F401  (fixtures)
from tuners.planning.plan_runner import InlineExecutor

pytestmark = pytest.mark.timeout(120)


def runtime(kube, vllm, tmp_path, fake, storage: str, identity: str):  # noqa: F811
    _pod, srv = vllm
    settings = load_settings(env={}, server={"host": "127.0.0.1", "port": 0}, scrape={"interval_s": 60, "timeout_s": 5}, tuner={"enabled": True, "apply": "all", "storage": storage, "study": "ha", "sampler": "random", "seed": 7,
                  "step_interval_s": 60, "limits": {"pods": 2, "node_memory_headroom_gib": 16},
                  "guardrails": {"cooldown_s": 0, "max_changes_per_hour": 10},
                  "live": {"settle_s": 0, "window_s": 10, "min_requests": 5},
                  "warm_start": {"trials": 0}, "drift": {"enabled": False},
                  "planner": {"enabled": False}},  # the live search (the planner: test_runtime_tuning.py)
        actuation={"targets_file": str(targets_file(tmp_path)), "identity": identity}, export={"fleet": "leader"})
    return build_runtime(settings, plan_executor=InlineExecutor(), api_client=kube.api_client(), clock=fake.clock, monotonic=fake.clock,
                         sleep=fake.sleep, now=fake.now, env={},
                         targets=StaticTargets([Target(srv.url("/metrics"), "vllm", "vllm-0", namespace=NS)]))


def test_the_new_leader_continues_the_same_study_on_postgresql(kube, vllm, tmp_path, postgres_url):  # noqa: F811
    kube.put(deployment("vllm-llama", env=[{"name": "LMCACHE_CHUNK_SIZE", "value": "256"}]))
    fake = FakeTime()
    a = runtime(kube, vllm, tmp_path, fake, postgres_url, "agent-a")
    b = runtime(kube, vllm, tmp_path, fake, postgres_url, "agent-b")
    both = (a.elector, b.elector)
    assert a.elector.try_acquire_or_renew() and not b.elector.try_acquire_or_renew()

    def scrape_both(seconds: float, electors=both) -> None:
        traffic(a if a.elector in electors else b, vllm, fake, seconds, electors=electors)
        if a.elector in electors and b.elector in electors:
            b.agent.scrape_now()  # the standby scrapes too: its window stays warm

    scrape_both(2.5)
    assert a.tuning.step().state == "baseline" and b.tuning.step() is None
    scrape_both(12.5)
    assert a.tuning.step().state == "baseline_done"
    started = a.tuning.step()
    assert started.state == "trial_started"
    in_flight = a.tuning.controller.candidate
    phase = a.tuning.controller.phase
    baseline = a.tuning.controller.baseline.knobs
    assert a.agent.exporting_fleet() and not b.agent.exporting_fleet()
    before = {t.number: t for t in a.tuning.controller.tuner.trials()}
    assert before[in_flight.number].state == "running"
    assert [t.state for t in before.values()].count("complete") == 1  # the baseline

    # agent a dies with the trial in flight; b takes the Lease after it expires
    traffic(b, vllm, fake, 17.5, electors=(b.elector,))
    assert b.elector.is_leader() and b.agent.exporting_fleet()
    report = b.tuning.step()  # a new term: resume from PostgreSQL
    ctl = b.tuning.controller
    assert b.tuning.terms == 1 and ctl.phase == phase
    assert ctl.tuner.study_name == a.tuning.controller.tuner.study_name
    after = {t.number: t for t in ctl.tuner.trials()}
    assert after[in_flight.number].state == "failed"
    assert after[in_flight.number].attrs["failure"] == "in flight when agent-a lost the Lease"
    assert {n: t.state for n, t in before.items() if t.state == "complete"}.items() <= \
        {n: t.state for n, t in after.items()}.items()  # a's finished trials are b's
    assert b.last_good_store.load_last_good() == baseline
    # b measures a baseline of its own first (what runs now), then the adopted candidate
    states = [report.state]
    for _ in range(6):
        traffic(b, vllm, fake, 12.5, electors=(b.elector,))
        states.append(b.tuning.step().state)
        if states[-1] == "trial_started":
            break
    assert states[-1] == "trial_started", states
    assert ctl.candidate.knobs == in_flight.knobs and ctl.candidate.number > in_flight.number
    assert ctl.candidate.source == "adopted"
    study = optuna.load_study(study_name=ctl.tuner.study_name, storage=postgres_url)
    owners = {t.number: (t.user_attrs.get("candidate") or {}).get("owner") for t in study.get_trials()}
    assert owners[in_flight.number] == "agent-a" and owners[ctl.candidate.number] == "agent-b"
