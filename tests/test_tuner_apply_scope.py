"""`tuner.apply`: restart-requiring changes behind their own switch. Under the default (`hot`) the
guardrails apply the router's knobs and keep every change that restarts the engines or the L2
master as a proposal (plan line, metric, /proposals, a file); `tierpilot k8s apply-proposal`
applies one with one command through the actuator. The whole runtime with the default live
settings, against the Kubernetes emulator, restarts nothing; the proposal it records is applied
by the CLI."""
from __future__ import annotations

import json

import pytest
import yaml
from prometheus_client import CollectorRegistry

from agent.settings import load_settings
from contracts.knobs import ROUTER_KNOBS, Knobs, restarting_knobs
from emulator.cluster.local_actuator import (
    HOT_KNOBS,
    MASTER_RESTART_KNOBS,
    POD_RESTART_KNOBS,
    ROUTER_RESTART_KNOBS,
)
from tests.support.kube import FakeTime, deployment, serve
from tests.support.tuner_fakes import FakeActuator, FakeClock
from tests.support.tuner_settings import guardrail_settings
from tuners.guardrails import Guardrails
from tuners.metrics import TunerMetrics
from tuners.proposals import ProposalBook, held_back, load_proposals, pick
from tuners.space import DeploymentLimits, SearchSpace

SPACE = SearchSpace.from_limits(DeploymentLimits(pods=2, node_memory_headroom_gib=16, cpu_budget_gib=20))


def guard(scope: str | None = None, initial: Knobs | None = None):
    clock = FakeClock()
    actuator = FakeActuator(clock, initial)
    book = ProposalBook(scope or "hot", target="ns/llm")
    registry = CollectorRegistry()
    registry.register(book)
    settings = guardrail_settings(cooldown_s=0) if scope is None else guardrail_settings(cooldown_s=0, apply=scope)
    return clock, actuator, Guardrails(actuator, SPACE, TunerMetrics(), settings, clock=clock, proposals=book), registry


def test_the_restart_classification_is_one_list_the_emulator_agrees_with() -> None:
    every = set(Knobs().to_dict())
    assert ROUTER_KNOBS == HOT_KNOBS | ROUTER_RESTART_KNOBS
    assert every - ROUTER_KNOBS == POD_RESTART_KNOBS | MASTER_RESTART_KNOBS
    now = Knobs()
    assert restarting_knobs(now, now.replace(router="session", kv_penalty_host=0.5)) == ()
    assert restarting_knobs(now, now.replace(router="session", chunk_tokens=512, l2_eviction="lfu")) == (
        "chunk_tokens", "l2_eviction")


def test_the_scopes() -> None:
    now = Knobs()
    router, chunk = now.replace(router="session"), now.replace(chunk_tokens=512)
    assert held_back("all", now, chunk) == ""
    assert held_back("hot", now, router) == ""
    assert "chunk_tokens restart the engines" in held_back("hot", now, chunk)
    assert held_back("none", now, router) and held_back("none", now, chunk)
    with pytest.raises(ValueError, match="tuner.apply"):
        held_back("some", now, chunk)


def test_a_live_install_defaults_to_hot() -> None:
    assert load_settings(env={}).tuner.apply == "hot"
    assert guardrail_settings().apply == "hot"  # the schema's default (agent/settings/tuner.py tuner.apply)


def test_hot_applies_the_router_and_proposes_the_restart_without_touching_the_target() -> None:
    clock, actuator, g, registry = guard()  # the guardrails' own default scope

    out = g.apply(Knobs(chunk_tokens=512, router="session"), trial=0)

    assert out.status == "proposed" and out.proposal is not None
    assert actuator.current() == Knobs() and not [c for c in actuator.calls if c[0].startswith("apply")]
    assert out.proposal.restarts == ("chunk_tokens",)
    assert g.in_flight is None and g.blocked() is None  # a proposal spends neither cooldown nor the cap
    assert g.apply(Knobs(router="session"), trial=1).status == "applied"
    assert actuator.current() == Knobs(router="session")
    assert registry.get_sample_value("tierpilot_tuner_proposals_total", {"workload": "ns/llm", "kind": "restart"}) == 1
    assert registry.get_sample_value("tierpilot_tuner_proposal_pending", {"workload": "ns/llm"}) == 1
    info = registry.get_sample_value("tierpilot_tuner_proposal_info", {
        "workload": "ns/llm", "id": out.proposal.id, "changes": "chunk_tokens=512,router=session", "restart": "true"})
    assert info == clock.now


def test_the_same_move_twice_is_one_proposal_and_all_applies_it() -> None:
    _clock, actuator, g, _reg = guard("hot")
    a = g.apply(Knobs(cpu_gib=8.0), trial=0).proposal
    b = g.apply(Knobs(cpu_gib=8.0), trial=1).proposal
    assert a is not None and b is not None and a.id == b.id and b.times == 2
    assert len(g.proposals.proposals()) == 1
    _clock, actuator, g, _reg = guard("all")
    assert g.apply(Knobs(cpu_gib=8.0), trial=0).status == "applied" and actuator.current() == Knobs(cpu_gib=8.0)


def test_none_proposes_everything_and_a_restarting_rollback_waits_under_hot() -> None:
    _clock, actuator, g, _reg = guard("none")
    assert g.apply(Knobs(router="session"), trial=0).status == "proposed"
    assert actuator.current() == Knobs()
    # someone else moved the chunk size; restoring the last good one would restart the engines
    _clock, actuator, g, _reg = guard("hot", initial=Knobs(chunk_tokens=512))
    actuator.mark_good(Knobs())
    assert g.rollback("regression") is None and g.reapply(Knobs(), "restart") is None
    assert actuator.current() == Knobs(chunk_tokens=512)
    assert [p.restarts for p in g.proposals.proposals()] == [("chunk_tokens",)]


def test_the_book_is_written_read_back_and_picked_by_prefix(tmp_path) -> None:
    path = tmp_path / "proposals.json"
    line = {"gain_per_hour_s": 120.0, "verdict": "apply", "line": "restart p95 +8.0% ... -> apply"}
    book = ProposalBook("hot", path=path, plan_line=lambda a, b: line if b.chunk_tokens == 512 else None)
    first = book.record(Knobs(), Knobs(chunk_tokens=512), "held", at=10.0)
    book.record(Knobs(), Knobs(cpu_gib=8.0), "held", at=20.0)
    doc = json.loads(path.read_text())
    assert doc["apply"] == "hot" and [p["changes"] for p in doc["proposals"]] == [
        {"chunk_tokens": [256, 512]}, {"cpu_gib": [5.0, 8.0]}]
    loaded = load_proposals(doc, source=str(path))
    assert pick(loaded, None, source="f").knobs == Knobs(cpu_gib=8.0)  # the newest
    chosen = pick(loaded, first.id[:6], source="f")
    assert chosen.plan == line and "plan: restart p95 +8.0%" in chosen.describe()
    with pytest.raises(ValueError, match="no proposal 'zzz'"):
        pick(loaded, "zzz", source="f")
    with pytest.raises(ValueError, match="not a proposals document"):
        load_proposals({"knobs": {}}, source="f")


# -- the whole runtime with the default live settings, then the CLI ------------------------------
@pytest.fixture
def kube(shared_dir):
    yield from serve(shared_dir)


def _kubeconfig(tmp_path, kube):
    path = tmp_path / "kubeconfig"
    path.write_text(yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config", "current-context": "emu",
        "clusters": [{"name": "emu", "cluster": {"server": kube.url}}],
        "users": [{"name": "u", "user": {"token": "t"}}],
        "contexts": [{"name": "emu", "context": {"cluster": "emu", "user": "u"}}]}))
    return path


@pytest.mark.timeout(90)
def test_default_runtime_restarts_nothing_and_the_proposal_is_applied_with_one_command(kube, tmp_path):
    from click.testing import CliRunner

    from agent.k8s.__main__ import main
    from tests.support.fake_targets import MetricsServer
    from tests.support.runtime_fakes import FakeVllm
    from tests.test_runtime_tuning import runtime_for, traffic, vllm_env

    kube.put(deployment("vllm-llama", env=[{"name": "LMCACHE_CHUNK_SIZE", "value": "256"}]))
    fake = FakeTime()
    proposals = tmp_path / "proposals.json"
    pod = FakeVllm()
    with MetricsServer() as srv:
        srv.route("/metrics", text=pod.text())
        vllm = (pod, srv)
        rt = runtime_for(kube, vllm, tmp_path, fake, tuner={
            "enabled": True, "storage": f"sqlite:///{tmp_path}/d.db", "sampler": "random", "seed": 7,
            "step_interval_s": 60, "limits": {"pods": 2, "node_memory_headroom_gib": 16},
            "guardrails": {"cooldown_s": 0, "max_changes_per_hour": 10},
            "live": {"settle_s": 0, "window_s": 10, "min_requests": 5}, "warm_start": {"trials": 0},
            "drift": {"enabled": False}, "planner": {"enabled": False}, "trials_per_phase": 3,
            "proposals_file": str(proposals)})  # no `apply`: the default
        assert rt.settings.tuner.apply == "hot" and rt.elector.try_acquire_or_renew() is True
        traffic(rt, vllm, fake, 2.5)
        states = [rt.tuning.step().state]
        traffic(rt, vllm, fake, 12.5)
        states += [rt.tuning.step().state for _ in range(4)]
        assert states == ["baseline", "baseline_done", "proposed", "proposed", "proposed"]
        assert vllm_env(kube) == {"LMCACHE_CHUNK_SIZE": "256"}  # the target owns only restart knobs: unchanged
        body = json.loads(rt.agent.routes["/proposals"]({})[0])
        assert body["apply"] == "hot" and body["proposals"]
        assert json.loads(proposals.read_text()) == body
        assert rt.agent.info()["tuner_proposals"] == {"apply": "hot", "pending": len(body["proposals"])}
        kinds = {s.labels["kind"]: s.value for fam in rt.proposals.collect() for s in fam.samples
                 if s.name == "tierpilot_tuner_proposals_total"}
        assert kinds == {"hot": 0, "restart": 3}

    newest = body["proposals"][-1]
    targets = tmp_path / "targets.yaml"  # written by runtime_for
    kubeconfig = _kubeconfig(tmp_path, kube)
    runner = CliRunner()

    def cli(*args: str):
        return runner.invoke(main, ["--kubeconfig", str(kubeconfig), "apply-proposal", str(targets), *args])

    out = cli("--file", str(proposals), "--diff")
    assert out.exit_code == 0 and "knob(s) would change" in out.stdout, out.output
    assert vllm_env(kube) == {"LMCACHE_CHUNK_SIZE": "256"}  # --diff changes nothing
    out = cli("--file", str(proposals), "--yes")
    assert out.exit_code == 0, out.output
    assert f"proposal {newest['id']}" in out.stdout and "knob(s) would change" in out.stdout
    want = Knobs.from_mapping(newest["knobs"])
    assert vllm_env(kube).get("LMCACHE_CHUNK_SIZE", "256") == str(want.chunk_tokens)
    assert want != Knobs.from_mapping(newest["current"])
    # a proposal made from a configuration the cluster no longer runs is refused, nothing written
    stale = tmp_path / "stale.json"
    ProposalBook("hot", path=stale).record(Knobs(chunk_tokens=2048), Knobs(chunk_tokens=64), "held", at=1.0)
    before = vllm_env(kube)
    out = cli("--file", str(stale), "--yes")
    assert out.exit_code == 1 and "the cluster has changed since" in out.output
    assert vllm_env(kube) == before


def test_check_prints_the_role_rules_for_an_apply_scope(tmp_path):
    from click.testing import CliRunner

    from agent.k8s.__main__ import main

    targets = tmp_path / "targets.yaml"
    targets.write_text(yaml.safe_dump({"namespace": "llm", "targets": [
        {"kind": "deployment-env", "name": "vllm", "container": "vllm"},
        {"kind": "router-configmap", "name": "router-dyn", "key": "dynamic_config.json",
         "restart": [{"kind": "Deployment", "name": "vllm-router"}]}]}))

    def patched(scope: str) -> set[str]:
        out = CliRunner().invoke(main, ["check", str(targets), "--apply", scope])
        assert out.exit_code == 0, out.output
        rules = yaml.safe_load(out.stdout[out.stdout.index("rules:"):])["rules"]
        return {n for r in rules if "patch" in r["verbs"] for n in r.get("resourceNames", ())}

    assert patched("all") == {"vllm", "router-dyn", "vllm-router"}
    assert patched("hot") == {"router-dyn", "vllm-router"}
    assert patched("none") == set()
