"""ConfigMap documents with a duplicated key the agent owns are refused, naming the key and the
lines: the components' real readers take the LAST occurrence (PyYAML's safe_load for LMCache,
json.load for the production-stack router), so reading or editing the first would tune a
configuration that never runs."""
from __future__ import annotations

import json
import tomllib

import pytest
import yaml

from agent.k8s import textconf
from contracts.actuator import PermanentActuationError
from contracts.knobs import Knobs
from tests.support.kube import NS, FakeTime, actuator_for, configmap, deployment, serve

LMCACHE = "chunk_size: 512\nlocal_cpu: true\nmax_local_cpu_size: 5.0\nchunk_size: 2048\n"
ROUTER = '{\n  "service_discovery": "k8s",\n  "routing_logic": "roundrobin",\n  "routing_logic": "session"\n}\n'


def test_the_real_readers_take_the_last_occurrence():
    assert yaml.safe_load(LMCACHE)["chunk_size"] == 2048  # LMCache: lmcache/v1/config_base.py _from_file
    assert json.loads(ROUTER)["routing_logic"] == "session"  # router: dynamic_config.py from_json
    with pytest.raises(tomllib.TOMLDecodeError):  # Curvine: duplicates are invalid TOML
        tomllib.loads("[worker]\nx = 1\nx = 2\n")


@pytest.mark.parametrize("call", [
    lambda: textconf.yaml_get(LMCACHE, "chunk_size"),
    lambda: textconf.yaml_set(LMCACHE, {"chunk_size": "256"}),
    lambda: textconf.yaml_set(LMCACHE, {"chunk_size": None}),
])
def test_yaml_duplicates_are_refused_naming_key_and_lines(call):
    with pytest.raises(textconf.ConfigTextError, match=r"YAML key 'chunk_size' appears 2 times \(lines 1, 4\)"):
        call()


def test_other_keys_of_a_document_with_duplicates_stay_editable():
    assert textconf.yaml_get(LMCACHE, "max_local_cpu_size") == "5.0"
    assert textconf.yaml_set(LMCACHE, {"max_local_cpu_size": "10.0"}) == LMCACHE.replace("5.0", "10.0")


@pytest.mark.parametrize("call", [
    lambda: textconf.json_get(ROUTER, "routing_logic"),
    lambda: textconf.json_set(ROUTER, {"routing_logic": '"session"'}),
])
def test_json_duplicates_are_refused_naming_key_and_lines(call):
    with pytest.raises(textconf.ConfigTextError, match=r"JSON key 'routing_logic' appears 2 times \(lines 3, 4\)"):
        call()


def test_toml_duplicates_across_a_reopened_section_are_refused():
    text = "[worker]\nevict_policy = \"lru\"\n[master]\na = 1\n[worker]\nevict_policy = \"lfu\"\n"
    with pytest.raises(textconf.ConfigTextError, match=r"'worker.evict_policy' appears 2 times \(lines 2, 6\)"):
        textconf.toml_get(text, "worker.evict_policy")


@pytest.fixture
def kube(shared_dir):
    yield from serve(shared_dir)


def test_the_actuator_refuses_and_changes_nothing(kube):
    kube.put(configmap("lmcache-config", {"lmcache.yaml": LMCACHE}))
    kube.put(deployment("vllm"))
    act = actuator_for(kube, [{"kind": "lmcache-configmap", "name": "lmcache-config", "key": "lmcache.yaml",
                               "restart": [{"kind": "Deployment", "name": "vllm"}]}], FakeTime())
    with pytest.raises(PermanentActuationError, match=r"'chunk_size' appears 2 times \(lines 1, 4\)"):
        act.current()
    with pytest.raises(PermanentActuationError, match="chunk_size"):
        act.apply(Knobs(chunk_tokens=256))
    assert kube.get("ConfigMap", NS, "lmcache-config")["data"]["lmcache.yaml"] == LMCACHE


def test_a_duplicated_env_var_is_refused(kube):
    env = [{"name": "LMCACHE_CHUNK_SIZE", "value": "256"}, {"name": "X", "value": "1"},
           {"name": "LMCACHE_CHUNK_SIZE", "value": "2048"}]
    kube.put(deployment("vllm", env=env))
    act = actuator_for(kube, [{"kind": "deployment-env", "name": "vllm", "container": "vllm"}], FakeTime())
    with pytest.raises(PermanentActuationError, match=r"env LMCACHE_CHUNK_SIZE appears 2 times \(entries 0, 2\)"):
        act.current()
    with pytest.raises(PermanentActuationError, match="LMCACHE_CHUNK_SIZE"):
        act.apply(Knobs(chunk_tokens=512))
    assert kube.get("Deployment", NS, "vllm")["spec"]["template"]["spec"]["containers"][0]["env"] == env
