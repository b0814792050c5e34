"""`envFrom` is read when the agent decides whether a config-file change would reach the pods:
LMCache applies LMCACHE_<KEY> variables after its config file, and a variable a container takes
from a ConfigMap through `envFrom` (with its `prefix`) defeats the file as surely as one set in
`env`. The `lmcache-configmap` target refuses such a change, naming the object and the variable; a
Secret is known by its key names (its values are never read); a source the agent cannot read fails
closed. A `deployment-env` target reads its variables as the kubelet composes them (envFrom, env,
valueFrom), and refuses, with the reason, a value it cannot know."""
from __future__ import annotations

import pytest

from contracts.actuator import PermanentActuationError
from tests.support.kube import NS, FakeTime, Fault, actuator_for, configmap, deployment, secret, serve

TEXT = "chunk_size: 256\nmax_local_cpu_size: 5.0\n"
TARGET = [{"kind": "lmcache-configmap", "name": "lmcache-config", "key": "lmcache.yaml",
           "restart": [{"kind": "Deployment", "name": "vllm"}]}]


@pytest.fixture
def kube(shared_dir):
    yield from serve(shared_dir)


def _vllm(env_from):
    dep = deployment("vllm", env=[{"name": "LMCACHE_CONFIG_FILE", "value": "/etc/lmcache/lmcache.yaml"}])
    dep["spec"]["template"]["spec"]["containers"][0]["envFrom"] = env_from
    return dep


def _unchanged(kube) -> None:
    assert kube.get("ConfigMap", NS, "lmcache-config")["data"]["lmcache.yaml"] == TEXT
    assert kube.get("Deployment", NS, "vllm")["metadata"]["generation"] == 1  # nothing rolled


def test_a_variable_from_an_envfrom_configmap_is_seen(kube):
    kube.put(configmap("lmcache-config", {"lmcache.yaml": TEXT}))
    kube.put(configmap("lmcache-env", {"LMCACHE_MAX_LOCAL_CPU_SIZE": "40"}))
    kube.put(_vllm([{"configMapRef": {"name": "lmcache-env"}}]))
    act = actuator_for(kube, TARGET, FakeTime())
    live = act.current()
    with pytest.raises(PermanentActuationError,
                       match=r"cpu_gib \(max_local_cpu_size\): container vllm of Deployment llm/vllm takes "
                             r"LMCACHE_MAX_LOCAL_CPU_SIZE from ConfigMap llm/lmcache-env \(envFrom\)"):
        act.apply(live.replace(cpu_gib=8.0))
    _unchanged(kube)
    act.apply(live.replace(chunk_tokens=512))  # a key no source overrides goes through
    assert "chunk_size: 512" in kube.get("ConfigMap", NS, "lmcache-config")["data"]["lmcache.yaml"]


def test_the_prefix_makes_the_variable(kube):
    kube.put(configmap("lmcache-config", {"lmcache.yaml": TEXT}))
    kube.put(configmap("plain", {"CHUNK_SIZE": "512", "MAX_LOCAL_CPU_SIZE": "40"}))
    kube.put(_vllm([{"configMapRef": {"name": "plain"}, "prefix": "LMCACHE_"}]))
    act = actuator_for(kube, TARGET, FakeTime())
    with pytest.raises(PermanentActuationError, match=r"takes LMCACHE_CHUNK_SIZE from ConfigMap llm/plain"):
        act.apply(act.current().replace(chunk_tokens=1024))
    _unchanged(kube)
    # without the prefix the same keys make other variables: nothing overrides the file
    kube.put(_vllm([{"configMapRef": {"name": "plain"}}]))
    act.apply(act.current().replace(chunk_tokens=1024))
    assert "chunk_size: 1024" in kube.get("ConfigMap", NS, "lmcache-config")["data"]["lmcache.yaml"]


def test_an_absent_or_unreadable_source_fails_closed(kube):
    kube.put(configmap("lmcache-config", {"lmcache.yaml": TEXT}))
    kube.put(_vllm([{"secretRef": {"name": "lmcache-secrets"}, "prefix": "LMCACHE_"}]))
    act = actuator_for(kube, TARGET, FakeTime())
    with pytest.raises(PermanentActuationError, match=r"container vllm of Deployment llm/vllm may take "
                                                      r"LMCACHE_CHUNK_SIZE from Secret llm/lmcache-secrets"):
        act.apply(act.current().replace(chunk_tokens=1024))
    _unchanged(kube)
    # an optional ConfigMap that does not exist provides nothing; a required one that cannot be read fails closed
    kube.put(_vllm([{"configMapRef": {"name": "absent", "optional": True}}]))
    act.apply(act.current().replace(chunk_tokens=1024))
    kube.put(_vllm([{"configMapRef": {"name": "absent"}}]))
    with pytest.raises(PermanentActuationError, match=r"may take LMCACHE_CHUNK_SIZE from ConfigMap llm/absent"):
        act.apply(act.current().replace(chunk_tokens=2048))


# -- a deployment-env target reads what its pods run ------------------------------------------------
ENV_TARGET = [{"kind": "deployment-env", "name": "vllm", "container": "vllm"}]


def _env(kube) -> dict[str, str]:
    c = kube.get("Deployment", NS, "vllm")["spec"]["template"]["spec"]["containers"][0]
    return {e["name"]: e["value"] for e in c.get("env") or []}


def test_deployment_env_reads_envfrom_with_kubernetes_precedence(kube):
    kube.put(configmap("first", {"LMCACHE_MAX_LOCAL_CPU_SIZE": "20", "LMCACHE_CHUNK_SIZE": "512"}))
    kube.put(configmap("second", {"MAX_LOCAL_CPU_SIZE": "40"}))
    dep = deployment("vllm", env=[{"name": "LMCACHE_CHUNK_SIZE", "value": "256"}])
    dep["spec"]["template"]["spec"]["containers"][0]["envFrom"] = [
        {"configMapRef": {"name": "first"}}, {"configMapRef": {"name": "second"}, "prefix": "LMCACHE_"}]
    kube.put(dep)
    act = actuator_for(kube, ENV_TARGET, FakeTime())
    live = act.current()
    # the later source overrides the earlier one; `env` overrides both
    assert (live.cpu_gib, live.chunk_tokens) == (40.0, 256)
    assert not act.apply(live).applied and _env(kube) == {"LMCACHE_CHUNK_SIZE": "256"}  # 40 runs: no-op
    act.apply(live.replace(cpu_gib=8.0))  # an env entry overrides envFrom
    assert _env(kube)["LMCACHE_MAX_LOCAL_CPU_SIZE"] == "8.0" and act.current().cpu_gib == 8.0
    act.apply(live)  # back: what runs is 40 again, and that is what is reported
    assert act.current().cpu_gib == 40.0


def test_an_envfrom_secret_is_known_by_its_key_names_only(kube):
    dep = deployment("vllm", env=[{"name": "LMCACHE_CHUNK_SIZE", "value": "256"}])
    dep["spec"]["template"]["spec"]["containers"][0]["envFrom"] = [{"secretRef": {"name": "lm"}}]
    kube.put(dep)
    act = actuator_for(kube, ENV_TARGET, FakeTime())
    # a Secret without a managed key changes nothing the agent manages
    kube.put(secret("lm", {"HF_TOKEN": "hf_s3cr3t"}))
    assert act.current().cpu_gib == 5.0
    # one with the key: the variable is set, and its value is never read nor guessed
    kube.put(secret("lm", {"HF_TOKEN": "hf_s3cr3t", "LMCACHE_MAX_LOCAL_CPU_SIZE": "40"}))
    with pytest.raises(PermanentActuationError, match=r"LMCACHE_MAX_LOCAL_CPU_SIZE comes from Secret llm/lm "
                                                      r"\(envFrom\) and the agent cannot know its value: the agent "
                                                      r"reads only the key names of a Secret in envFrom"):
        act.current()
    # a Secret the agent may not read, or one that is absent, may set it: refused, with the reason
    kube.inject(Fault("GET", "secrets", "lm", status=403, reason="Forbidden", message="forbidden", times=1))
    with pytest.raises(PermanentActuationError, match=r"LMCACHE_MAX_LOCAL_CPU_SIZE may come from Secret llm/lm "
                                                      r"\(envFrom\) .*: the agent may not read it \(list it in "
                                                      r"the target's env_sources\)"):
        act.current()
    kube.delete("Secret", NS, "lm")
    with pytest.raises(PermanentActuationError, match=r"may come from Secret llm/lm \(envFrom\) .*it does not exist"):
        act.current()


def test_an_envfrom_secret_keeps_no_value_in_memory():
    from agent.k8s.api import ObjectRef
    from agent.k8s.envsources import read_source

    def read(ref: ObjectRef) -> dict:
        return secret(ref.name, {"HF_TOKEN": "hf_s3cr3t", "LMCACHE_CHUNK_SIZE": "512"})

    src = read_source(read, "Secret", NS, "lm")
    assert src.keys == {"HF_TOKEN", "LMCACHE_CHUNK_SIZE"} and dict(src.values) == {}
    assert "hf_s3cr3t" not in repr(src)
    # a key a managed variable's secretKeyRef names is the one value kept
    assert dict(read_source(read, "Secret", NS, "lm", ["LMCACHE_CHUNK_SIZE"]).values) == {"LMCACHE_CHUNK_SIZE": "512"}


def test_an_lmcache_file_change_sees_secret_key_names(kube):
    kube.put(configmap("lmcache-config", {"lmcache.yaml": TEXT}))
    kube.put(secret("lmcache-secrets", {"CHUNK_SIZE": "512", "REMOTE_AUTH": "t0k"}))
    kube.put(_vllm([{"secretRef": {"name": "lmcache-secrets"}, "prefix": "LMCACHE_"}]))
    act = actuator_for(kube, TARGET, FakeTime())
    # the Secret sets LMCACHE_CHUNK_SIZE, whose value the agent does not read: what runs is unknown
    with pytest.raises(PermanentActuationError, match=r"cannot tell what runs for chunk_tokens \(chunk_size\): container "
                                                      r"vllm of Deployment llm/vllm takes LMCACHE_CHUNK_SIZE from Secret "
                                                      r"llm/lmcache-secrets \(envFrom\), and the agent cannot know its "
                                                      r"value: .*leave chunk_tokens out of this target's knobs"):
        act.current()
    # a target that owns only knobs none of its keys overrides tunes them
    act = actuator_for(kube, [{**TARGET[0], "knobs": ["cpu_gib", "cpu_eviction"]}], FakeTime())
    act.apply(act.current().replace(cpu_gib=8.0))
    assert "max_local_cpu_size: 8.0" in kube.get("ConfigMap", NS, "lmcache-config")["data"]["lmcache.yaml"]


def test_an_lmcache_file_overridden_by_a_variable_reports_the_variable(kube):
    """LMCache runs LMCACHE_<KEY> over the file: current() reports it, an apply of what runs
    writes nothing, mark_good and rollback leave the file as it was."""
    kube.put(configmap("lmcache-config", {"lmcache.yaml": TEXT}))
    kube.put(configmap("lmcache-env", {"LMCACHE_MAX_LOCAL_CPU_SIZE": "40"}))
    kube.put(_vllm([{"configMapRef": {"name": "lmcache-env"}}]))
    act = actuator_for(kube, TARGET, FakeTime())
    live = act.current()
    assert (live.cpu_gib, live.chunk_tokens) == (40.0, 256)
    assert not act.apply(live).applied
    act.mark_good(live)
    act.apply(live.replace(chunk_tokens=512))
    assert act.current() == live.replace(chunk_tokens=512)
    act.rollback()
    assert kube.get("ConfigMap", NS, "lmcache-config")["data"]["lmcache.yaml"] == TEXT and act.current() == live
    label = "lmcache-configmap/llm/lmcache-config"
    assert act.guard.handle(label, kube.get("ConfigMap", NS, "lmcache-config")) == "ok"  # no false drift


def test_restart_workloads_that_run_different_values_are_reported(kube):
    kube.put(configmap("lmcache-config", {"lmcache.yaml": TEXT}))
    kube.put(_vllm([]))
    b = deployment("vllm-b", env=[{"name": "LMCACHE_MAX_LOCAL_CPU_SIZE", "value": "40"}])
    kube.put(b)
    act = actuator_for(kube, [{**TARGET[0], "restart": [{"name": "vllm"}, {"name": "vllm-b"}]}], FakeTime())
    with pytest.raises(PermanentActuationError, match=r"the restart workloads run different max_local_cpu_size: "
                                                      r"Deployment llm/vllm the file's, Deployment llm/vllm-b "
                                                      r"LMCACHE_MAX_LOCAL_CPU_SIZE=40"):
        act.current()


# -- env[].valueFrom -------------------------------------------------------------------------------

def _vllm_env(env, env_from=None):
    dep = deployment("vllm", env=env)
    if env_from:
        dep["spec"]["template"]["spec"]["containers"][0]["envFrom"] = env_from
    return dep


def test_value_from_a_configmap_key_is_what_runs(kube):
    kube.put(configmap("tuning", {"cpu": "40"}))
    kube.put(_vllm_env([{"name": "LMCACHE_MAX_LOCAL_CPU_SIZE", "valueFrom": {"configMapKeyRef": {
        "name": "tuning", "key": "cpu"}}}, {"name": "LMCACHE_CHUNK_SIZE", "value": "256"}]))
    act = actuator_for(kube, ENV_TARGET, FakeTime())
    live = act.current()
    assert live.cpu_gib == 40.0
    assert not act.apply(live).applied  # what runs: a no-op
    with pytest.raises(PermanentActuationError, match=r"cannot change LMCACHE_MAX_LOCAL_CPU_SIZE: it is set from "
                                                      r"ConfigMap llm/tuning key cpu \(valueFrom\); the agent edits "
                                                      r"literal values only"):
        act.apply(live.replace(cpu_gib=8.0))
    assert kube.get("Deployment", NS, "vllm")["metadata"]["generation"] == 1
    act.mark_good(live)
    act.apply(live.replace(chunk_tokens=512))
    assert act.current() == live.replace(chunk_tokens=512)
    act.rollback()
    assert act.current() == live
    kube.edit("ConfigMap", NS, "tuning", lambda cm: cm["data"].update(cpu="20"))  # edited by a person
    assert act.current().cpu_gib == 20.0


def test_value_from_a_secret_key_is_read_only_when_permitted(kube):
    kube.put(secret("tuning", {"cpu": "40", "other": "x"}))
    kube.put(_vllm_env([{"name": "LMCACHE_MAX_LOCAL_CPU_SIZE", "valueFrom": {"secretKeyRef": {
        "name": "tuning", "key": "cpu"}}}]))
    act = actuator_for(kube, ENV_TARGET, FakeTime())
    assert act.current().cpu_gib == 40.0
    kube.inject(Fault("GET", "secrets", "tuning", status=403, reason="Forbidden", message="forbidden", times=1))
    with pytest.raises(PermanentActuationError, match=r"LMCACHE_MAX_LOCAL_CPU_SIZE comes from Secret llm/tuning key "
                                                      r"cpu \(valueFrom\) and the agent cannot know its value: the "
                                                      r"agent may not read it"):
        act.current()


def test_value_from_an_optional_absent_key_leaves_the_earlier_source(kube):
    kube.put(configmap("first", {"LMCACHE_MAX_LOCAL_CPU_SIZE": "20"}))
    kube.put(configmap("tuning", {}))
    kube.put(_vllm_env([{"name": "LMCACHE_MAX_LOCAL_CPU_SIZE", "valueFrom": {"configMapKeyRef": {
        "name": "tuning", "key": "cpu", "optional": True}}}], [{"configMapRef": {"name": "first"}}]))
    act = actuator_for(kube, ENV_TARGET, FakeTime())
    assert act.current().cpu_gib == 20.0
    kube.edit("ConfigMap", NS, "tuning", lambda cm: cm.update(data={"cpu": "30"}))
    assert act.current().cpu_gib == 30.0


@pytest.mark.parametrize("entry, why", [
    ({"valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}}, r"the kubelet fills it in when the container starts"),
    ({"value": "$(CPU)"}, r"its value uses \$\(VAR\) expansion"),
    ({"valueFrom": {"configMapKeyRef": {"name": "absent", "key": "cpu"}}}, r"it does not exist and is not optional"),
])
def test_a_value_the_agent_cannot_know_is_refused(kube, entry, why):
    kube.put(_vllm_env([{"name": "CPU", "value": "40"}, {"name": "LMCACHE_MAX_LOCAL_CPU_SIZE", **entry}]))
    act = actuator_for(kube, ENV_TARGET, FakeTime())
    with pytest.raises(PermanentActuationError, match=r"LMCACHE_MAX_LOCAL_CPU_SIZE comes from .*" + why):
        act.current()


def test_the_reapply_guard_reads_envfrom_as_what_runs(kube):
    """A watched Deployment whose variable comes from envFrom has not drifted: nothing re-applied."""
    kube.put(configmap("first", {"LMCACHE_MAX_LOCAL_CPU_SIZE": "40"}))
    kube.put(_vllm_env([{"name": "LMCACHE_CHUNK_SIZE", "value": "256"}], [{"configMapRef": {"name": "first"}}]))
    act = actuator_for(kube, ENV_TARGET, FakeTime())
    live = act.current()
    act.apply(live.replace(chunk_tokens=512))
    label = "deployment-env/llm/vllm"
    assert act.guard.handle(label, kube.get("Deployment", NS, "vllm")) == "ok"
    kube.edit("ConfigMap", NS, "first", lambda cm: cm["data"].update(LMCACHE_MAX_LOCAL_CPU_SIZE="20"))
    kube.edit("Deployment", NS, "vllm", lambda d: d["spec"]["template"]["spec"]["containers"][0].update(
        env=[{"name": "LMCACHE_CHUNK_SIZE", "value": "256"}]))  # a person reverts both
    assert act.guard.handle(label, kube.get("Deployment", NS, "vllm")) == "reapplied"
    assert _env(kube) == {"LMCACHE_CHUNK_SIZE": "512", "LMCACHE_MAX_LOCAL_CPU_SIZE": "40.0"}
    assert act.current() == live.replace(chunk_tokens=512)
