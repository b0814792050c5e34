"""Shadow mode (`tuner.mode: shadow`): the whole runtime with no Kubernetes, scraping the emulated
cluster, plans exactly as the live tuner (the same runtime against the Kubernetes emulator)
plans on the same data; it applies nothing, records every plan with what a live tuner would have
done, exports it and shows it in /healthz, and scores its prediction once the fleet's
configuration changes. Also: `run` with the tuner on and no credentials names the settings key and
shadow mode, and a kubeconfig that does not exist is named."""
from __future__ import annotations

import json

import pytest
import yaml

from agent.collect.discovery import StaticTargets
from agent.runtime.assembly import build_runtime
from agent.settings import load_settings
from contracts.knobs import Knobs
from contracts.tier_model import Target
from emulator.cluster.fleet import ClusterSpec, EmulatedCluster
from emulator.cluster.pod_metrics import RequestOutcome
from tests.support.kube import NS, FakeTime, configmap, deployment, serve
from tuners.planning.plan_runner import InlineExecutor

pytestmark = pytest.mark.timeout(120)
ROUTER_JSON = '{\n  "service_discovery": "k8s",\n  "routing_logic": "roundrobin"\n}\n'


@pytest.fixture
def kube(shared_dir):
    yield from serve(shared_dir)


@pytest.fixture
def cluster():
    with EmulatedCluster(ClusterSpec(pods=2)) as c:
        yield c


def targets_file(tmp_path):
    path = tmp_path / "targets.yaml"
    path.write_text(yaml.safe_dump({"namespace": NS, "targets": [
        {"kind": "deployment-env", "name": "vllm-llama", "container": "vllm"},
        {"kind": "router-configmap", "name": "router-dyn", "key": "dynamic_config.json",
         "restart": [{"kind": "Deployment", "name": "vllm-router"}]}],
        "rollout_poll_s": 1, "rollout_timeout_s": 30}))
    return path


def tuner(tmp_path, name: str, **extra):
    return {"enabled": True, "storage": f"sqlite:///{tmp_path}/{name}.db", "seed": 3, "step_interval_s": 60,
            "limits": {"pods": 2, "node_memory_headroom_gib": 16},
            "guardrails": {"cooldown_s": 0, "max_changes_per_hour": 10},
            "live": {"settle_s": 0, "window_s": 10, "min_requests": 5},
            "warm_start": {"trials": 3, "top_k": 2, "max_requests": 300, "duration_s": 120},
            "drift": {"enabled": False, "window_s": 60}, "planner": {"recent_s": 60, "warm_s": 60}, **extra}


def runtime(cluster, fake, tmp_path, tuner_settings, **kw):
    settings = load_settings(env={}, server={"host": "127.0.0.1", "port": 0},
                             scrape={"interval_s": 60, "timeout_s": 5}, tuner=tuner_settings,
                             actuation={"targets_file": str(targets_file(tmp_path)), "identity": "agent-a"})
    targets = StaticTargets([Target(p.vllm_endpoint.url, "vllm", p.name) for p in cluster.pods.values()])
    return build_runtime(settings, plan_executor=InlineExecutor(), clock=fake.clock, monotonic=fake.clock,
                         sleep=fake.sleep, now=fake.now, env={}, targets=targets, **kw)


def traffic(cluster, runtimes, fake, seconds: float, *, ttft_s: float, electors=()) -> None:
    """Every 2.5 s: 5 requests per pod (3000-token prompts, 30% GPU and 40% L2 hits), then a scrape
    by every runtime, so they all read the same data at the same (fake) time."""
    end = fake.t + seconds
    while fake.t < end:
        fake.t += 2.5
        for elector in electors:
            elector.try_acquire_or_renew()
        for pod in cluster.pods.values():
            for _ in range(5):
                pod.record(RequestOutcome(prompt_tokens=3000, gpu_hit_tokens=900, cpu_hit_tokens=0,
                                          l2_hit_tokens=1200, output_tokens=16, ttft_s=ttft_s, stored_tokens=768))
        for rt in runtimes:
            rt.agent.scrape_now()


@pytest.mark.slow  # two whole runtimes, each pricing a plan with a twin search: ~10 s quiet, ~30 s on a busy machine
def test_shadow_plans_as_the_live_tuner_records_exports_and_scores_its_prediction(kube, cluster, tmp_path):
    kube.put(deployment("vllm-llama", env=[{"name": "LMCACHE_CHUNK_SIZE", "value": "256"}]))
    kube.put(configmap("router-dyn", {"dynamic_config.json": ROUTER_JSON}))
    kube.put(deployment("vllm-router", replicas=1))
    fake = FakeTime()
    running = {"knobs": Knobs()}  # what the fleet runs, as the deploy pipeline's file would say
    log_file = tmp_path / "shadow.jsonl"
    live = runtime(cluster, fake, tmp_path, tuner(tmp_path, "live"), api_client=kube.api_client())
    shadow = runtime(cluster, fake, tmp_path, tuner(tmp_path, "shadow", mode="shadow",
                                                    shadow={"settle_s": 5, "window_s": 10, "log_file": str(log_file)}),
                     running_knobs=lambda: running["knobs"])  # no api_client: shadow mode needs no Kubernetes
    assert shadow.elector is None and shadow.actuation_metrics is None
    assert {d.name for d in shadow.tuning.make_controller().space.dimensions} == {
        d.name for d in live.tuning.make_controller().space.dimensions}  # the targets file, read offline
    both = (live, shadow)
    electors = (live.elector,)

    traffic(cluster, both, fake, 60, ttft_s=0.6, electors=electors)
    assert [rt.tuning.step().state for rt in both] == ["baseline", "baseline"]
    traffic(cluster, both, fake, 12.5, ttft_s=0.6, electors=electors)
    assert [rt.tuning.step().state for rt in both] == ["baseline_done", "baseline_done"]
    live_state, shadow_state = (rt.tuning.step().state for rt in both)

    live_plan, shadow_plan = live.paying.planner.history[0], shadow.paying.planner.history[0]
    assert shadow_plan["priced"] == live_plan["priced"] and shadow_plan["plan"] == live_plan["plan"]
    assert shadow_plan["current"] == live_plan["current"] == Knobs().to_dict()
    hot = live.paying.planner.decisions[0]
    assert hot.accepted and not hot.restart  # the hot router move pays on this workload
    assert live_state == "trial_started" and shadow_state == "proposed"
    assert running["knobs"] == Knobs()  # the shadow changed nothing (it cannot: it has no writer)

    assert shadow.shadow.update(fake.t) >= len(shadow_plan["priced"])
    summary = shadow.agent.info()["tuner_shadow"]
    assert summary["plans"] == 1 and summary["apply"] == "hot"
    would = {json.dumps(m["changes"], sort_keys=True): m["would"] for m in summary["latest_plan"]}
    assert len(would) == len(shadow_plan["priced"])
    hot_key = json.dumps({k: list(v) for k, v in Knobs().diff(hot.knobs).items()}, sort_keys=True)
    assert would.pop(hot_key) == "apply"  # the move the live tuner made
    assert set(would.values()) <= {"propose", "decline"}
    accepted_restarts = [d for d in shadow.paying.planner.decisions if d.accepted and d.restart]
    assert summary["moves"]["propose"] == len(accepted_restarts)  # restart moves: proposals under `hot`

    # someone applies the planner's move; TTFT falls. The shadow sees the change and scores it.
    running["knobs"] = hot.knobs
    shadow.shadow.update(fake.t)
    traffic(cluster, (shadow,), fake, 20, ttft_s=0.2)
    shadow.shadow.update(fake.t)
    score = shadow.shadow.scores[-1]
    assert score.outcome == "scored" and score.before == Knobs() and score.after == hot.knobs
    assert score.predicted_gain_p95 == pytest.approx(hot.steady_gain_p95 + hot.memory_p95, abs=1e-4)  # as priced
    assert score.measured_gain_p95 > 0.5  # 0.6 s -> 0.2 s, read from the TTFT histogram buckets
    assert score.error_p95 == pytest.approx(score.measured_gain_p95 - score.predicted_gain_p95)

    text = shadow.agent.metrics_text()
    assert f'tierpilot_tuner_shadow_plans_total{{workload="{NS}"}} 1.0' in text
    assert f'tierpilot_tuner_shadow_changes_scored_total{{outcome="scored",workload="{NS}"}} 1.0' in text
    assert "tierpilot_tuner_shadow_prediction_error_ratio" in text
    health = shadow.agent.info()["tuner_shadow"]
    assert health["scores"][-1]["outcome"] == "scored" and health["changes_scored"]["scored"] == 1
    kinds = [json.loads(line)["kind"] for line in log_file.read_text().splitlines()]
    assert kinds[0] == "plan" and "move" in kinds and kinds[-2:] == ["config_change", "score"]


def test_a_shadow_run_needs_no_credentials_and_a_live_one_says_how_to_give_them(tmp_path, monkeypatch):
    monkeypatch.setenv("KUBECONFIG", str(tmp_path / "none"))
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    common = {"server": {"host": "127.0.0.1", "port": 0}, "dry_run": True,
              "targets": {"static": [{"url": "http://127.0.0.1:1/metrics", "pod": "vllm-0", "role": "vllm"}]}}
    t = tuner(tmp_path, "s")
    rt = build_runtime(load_settings(env={}, tuner={**t, "mode": "shadow"}, **common), env={})
    assert rt.tuning is not None and rt.elector is None  # no targets file, no cluster: every knob searched
    with pytest.raises(Exception, match=r"set actuation.kubeconfig or \$KUBECONFIG.*tuner.mode: shadow") as exc:
        build_runtime(load_settings(env={}, tuner=t, actuation={"targets_file": str(targets_file(tmp_path))},
                                    **common), env={})
    assert "--kubeconfig" not in str(exc.value)
    from click.testing import CliRunner

    from agent.cli import main

    config = tmp_path / "agent.yaml"
    config.write_text(yaml.safe_dump({"tuner": {**t, "mode": "shadow"}, **common}))
    out = CliRunner().invoke(main, ["run", "--config", str(config), "--dry-run", "--check-config"])
    assert out.exit_code == 0, out.output
    assert "SHADOW: plans as apply hot would, applies nothing" in out.output
    missing = tmp_path / "no-such-kubeconfig"
    with pytest.raises(Exception, match=f"kubeconfig {missing}: no such file"):
        build_runtime(load_settings(env={}, tuner=t, actuation={"targets_file": str(targets_file(tmp_path)),
                                                                 "kubeconfig": str(missing)}, **common), env={})



class _Ttft:
    """TTFT samples by time: `slow` before `switch_at`, `fast` after; none in `gaps`."""

    def __init__(self, switch_at: float, slow: float = 0.6, fast: float = 0.3, per_s: int = 2):
        self.switch_at, self.slow, self.fast, self.per_s = switch_at, slow, fast, per_s

    def ttft_observations(self, since, until):
        from tuners.objective import TtftObservations

        n = int((until - since) * self.per_s)
        value = self.slow if until <= self.switch_at else self.fast
        return TtftObservations(samples=(value,) * n) if n else None


def test_the_record_classifies_moves_and_scores_unpriced_and_unmeasured_changes():
    from tuners.shadow import ShadowLog

    running = {"knobs": Knobs()}
    move = {"knobs": {"router": ["roundrobin", "session"]}, "verdict": "apply", "steady_gain_p95": 0.4,
            "memory_p95": 0.0, "gain_per_hour_s": 50.0, "transition_cost_s": 0.0}
    restart = {"knobs": {"chunk_tokens": [256, 512]}, "verdict": "apply", "steady_gain_p95": 0.1}
    plans = [{"at": 10.0, "current": Knobs().to_dict(), "plan": [], "priced": [
        move, restart, {"knobs": {"cpu_gib": [5.0, 9.0]}, "verdict": "decline", "reason": "does not pay"}]}]
    lines = []
    log = ShadowLog(scope="hot", plans=plans, running=lambda: running["knobs"], ttft=_Ttft(switch_at=100.0),
                    settle_s=10.0, window_s=20.0, min_requests=5, log=lambda k, r: lines.append(k))
    log.update(20.0)
    assert [m.would for m in log.moves] == ["apply", "propose", "decline"]
    running["knobs"] = Knobs(router="session")  # the move it priced: scored against its prediction
    log.update(100.0)
    log.update(129.0)
    assert not log.scores  # settle + window not over yet
    log.update(130.0)
    score = log.scores[-1]
    assert score.outcome == "scored" and score.measured_gain_p95 == pytest.approx(0.5)
    assert score.error_p95 == pytest.approx(0.1)
    running["knobs"] = Knobs(router="session", l2_eviction="lfu")  # nobody priced this one
    log.update(200.0)
    log.update(230.0)
    assert log.scores[-1].outcome == "unpriced" and log.scores[-1].error_p95 is None
    log._ttft = _Ttft(switch_at=0.0, per_s=0)  # no traffic at all
    running["knobs"] = Knobs()
    log.update(300.0)
    log.update(330.0)
    assert log.scores[-1].outcome == "unmeasured"
    assert lines.count("score") == 3 and lines.count("config_change") == 3


def test_with_credentials_the_shadow_reads_the_running_configuration_from_the_targets(kube, cluster, tmp_path):
    """Read-only: what the targets run now (get), a change someone makes seen at the next look, and
    not one write (the Deployment and ConfigMap are byte-identical after the tuner's steps)."""
    kube.put(deployment("vllm-llama", env=[{"name": "LMCACHE_CHUNK_SIZE", "value": "512"}]))
    kube.put(configmap("router-dyn", {"dynamic_config.json": ROUTER_JSON}))
    kube.put(deployment("vllm-router", replicas=1))
    fake = FakeTime()
    rt = runtime(cluster, fake, tmp_path, tuner(tmp_path, "ro", mode="shadow", shadow={"settle_s": 0, "window_s": 10}),
                 api_client=kube.api_client())
    assert rt.actuator.current() == Knobs(chunk_tokens=512)
    before = [kube.get("Deployment", NS, "vllm-llama"), kube.get("ConfigMap", NS, "router-dyn")]
    traffic(cluster, (rt,), fake, 60, ttft_s=0.6)
    states = [rt.tuning.step().state]
    traffic(cluster, (rt,), fake, 12.5, ttft_s=0.6)
    states += [rt.tuning.step().state for _ in range(3)]
    assert states[:2] == ["baseline", "baseline_done"] and "trial_started" not in states
    assert [kube.get("Deployment", NS, "vllm-llama"), kube.get("ConfigMap", NS, "router-dyn")] == before
    rt.shadow.update(fake.t)
    kube.put(deployment("vllm-llama", env=[{"name": "LMCACHE_CHUNK_SIZE", "value": "1024"}]))  # someone else
    rt.shadow.update(fake.t)
    assert rt.shadow.summary()["pending_changes"] == 1
    assert rt.shadow.summary()["running"]["chunk_tokens"] == 1024


def test_with_a_leader_lease_only_the_holder_plans_and_keeps_the_record(kube, cluster, tmp_path):
    """The chart runs two replicas sharing the export's Lease: a standby makes no plans and scores
    nothing twice."""
    fake = FakeTime()
    settings = load_settings(env={}, server={"host": "127.0.0.1", "port": 0}, scrape={"interval_s": 60, "timeout_s": 5},
                             tuner=tuner(tmp_path, "lease", mode="shadow"), export={"fleet": "leader"},
                             actuation={"lease_namespace": NS, "identity": "agent-b"})
    targets = StaticTargets([Target(p.vllm_endpoint.url, "vllm", p.name) for p in cluster.pods.values()])
    rt = build_runtime(settings, plan_executor=InlineExecutor(), clock=fake.clock, monotonic=fake.clock,
                       sleep=fake.sleep, now=fake.now, env={}, targets=targets, api_client=kube.api_client(),
                       running_knobs=Knobs)
    traffic(cluster, (rt,), fake, 5, ttft_s=0.6)
    assert rt.tuning.step() is None and rt.tuning.state == "standby"  # no Lease yet
    assert rt.elector.try_acquire_or_renew() is True
    assert rt.tuning.step().state == "baseline"
