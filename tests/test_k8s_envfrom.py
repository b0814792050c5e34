"""`envFrom` is read when the agent decides whether a config-file change would reach the pods:
LMCache applies LMCACHE_<KEY> variables after its config file, and a variable a container takes
from a ConfigMap through `envFrom` (with its `prefix`) defeats the file as surely as one set in
`env`. The `lmcache-configmap` target refuses such a change, naming the object and the variable; a
Secret source (whose keys the agent does not read) or an unreadable ConfigMap fails closed."""
from __future__ import annotations

import pytest

from contracts.actuator import PermanentActuationError
from tests.support.kube import NS, FakeTime, actuator_for, configmap, deployment, serve

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


def test_a_secret_source_or_a_missing_configmap_fails_closed(kube):
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


def test_deployment_env_refuses_to_guess_a_secret(kube):
    dep = deployment("vllm", env=[{"name": "LMCACHE_CHUNK_SIZE", "value": "256"}])
    dep["spec"]["template"]["spec"]["containers"][0]["envFrom"] = [{"secretRef": {"name": "lm"}}]
    kube.put(dep)
    act = actuator_for(kube, ENV_TARGET, FakeTime())
    with pytest.raises(PermanentActuationError, match=r"LMCACHE_MAX_LOCAL_CPU_SIZE may come from Secret llm/lm "
                                                      r"\(envFrom\), whose value the agent does not read"):
        act.current()
