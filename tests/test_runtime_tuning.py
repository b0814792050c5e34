"""The whole runtime (agent/runtime/assembly/) against the Kubernetes emulator (kmock, every patch checked
by `kubectl patch --local`) and a real HTTP vLLM endpoint, on a fake clock: the leader measures a
baseline and applies a trial to the Deployment; dry-run proposes and counts but changes nothing;
a standby never actuates; a started runtime runs its jobs and stops cleanly."""
from __future__ import annotations

import json
import logging
import time
from pathlib import Path

import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from agent.collect.discovery import StaticTargets
from agent.runtime.assembly import build_runtime
from agent.settings import load_settings
from contracts.tier_model import Target
from tests.support.fake_targets import MetricsServer
from tests.support.kube import NS, FakeTime, configmap, deployment, serve
from tests.support.runtime_fakes import FakeVllm
from tuners.planning.plan_runner import InlineExecutor

pytestmark = pytest.mark.timeout(240)  # a hang guard: the warm start's twin search takes 16 s alone and over 60 s at a load of 10 on 2 cores
ENV_NAMES = {"chunk_tokens": "LMCACHE_CHUNK_SIZE", "cpu_gib": "LMCACHE_MAX_LOCAL_CPU_SIZE",
             "l2_min_prompt_tokens": "LMCACHE_MIN_RETRIEVE_TOKENS"}


@pytest.fixture
def kube(shared_dir):
    yield from serve(shared_dir)


@pytest.fixture
def vllm():
    fake = FakeVllm()
    with MetricsServer() as srv:
        srv.route("/metrics", text=fake.text())
        yield fake, srv


def targets_file(tmp_path: Path) -> Path:
    path = tmp_path / "targets.yaml"
    path.write_text(yaml.safe_dump({"namespace": NS, "targets": [
        {"kind": "deployment-env", "name": "vllm-llama", "container": "vllm"}],
        "fixed_knobs": {"router": "roundrobin"}, "rollout_poll_s": 1, "rollout_timeout_s": 30}))
    return path


def runtime_for(kube, vllm, tmp_path, fake: FakeTime, *, identity: str = "agent-a", **overrides):
    _fake, srv = vllm
    settings = load_settings(env={}, **{
        "server": {"host": "127.0.0.1", "port": 0},
        "scrape": {"interval_s": 60, "timeout_s": 5},
        "tuner": {"enabled": True, "apply": "all", "storage": f"sqlite:///{tmp_path}/{identity}.db", "sampler": "random",
                  "seed": 7, "step_interval_s": 60, "limits": {"pods": 2, "node_memory_headroom_gib": 16},
                  "guardrails": {"cooldown_s": 0, "max_changes_per_hour": 10},
                  "live": {"settle_s": 0, "window_s": 10, "min_requests": 5},
                  "warm_start": {"trials": 0}, "drift": {"enabled": False},
                  "planner": {"enabled": False}},  # these tests drive the live search (the planner's tests below)
        "actuation": {"targets_file": str(targets_file(tmp_path)), "identity": identity},
        **overrides})
    return build_runtime(settings, plan_executor=InlineExecutor(), api_client=kube.api_client(), clock=fake.clock, monotonic=fake.clock,
                         sleep=fake.sleep, now=fake.now, env={},
                         targets=StaticTargets([Target(srv.url("/metrics"), "vllm", "vllm-0")]))


def traffic(rt, vllm, fake: FakeTime, seconds: float, *, step_s: float = 2.5, electors=None, **serve) -> None:
    """Serve 10 requests per step and scrape after each, advancing the fake clock; the electors
    renew or contend every step, as their threads do every retry period (2 s)."""
    pod, srv = vllm
    end = fake.t + seconds
    while fake.t < end:
        fake.t += step_s
        for elector in (electors if electors is not None else (rt.elector,)):
            elector.try_acquire_or_renew()
        pod.serve(10, **serve)
        srv.route("/metrics", text=pod.text())
        rt.agent.scrape_now()


def samples(rt) -> dict[tuple[str, tuple], float]:
    out = {}
    for fam in text_string_to_metric_families(rt.agent.metrics_text()):
        for s in fam.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def value(rt, name: str, **labels) -> float | None:
    return samples(rt).get((name, tuple(sorted(labels.items()))))


def vllm_env(kube) -> dict[str, str]:
    dep = kube.get("Deployment", NS, "vllm-llama")
    return {e["name"]: e["value"] for e in dep["spec"]["template"]["spec"]["containers"][0].get("env", [])}


def run_to_trial(rt, vllm, fake):
    """Scrape, baseline over one window, then the first trial. Returns the step states."""
    traffic(rt, vllm, fake, 2.5)
    states = [rt.tuning.step().state]
    traffic(rt, vllm, fake, 12.5)
    states.append(rt.tuning.step().state)
    states.append(rt.tuning.step().state)
    return states


def test_leader_measures_a_baseline_then_applies_a_trial_to_the_deployment(kube, vllm, tmp_path):
    kube.put(deployment("vllm-llama", env=[{"name": "LMCACHE_CHUNK_SIZE", "value": "256"}]))
    fake = FakeTime()
    rt = runtime_for(kube, vllm, tmp_path, fake)
    assert {d.name for d in rt.tuning.make_controller().space.dimensions} == set(ENV_NAMES)  # what the target owns
    assert rt.elector.try_acquire_or_renew() is True

    assert run_to_trial(rt, vllm, fake) == ["baseline", "baseline_done", "trial_started"]

    trial = rt.tuning.controller.candidate.knobs
    env = vllm_env(kube)
    for knob, var in ENV_NAMES.items():
        want = getattr(trial, knob)
        default = {"chunk_tokens": 256, "cpu_gib": 5.0, "l2_min_prompt_tokens": 0}[knob]
        if want != default or var in env:
            assert float(env[var]) == float(want), (knob, env)
    assert rt.actuator.current() == trial
    # the baseline was marked good: on the object, and in the study storage
    dep = kube.get("Deployment", NS, "vllm-llama")
    record = json.loads(dep["metadata"]["annotations"]["tierpilot.io/last-good"])
    assert record["knobs"]["chunk_tokens"] == 256
    assert rt.last_good_store.load_last_good() == rt.tuning.controller.baseline.knobs
    (stored,) = rt.last_good_store.records().values()
    assert json.loads(stored) == record

    assert value(rt, "tierpilot_actuations_total", workload=NS, result="applied") == 1.0
    info = [labels for (name, labels), v in samples(rt).items() if name == "tierpilot_config_info" and v == 1.0]
    assert len(info) == 1 and dict(info[0])["chunk_tokens"] == str(trial.chunk_tokens)
    assert value(rt, "tierpilot_leader", identity="agent-a") == 1.0
    assert value(rt, "tierpilot_tuner_trial_in_flight", workload=NS) == 1.0


def test_dry_run_proposes_logs_and_counts_but_changes_nothing(kube, vllm, tmp_path, caplog):
    kube.put(deployment("vllm-llama", env=[{"name": "LMCACHE_CHUNK_SIZE", "value": "256"}]))
    before = kube.get("Deployment", NS, "vllm-llama")
    fake = FakeTime()
    rt = runtime_for(kube, vllm, tmp_path, fake, dry_run=True)
    assert rt.actuator.settings.dry_run is True
    rt.elector.try_acquire_or_renew()
    with caplog.at_level(logging.INFO, logger="tierpilot.tuner"):
        states = run_to_trial(rt, vllm, fake)
    assert states == ["baseline", "baseline_done", "dry_run"]

    after = kube.get("Deployment", NS, "vllm-llama")
    assert after["spec"] == before["spec"] and "annotations" not in after["metadata"]
    patches = kube.requests("PATCH", "deployments")
    assert patches and all(p["params"].get("dryRun") == "All" for p in patches)  # validated by the server only
    events = [json.loads(r.getMessage()) for r in caplog.records if r.name == "tierpilot.tuner"]
    proposal = next(e for e in events if e["event"] == "proposal")
    assert proposal["dry_run"] is True
    assert any(e["event"] == "dry_run" for e in events)
    assert value(rt, "tierpilot_actuations_total", workload=NS, result="dry_run") == 1.0
    assert value(rt, "tierpilot_actuations_total", workload=NS, result="applied") == 0.0
    assert value(rt, "tierpilot_tuner_trials_total", workload=NS, state="dry_run") == 1.0
    assert value(rt, "tierpilot_dry_run", workload=NS) == 1.0


def test_a_standby_scrapes_and_exports_but_never_actuates(kube, vllm, tmp_path):
    kube.put(deployment("vllm-llama", env=[{"name": "LMCACHE_CHUNK_SIZE", "value": "256"}]))
    fake = FakeTime()
    leader = runtime_for(kube, vllm, tmp_path, fake, identity="agent-a")
    standby = runtime_for(kube, vllm, tmp_path, fake, identity="agent-b")
    assert leader.elector.try_acquire_or_renew() is True
    assert standby.elector.try_acquire_or_renew() is False
    writes_before = len(kube.requests("PATCH"))

    for _ in range(3):
        traffic(standby, vllm, fake, 5, electors=(leader.elector, standby.elector))
        assert standby.tuning.step() is None
    assert standby.tuning.state == "standby" and standby.tuning.controller is None and standby.tuning.terms == 0
    assert len(kube.requests("PATCH")) == writes_before
    url = vllm[1].url("/metrics")
    assert value(standby, "tierpilot_target_up", target=url, role="vllm", pod="vllm-0") == 1.0  # it exports
    gpu = [v for (name, labels), v in samples(standby).items()
           if name == "tierpilot_kv_hit_ratio" and ("tier", "gpu") in labels]
    assert gpu == [0.5]
    assert value(standby, "tierpilot_leader", identity="agent-b") == 0.0
    assert value(standby, "tierpilot_actuations_total", workload=NS, result="applied") == 0.0
    assert "tierpilot.io/last-good" not in (kube.get("Deployment", NS, "vllm-llama")["metadata"].get("annotations")
                                            or {})


def test_a_started_runtime_runs_every_job_and_stops_cleanly(kube, vllm, tmp_path):
    kube.put(deployment("vllm-llama", env=[{"name": "LMCACHE_CHUNK_SIZE", "value": "256"}]))
    pod, srv = vllm
    pod.serve(10)
    srv.route("/metrics", text=pod.text())
    settings = load_settings(
        env={}, server={"host": "127.0.0.1", "port": 0}, scrape={"interval_s": 0.2},
        targets={"static": [{"url": srv.url("/metrics"), "role": "vllm", "pod": "vllm-0"}]},
        kv_events={"enabled": True, "discovery": False, "endpoints": [
            {"pod": "vllm-0", "model": pod.model, "endpoint": "tcp://127.0.0.1:1"}]},
        tuner={"enabled": True, "apply": "all", "storage": f"sqlite:///{tmp_path}/s.db", "step_interval_s": 0.2,
               "warm_start": {"trials": 0}, "live": {"settle_s": 0, "window_s": 1, "min_requests": 1}},
        actuation={"targets_file": str(targets_file(tmp_path)), "identity": "agent-a"})
    rt = build_runtime(settings, api_client=kube.api_client(), env={})
    rt.start()
    try:
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            runs = {j: value(rt, "tierpilot_job_runs_total", task=j, outcome="ok") or 0
                    for j in ("scrape", "kv_counters", "tune_step")}
            if min(runs.values()) >= 2 and rt.tuning.terms == 1:
                break
            time.sleep(0.1)
        assert min(runs.values()) >= 2, runs
        assert rt.elector.is_leader() and rt.tuning.terms == 1
        assert rt.kv_feed() == 1  # the scraped vLLM counters of the one pod reach the KV manager
    finally:
        rt.stop()
    assert not rt.agent._thread and rt._elector_thread is None
    lease = kube.get("Lease", NS, "tierpilot-leader")
    assert lease["spec"]["holderIdentity"] == ""  # released on stop: a standby takes over at once
    rt.stop()  # idempotent


def test_kv_endpoints_come_from_pod_annotations_and_the_config(kube, vllm, tmp_path):
    def annotated(name, ip, ann):
        return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": NS,
                "labels": {"app": "vllm-llama"}, "annotations": ann},
                "spec": {"containers": [{"name": "vllm", "image": "i"}]}, "status": {"phase": "Running", "podIP": ip}}

    kube.put(annotated("vllm-0", "10.0.0.1", {"tierpilot.io/kv-events-port": "5557", "tierpilot.io/model": "m"}))
    kube.put(annotated("vllm-1", "10.0.0.2", {"tierpilot.io/kv-events-port": "5557"}))  # no model: skipped
    kube.put(annotated("vllm-2", "10.0.0.3", {}))  # publishes no events
    settings = load_settings(env={}, server={"host": "127.0.0.1", "port": 0},
                             targets={"kubernetes": {"enabled": True, "namespace": NS,
                                                     "roles": {"vllm": {"selector": "app=vllm-llama"}}}},
                             kv_events={"enabled": True, "endpoints": [
                                 {"pod": "static-0", "model": "m", "endpoint": "tcp://10.0.1.1:5557"}]})
    rt = build_runtime(settings, api_client=kube.api_client(), env={})
    try:
        assert rt.kv_refresh() == 2
        assert sorted((s.pod, s.endpoint) for s in rt.kv._wanted) == [
            ("static-0", "tcp://10.0.1.1:5557"), ("vllm-0", "tcp://10.0.0.1:5557")]
        rt.agent.target_source.sources[-1].refresh()  # the scrape targets come from the same client
        assert sorted(t.pod for t in rt.agent.target_source.targets()) == ["vllm-0", "vllm-1", "vllm-2"]
    finally:
        rt.kv.stop()


def test_each_leader_term_warm_starts_from_the_twin_on_the_fitted_workload(kube, vllm, tmp_path, caplog):
    kube.put(deployment("vllm-llama", env=[{"name": "LMCACHE_CHUNK_SIZE", "value": "256"}]))
    fake = FakeTime()
    rt = runtime_for(kube, vllm, tmp_path, fake, tuner={
        "enabled": True, "apply": "all", "storage": f"sqlite:///{tmp_path}/w.db", "seed": 1, "limits": {"pods": 2},
        "warm_start": {"trials": 2, "top_k": 2, "max_requests": 20, "duration_s": 30},
        "drift": {"enabled": False}, "live": {"settle_s": 0, "window_s": 10, "min_requests": 5},
        "planner": {"enabled": False}})  # the warm start seeding the live search (the planner's: below)
    rt.elector.try_acquire_or_renew()
    traffic(rt, vllm, fake, 10, prompt=3000)
    with caplog.at_level(logging.INFO):
        assert rt.tuning.step().state == "baseline"
    fitted = next(r.getMessage() for r in caplog.records if "twin workload fitted" in r.getMessage())
    assert "arrival_rate_rps=4.0" in fitted  # 10 requests every 2.5 s
    warm = next(json.loads(r.getMessage()) for r in caplog.records
                if r.name == "tierpilot.tuner" and '"warm_start"' in r.getMessage())
    assert warm["trials"] == 2 and 1 <= len(warm["candidates"]) <= 2
    study = rt.tuning.controller.tuner.study
    assert [t.user_attrs.get("source") for t in study.trials if t.state.name == "WAITING"] == ["twin"] * len(
        warm["candidates"])


def test_the_runtime_prices_plans_on_a_thread_of_their_own_by_default(kube, vllm, tmp_path, caplog):
    """Without an injected executor (production), the warm start runs on the plan thread: the step
    that starts it returns at once, a later step takes its candidates."""
    kube.put(deployment("vllm-llama", env=[{"name": "LMCACHE_CHUNK_SIZE", "value": "256"}]))
    fake = FakeTime()
    settings = load_settings(
        env={}, server={"host": "127.0.0.1", "port": 0}, scrape={"interval_s": 60, "timeout_s": 5},
        tuner={"enabled": True, "apply": "all", "storage": f"sqlite:///{tmp_path}/bg.db", "seed": 1, "limits": {"pods": 2},
               "warm_start": {"trials": 2, "top_k": 2, "max_requests": 20, "duration_s": 30},
               "drift": {"enabled": False}, "live": {"settle_s": 0, "window_s": 10, "min_requests": 5},
               "planner": {"enabled": False}},
        actuation={"targets_file": str(targets_file(tmp_path)), "identity": "agent-a"})
    _fake, srv = vllm
    rt = build_runtime(settings, api_client=kube.api_client(), clock=fake.clock, monotonic=fake.clock,
                       sleep=fake.sleep, now=fake.now, env={},
                       targets=StaticTargets([Target(srv.url("/metrics"), "vllm", "vllm-0")]))
    try:
        assert rt.plan_executor is not None and not isinstance(rt.plan_executor, InlineExecutor)
        rt.elector.try_acquire_or_renew()
        traffic(rt, vllm, fake, 10, prompt=3000)
        with caplog.at_level(logging.INFO, logger="tierpilot.tuner"):
            assert rt.tuning.step().state in ("baseline", "planning")
            deadline = time.monotonic() + 60
            while rt.tuning.controller.plans.running:
                assert time.monotonic() < deadline, "the plan never finished"
                time.sleep(0.05)
            rt.tuning.step()  # takes the finished plan
        warm = [r for r in caplog.records if r.name == "tierpilot.tuner" and '"warm_start"' in r.getMessage()]
        assert [r.threadName for r in warm] == ["tierpilot-plan_0"]
        study = rt.tuning.controller.tuner.study
        assert [t.user_attrs.get("source") for t in study.trials if t.state.name == "WAITING"] == ["twin"] * len(
            json.loads(warm[0].getMessage())["candidates"])
    finally:
        rt.plan_executor.shutdown(wait=True)


# -- the paying tuner (tuner.planner, on by default): planner, transition cost, counterfactual ----
ROUTER_JSON = '{\n  "service_discovery": "k8s",\n  "routing_logic": "roundrobin"\n}\n'


def paying_runtime(kube, vllm, tmp_path, fake: FakeTime, **planner):
    """The runtime with the default planner over a vLLM Deployment and the production-stack router's
    dynamic-config ConfigMap (a hot reload), the twin search on, drift off."""
    kube.put(deployment("vllm-llama", env=[{"name": "LMCACHE_CHUNK_SIZE", "value": "256"}]))
    kube.put(configmap("router-dyn", {"dynamic_config.json": ROUTER_JSON}))
    kube.put(deployment("vllm-router", replicas=1))  # rolled only to enter or leave kvaware
    path = tmp_path / "paying-targets.yaml"
    path.write_text(yaml.safe_dump({"namespace": NS, "targets": [
        {"kind": "deployment-env", "name": "vllm-llama", "container": "vllm"},
        {"kind": "router-configmap", "name": "router-dyn", "key": "dynamic_config.json",
         "restart": [{"kind": "Deployment", "name": "vllm-router"}]}],
        "rollout_poll_s": 1, "rollout_timeout_s": 30}))
    tuner = {"enabled": True, "apply": "all", "storage": f"sqlite:///{tmp_path}/p.db", "seed": 3, "step_interval_s": 60,
             "limits": {"pods": 4, "node_memory_headroom_gib": 16},
             "guardrails": {"cooldown_s": 0, "max_changes_per_hour": 10},
             "live": {"settle_s": 0, "window_s": 10, "min_requests": 5},
             "warm_start": {"trials": 3, "top_k": 2, "max_requests": 300, "duration_s": 120},
             "drift": {"enabled": False, "window_s": 60},
             "planner": {"recent_s": 60, "warm_s": 60, **planner}}
    return runtime_for(kube, vllm, tmp_path, fake, tuner=tuner,
                       actuation={"targets_file": str(path), "identity": "agent-a"})


def router_in_configmap(kube) -> str:
    return json.loads(kube.get("ConfigMap", NS, "router-dyn")["data"]["dynamic_config.json"])["routing_logic"]


def plan_once(rt, vllm, fake) -> list[str]:
    """Scrape a minute of traffic, then the baseline window; the planner prices after it."""
    traffic(rt, vllm, fake, 60, prompt=3000, gpu_hit=0.3, external_hit=0.4)
    states = [rt.tuning.step().state]
    traffic(rt, vllm, fake, 12.5, prompt=3000, gpu_hit=0.3, external_hit=0.4)
    states.append(rt.tuning.step().state)
    states.append(rt.tuning.step().state)
    return states


def test_the_runtime_builds_the_paying_planner_by_default(kube, vllm, tmp_path):
    rt = paying_runtime(kube, vllm, tmp_path, FakeTime())
    controller = rt.tuning.make_controller()
    assert rt.paying is not None and controller.warm_start is rt.paying.planner
    assert controller.counterfactual is rt.paying.counterfactual  # live windows judged on the twin
    s = controller.settings
    assert (s.plan_after_baseline, s.live_search, s.drift_quiet_s) == (True, False, 30.0 * 4 + 10.0)
    assert rt.paying.planner.routers == ("roundrobin", "session", "prefixaware", "kvaware")
    assert rt.paying.planner.search is not None  # the twin search proposes the restart candidates


def test_a_hot_router_change_that_pays_is_applied_without_restarting_the_serving_pods(kube, vllm, tmp_path):
    fake = FakeTime()
    rt = paying_runtime(kube, vllm, tmp_path, fake)
    rt.elector.try_acquire_or_renew()

    assert plan_once(rt, vllm, fake) == ["baseline", "baseline_done", "trial_started"]

    hot = rt.paying.planner.decisions[0]
    assert hot.accepted and not hot.restart and hot.knobs.router != "roundrobin"
    # KV events off: the plan and /healthz say the planning workload is the fitted fallback
    assert rt.paying.planner.last_plan["workload"] == "fitted"
    assert rt.agent.info()["tuner_workload"]["kind"] == "fitted"
    assert max(hot.gain_p95, hot.gain_mean) >= 0.01  # the hot margin
    assert rt.actuator.current() == hot.knobs == rt.tuning.controller.candidate.knobs
    assert router_in_configmap(kube) == hot.knobs.router
    vllm_dep = kube.get("Deployment", NS, "vllm-llama")
    assert vllm_env(kube) == {"LMCACHE_CHUNK_SIZE": "256"}  # the serving pods were not rolled
    assert "annotations" not in vllm_dep["spec"]["template"].get("metadata", {})
    # the twin's prediction for the running configuration against the measured window is exported
    err = value(rt, "tierpilot_tuner_twin_prediction_error_ratio", workload=NS)
    assert err is not None and err == pytest.approx(rt.tuning.controller.prediction_errors[-1][1])


def test_a_restart_candidate_whose_transition_cost_exceeds_its_gain_is_declined(kube, vllm, tmp_path):
    import numpy as np

    from tuners.planning.planner import weighted_p95_mean

    pod, _srv = vllm
    pod.gpu_blocks = 1024  # a 16k-token GPU KV pool (vLLM's cache_config_info): a bigger CPU tier pays
    fake = FakeTime()
    rt = paying_runtime(kube, vllm, tmp_path, fake, hot_margin=1.0)  # the router held: restarts only
    rt.elector.try_acquire_or_renew()

    assert plan_once(rt, vllm, fake) == ["baseline", "baseline_done", "holding"]

    twin = rt.paying.planner.twin_factory()
    stay = twin.steady(rt.actuator.current())
    stay95, stay_mean = weighted_p95_mean(stay, np.ones(stay.size))
    paying_once_in_place = []
    for d in rt.paying.planner.decisions:
        if not d.restart:
            continue
        moved = twin.steady(d.knobs)
        m95, mmean = weighted_p95_mean(moved, np.ones(moved.size))
        if max(1 - m95 / stay95, 1 - mmean / stay_mean) >= 0.03:
            paying_once_in_place.append(d)
    assert paying_once_in_place, "the search should find a restart that pays once in place"
    for d in paying_once_in_place:  # ... but not over the horizon, counting the rolling restart
        assert not d.accepted and max(d.gain_p95, d.gain_mean) < 0.03
    assert vllm_env(kube) == {"LMCACHE_CHUNK_SIZE": "256"} and router_in_configmap(kube) == "roundrobin"
    assert not value(rt, "tierpilot_actuations_total", workload=NS, result="applied")


def test_observed_waiting_requests_raise_the_planning_twin_ttft_by_the_queue_delay(kube, vllm, tmp_path):
    pod, _srv = vllm
    fake = FakeTime()
    rt = paying_runtime(kube, vllm, tmp_path, fake)
    traffic(rt, vllm, fake, 60, prompt=3000)
    idle = rt.paying.planner.twin_factory()
    assert idle.cluster.load_delay_s == 0.0  # an empty queue

    pod.waiting = 2.0  # 2 waiting requests on the pod (vllm:num_requests_waiting)
    traffic(rt, vllm, fake, 60, prompt=3000)
    loaded = rt.paying.planner.twin_factory()
    # Little's law: 2 waiting / (4 req/s over the 4 pods of tuner.limits) = 2 s in the queue
    assert loaded.cluster.load_delay_s == pytest.approx(2.0, rel=0.02)
    knobs = rt.actuator.current()
    diff = loaded.steady(knobs).mean() - idle.steady(knobs).mean()
    assert diff == pytest.approx(2.0, rel=0.05)


def test_the_planning_twin_is_calibrated_to_the_live_windows(kube, vllm, tmp_path):
    fake = FakeTime()
    rt = paying_runtime(kube, vllm, tmp_path, fake, calibration_step_s=10)
    for i in range(12):  # 10-s windows of growing prompts: TTFT = 60 ms + 0.3 ms per uncached token
        prompt = 1000 + 500 * i
        computed = prompt * (1.0 - 0.3 - 0.4)
        traffic(rt, vllm, fake, 10, prompt=prompt, gpu_hit=0.3, external_hit=0.4, ttft_s=0.06 + 0.0003 * computed)
    twin = rt.paying.planner.twin_factory()
    (_when, fit), = rt.paying.fits
    assert fit.windows >= 6 and fit.prefill_s_per_token == pytest.approx(0.0003, rel=0.05)
    assert twin.profile.latency.prefill_s_per_token == fit.prefill_s_per_token
    assert rt.paying.counterfactual.profile is twin.profile  # live windows are judged on the same twin
