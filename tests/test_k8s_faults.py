"""API faults against the actuator: every row of the issue's response table, the rollout timeout,
a watch disconnect and an operator revert. None of them may crash the agent."""
from __future__ import annotations

import time

import pytest

from agent.k8s.patches import CONFIG_HASH_ANNOTATION
from contracts.actuator import (
    PermanentActuationError,
    RetriableActuationError,
    RolloutTimeoutError,
    TargetGoneError,
)
from contracts.knobs import Knobs
from tests.support.kube import NS, FakeTime, Fault, actuator_for, deployment, serve

TUNED = Knobs(chunk_tokens=512, cpu_gib=10.0)
ENV_TARGET = [{"kind": "deployment-env", "name": "vllm", "container": "vllm"}]


@pytest.fixture
def kube(shared_dir):
    yield from serve(shared_dir)


def _env(server, name="vllm"):
    env = server.get("Deployment", NS, name)["spec"]["template"]["spec"]["containers"][0].get("env", [])
    return {e["name"]: e["value"] for e in env}


def _results(act, op="apply"):
    return {k[2]: v for k, v in act.metrics.snapshot()["results"].items() if k[1] == op}


def test_409_rereads_and_retries(kube):
    kube.put(deployment("vllm", env=[]))
    act = actuator_for(kube, ENV_TARGET, FakeTime())
    kube.inject(Fault("PATCH", "deployments", "vllm", status=409, reason="Conflict", message="modified"))
    assert act.apply(TUNED).applied
    assert _env(kube) == {"LMCACHE_CHUNK_SIZE": "512", "LMCACHE_MAX_LOCAL_CPU_SIZE": "10.0"}
    assert _results(act)["conflict_retried"] == 1


def test_failed_test_op_after_a_concurrent_edit_rereads_and_keeps_both_edits(kube):
    kube.put(deployment("vllm", env=[{"name": "LMCACHE_CHUNK_SIZE", "value": "256"}]))
    act = actuator_for(kube, ENV_TARGET, FakeTime())

    def someone_else(obj):  # another writer inserts an env var first: every env index shifts
        obj["spec"]["template"]["spec"]["containers"][0]["env"].insert(0, {"name": "HF_HOME", "value": "/cache"})

    kube.inject(Fault("PATCH", "deployments", "vllm", status=None, edit=someone_else))
    assert act.apply(TUNED).applied
    assert _env(kube) == {"HF_HOME": "/cache", "LMCACHE_CHUNK_SIZE": "512", "LMCACHE_MAX_LOCAL_CPU_SIZE": "10.0"}
    assert _results(act)["conflict_retried"] == 1
    first = kube.requests("PATCH", "deployments")[0]
    assert first["content_type"] == "application/json-patch+json"


def test_conflicts_are_retried_within_a_bound(kube):
    kube.put(deployment("vllm", env=[]))
    act = actuator_for(kube, ENV_TARGET, FakeTime(), conflict_retries=2)
    kube.inject(Fault("PATCH", "deployments", "vllm", status=409, reason="Conflict", times=100))
    with pytest.raises(RetriableActuationError, match="still conflicting after 2 re-reads"):
        act.apply(TUNED)
    assert len(kube.requests("PATCH", "deployments")) == 3
    assert _env(kube) == {}


def test_403_names_the_missing_rbac_verb_and_resource(kube):
    kube.put(deployment("vllm", env=[]))
    act = actuator_for(kube, ENV_TARGET, FakeTime())
    kube.inject(Fault("PATCH", "deployments", "vllm", status=403, reason="Forbidden",
                      message='deployments.apps "vllm" is forbidden: User "system:serviceaccount:llm:tierpilot" '
                              'cannot patch resource "deployments" in API group "apps"'))
    with pytest.raises(PermanentActuationError) as err:
        act.apply(TUNED)
    msg = str(err.value)
    assert "RBAC verb 'patch'" in msg and "resource 'deployments'" in msg and "apiGroup apps" in msg
    assert "named 'vllm'" in msg and "namespace 'llm'" in msg
    assert _results(act)["permanent_error"] == 1


def test_404_stops_tuning_that_target_only(kube):
    kube.put(deployment("vllm", env=[]))
    kube.put(deployment("vllm-b", env=[]))
    targets = [ENV_TARGET[0], {"kind": "deployment-env", "name": "vllm-b", "container": "vllm"}]
    act = actuator_for(kube, targets, FakeTime())
    kube.delete("Deployment", NS, "vllm-b")
    with pytest.raises(TargetGoneError, match="vllm-b"):
        act.apply(TUNED)
    assert act.gone == {"deployment-env/llm/vllm-b"}
    assert _env(kube) == {}  # validation failed before the first write: nothing half-applied
    assert act.apply(TUNED).applied  # the remaining target is still tuned
    assert _env(kube) == {"LMCACHE_CHUNK_SIZE": "512", "LMCACHE_MAX_LOCAL_CPU_SIZE": "10.0"}
    assert act.metrics.snapshot()["gone"] == {"deployment-env/llm/vllm-b"}


def test_5xx_backs_off_exponentially_then_recovers(kube):
    kube.put(deployment("vllm", env=[]))
    act = actuator_for(kube, ENV_TARGET, FakeTime(), backoff_base_s=2, backoff_max_s=5)
    kube.inject(Fault("PATCH", "deployments", "vllm", status=500, times=3))
    delays = []
    for _ in range(3):
        with pytest.raises(RetriableActuationError) as err:
            act.apply(TUNED)
        delays.append(err.value.delay_s)
    assert delays == [2.0, 4.0, 5.0]
    assert act.apply(TUNED).applied
    assert act.backoff.failures == 0


def test_partial_change_is_undone_when_a_later_target_fails(kube):
    kube.put(deployment("vllm", env=[]))
    kube.put(deployment("vllm-b", env=[]))
    targets = [ENV_TARGET[0], {"kind": "deployment-env", "name": "vllm-b", "container": "vllm"}]
    act = actuator_for(kube, targets, FakeTime())
    kube.inject(Fault("PATCH", "deployments", "vllm-b", status=500, times=1))
    with pytest.raises(RetriableActuationError):
        act.apply(TUNED)
    assert _env(kube, "vllm") == {} and _env(kube, "vllm-b") == {}


def test_rollout_timeout_rolls_back_to_last_good(kube):
    kube.put(deployment("vllm", env=[{"name": "LMCACHE_CHUNK_SIZE", "value": "256"}]))
    fake = FakeTime()
    act = actuator_for(kube, ENV_TARGET, fake)
    act.mark_good(act.current())
    good = kube.get("Deployment", NS, "vllm")
    kube.manual_rollout("Deployment", NS, "vllm")  # the new pods never become available

    rollbacks = []

    def controller_after_rollback(_t):  # the old ReplicaSet comes back once the template is restored
        live = kube.get("Deployment", NS, "vllm")
        if live["status"]["observedGeneration"] < live["metadata"]["generation"] and _env(kube) == {
                "LMCACHE_CHUNK_SIZE": "256"}:
            rollbacks.append(kube.complete_rollout("Deployment", NS, "vllm"))

    fake.on_sleep.append(controller_after_rollback)
    with pytest.raises(RolloutTimeoutError, match="rolled back to the last good configuration"):
        act.apply(TUNED)
    assert sum(fake.slept) >= 30  # waited the whole (fake) timeout
    assert kube.get("Deployment", NS, "vllm")["spec"]["template"] == good["spec"]["template"]
    assert rollbacks, "the rollback itself was waited for"
    assert _results(act)["rollout_timeout"] == 1
    assert _results(act, "rollback")["rolled_back"] == 1
    assert "TierpilotRolledBack" in [e["reason"] for e in kube.objects_of("Event")]


def test_rollout_waits_for_available_replicas(kube):
    kube.put(deployment("vllm", env=[]))
    fake = FakeTime()
    act = actuator_for(kube, ENV_TARGET, fake)
    kube.manual_rollout("Deployment", NS, "vllm")
    fake.on_sleep.append(lambda t: kube.complete_rollout("Deployment", NS, "vllm") if len(fake.slept) == 3 else None)
    assert act.apply(TUNED).applied
    assert fake.slept == [1, 1, 1]
    assert act.metrics.snapshot()["rollout_s"]["deployment-env/llm/vllm"] == 3


def test_watch_disconnect_backs_off_and_keeps_guarding(kube):
    kube.put(deployment("vllm", env=[]))
    fake = FakeTime()
    act = actuator_for(kube, ENV_TARGET, fake, watch_timeout_s=1)
    act.apply(TUNED)
    label = "deployment-env/llm/vllm"
    assert act.guard.tracked == {label: act.targets[0].ref}
    kube.inject(Fault("WATCH", "deployments", status=None, watch="error", message="watch dropped"),
                Fault("WATCH", "deployments", status=None, watch="error", message="watch dropped"))
    act.guard.watch_once(label)
    act.guard.watch_once(label)
    assert act.guard.delays == [1.0, 2.0] and fake.slept[-2:] == [1.0, 2.0]
    watches = kube.requests("WATCH", "deployments")
    assert {w["params"].get("fieldSelector") for w in watches} == {"metadata.name=vllm"}
    kube.inject(Fault("WATCH", "deployments", status=None, watch="close"))
    act.guard.watch_once(label)  # a clean close is not an error
    assert act.guard.delays == [1.0, 2.0]
    assert label in act.guard.tracked


def test_operator_revert_is_reapplied_with_a_bound(kube):
    kube.put(deployment("vllm", env=[]))
    fake = FakeTime()
    act = actuator_for(kube, ENV_TARGET, fake, watch_timeout_s=1, reapply_limit=2)
    act.apply(TUNED)
    label = "deployment-env/llm/vllm"

    def operator_rerender(obj):  # e.g. the HyperPod operator re-renders its child Deployment
        obj["spec"]["template"]["spec"]["containers"][0]["env"] = []

    act.guard.start()
    try:
        for n in (1, 2):
            kube.edit("Deployment", NS, "vllm", operator_rerender)
            deadline = time.monotonic() + 20
            while act.metrics.snapshot()["reapplied"].get(label, 0) < n and time.monotonic() < deadline:
                time.sleep(0.05)
            assert act.metrics.snapshot()["reapplied"][label] == n
            assert _env(kube) == {"LMCACHE_CHUNK_SIZE": "512", "LMCACHE_MAX_LOCAL_CPU_SIZE": "10.0"}
        kube.edit("Deployment", NS, "vllm", operator_rerender)  # a third revert within the window
        deadline = time.monotonic() + 20
        while label in act.guard.tracked and time.monotonic() < deadline:
            time.sleep(0.05)
    finally:
        act.guard.stop()
    assert label not in act.guard.tracked
    assert _env(kube) == {}  # the operator owns it now; we stopped fighting
    assert act.metrics.snapshot()["reapplied"][label] == 2
    reasons = [e["reason"] for e in kube.objects_of("Event")]
    assert reasons.count("TierpilotReapplied") == 2 and reasons.count("TierpilotReapplyGaveUp") == 1


def test_restart_annotation_reverted_is_reapplied_via_the_configmap_target(kube):
    from tests.support.kube import configmap

    kube.put(configmap("lmcache", {"lmcache.yaml": "chunk_size: 256\n"}))
    kube.put(deployment("vllm"))
    fake = FakeTime()
    act = actuator_for(kube, [{"kind": "lmcache-configmap", "name": "lmcache", "key": "lmcache.yaml",
                               "restart": [{"name": "vllm"}]}], fake)
    act.apply(TUNED)
    label = "lmcache-configmap/llm/lmcache"
    kube.edit("ConfigMap", NS, "lmcache", lambda o: o["data"].update({"lmcache.yaml": "chunk_size: 256\n"}))
    assert act.guard.handle(label, kube.get("ConfigMap", NS, "lmcache")) == "reapplied"
    assert kube.get("ConfigMap", NS, "lmcache")["data"]["lmcache.yaml"].startswith("chunk_size: 512\n")
    annotations = kube.get("Deployment", NS, "vllm")["spec"]["template"]["metadata"]["annotations"]
    assert CONFIG_HASH_ANNOTATION in annotations
