"""Actuation per deployment mode, end to end on the kmock emulator with the real `kubernetes`
client: production-stack's kvaware needs a restart, vllm-project/router and the LMCache MP server
are configured by command-line flags, vLLM native offload by --kv-offloading-size."""
from __future__ import annotations

import pytest

from agent.k8s.patches import CONFIG_HASH_ANNOTATION
from contracts.actuator import PermanentActuationError
from contracts.knobs import DEFAULT_KNOBS, Knobs
from tests.support.kube import NS, FakeTime, actuator_for, configmap, deployment, serve


@pytest.fixture
def kube(shared_dir):
    yield from serve(shared_dir)


def _args(obj):
    return obj["spec"]["template"]["spec"]["containers"][0].get("args")


def _with_args(name: str, args: list[str], container: str = "vllm"):
    obj = deployment(name, container=container)
    obj["spec"]["template"]["spec"]["containers"][0]["args"] = list(args)
    return obj


def _hash(obj):
    return (obj["spec"]["template"]["metadata"].get("annotations") or {}).get(CONFIG_HASH_ANNOTATION)


ROUTER_CM = '{\n  "service_discovery": "k8s",\n  "routing_logic": "roundrobin"\n}\n'


def test_production_stack_kvaware_is_not_hot_reloaded_without_a_router_to_restart(kube):
    kube.put(configmap("router-dyn", {"dynamic_config.json": ROUTER_CM}))
    act = actuator_for(kube, [{"kind": "router-configmap", "name": "router-dyn", "key": "dynamic_config.json"}],
                       FakeTime())
    with pytest.raises(PermanentActuationError, match="routing_logic.py.*name the router Deployment"):
        act.apply(DEFAULT_KNOBS.replace(router="kvaware"))
    assert kube.get("ConfigMap", NS, "router-dyn")["data"]["dynamic_config.json"] == ROUTER_CM  # untouched
    assert act.apply(DEFAULT_KNOBS.replace(router="prefixaware")).restarted == ()  # still hot-reloaded


def test_production_stack_kvaware_switch_restarts_the_router_and_back(kube):
    kube.put(configmap("router-dyn", {"dynamic_config.json": ROUTER_CM}))
    kube.put(deployment("vllm-router", container="router"))
    act = actuator_for(kube, [{"kind": "router-configmap", "name": "router-dyn", "key": "dynamic_config.json",
                               "restart": [{"kind": "Deployment", "name": "vllm-router"}]}], FakeTime())
    # roundrobin -> prefixaware: hot reload, the router keeps running
    assert act.apply(DEFAULT_KNOBS.replace(router="prefixaware")).restarted == ()
    assert _hash(kube.get("Deployment", NS, "vllm-router")) is None
    # -> kvaware: the router Deployment rolls (a fresh process reads the file at start)
    result = act.apply(DEFAULT_KNOBS.replace(router="kvaware"))
    assert result.restarted == ("deployment/llm/vllm-router",) or result.restarted[0].startswith("pod/llm/")
    first = _hash(kube.get("Deployment", NS, "vllm-router"))
    assert first is not None and '"routing_logic": "kvaware"' in kube.get(
        "ConfigMap", NS, "router-dyn")["data"]["dynamic_config.json"]
    # kvaware -> session (leaving kvaware): rolls again
    act2 = actuator_for(kube, [{"kind": "router-configmap", "name": "router-dyn", "key": "dynamic_config.json",
                                "session_key": "x-user-id",
                                "restart": [{"kind": "Deployment", "name": "vllm-router"}]}], FakeTime())
    act2.apply(DEFAULT_KNOBS.replace(router="session"))
    second = _hash(kube.get("Deployment", NS, "vllm-router"))
    assert second not in (None, first)


def test_vllm_router_policy_and_kv_aware_knobs_are_flags_and_roll_the_router(kube):
    args = ["--host", "0.0.0.0", "--port", "30000", "--worker-urls", "http://a:8000", "http://b:8000",
            "--policy", "cache_aware", "--kv-penalty-host=0.8"]
    kube.put(_with_args("vllm-router", args, container="router"))
    act = actuator_for(kube, [{"kind": "vllm-router-args", "name": "vllm-router", "container": "router"}],
                       FakeTime(), fixed_knobs={})
    live = act.current()
    assert (live.router, live.router_temperature, live.kv_penalty_host, live.kv_penalty_external) == (
        "cache_aware", 0.0, 0.8, 0.6)
    act.mark_good(live)
    act.apply(live.replace(router="kvaware", router_temperature=0.5, kv_penalty_host=0.9))
    obj = kube.get("Deployment", NS, "vllm-router")
    assert _args(obj) == ["--host", "0.0.0.0", "--port", "30000", "--worker-urls", "http://a:8000",
                          "http://b:8000", "--policy", "kv_aware", "--kv-penalty-host=0.9",
                          "--router-temperature", "0.5"]
    assert obj["metadata"]["generation"] == 2  # the pod template changed: the router rolls
    with pytest.raises(PermanentActuationError, match="router='session' cannot be expressed as --policy"):
        act.apply(live.replace(router="session"))
    act.rollback()
    assert _args(kube.get("Deployment", NS, "vllm-router")) == args


def test_lmcache_mp_server_flags_take_its_own_eviction_policies(kube):
    args = ["--host", "0.0.0.0", "--chunk-size", "256", "--l1-size-gb", "20", "--eviction-policy", "LRU"]
    kube.put(_with_args("lmcache-mp", args, container="lmcache"))
    act = actuator_for(kube, [{"kind": "lmcache-mp-args", "name": "lmcache-mp", "container": "lmcache"}],
                       FakeTime())
    live = act.current()
    assert (live.chunk_tokens, live.cpu_gib, live.cpu_eviction) == (256, 20.0, "lru")
    act.apply(live.replace(chunk_tokens=512, cpu_gib=30.0, cpu_eviction="arc"))
    assert _args(kube.get("Deployment", NS, "lmcache-mp")) == [
        "--host", "0.0.0.0", "--chunk-size", "512", "--l1-size-gb", "30.0", "--eviction-policy", "ARC"]
    for bad in ("lfu", "fifo"):
        with pytest.raises(PermanentActuationError, match=f"cpu_eviction='{bad}' cannot be expressed as "
                                                          "--eviction-policy; supported: lru, arc, isolated_lru, noop"):
            act.apply(live.replace(cpu_eviction=bad))
    act.apply(live.replace(cpu_eviction="isolated_lru"))
    assert _args(kube.get("Deployment", NS, "lmcache-mp"))[-1] == "IsolatedLRU"


def test_vllm_native_offload_size_is_a_vllm_flag(kube):
    kube.put(_with_args("vllm", ["--model", "Qwen/Qwen3-8B"]))
    act = actuator_for(kube, [{"kind": "vllm-offload-args", "name": "vllm"}], FakeTime())
    assert act.current().cpu_gib == 0.0  # absent: no offload tier
    act.apply(act.current().replace(cpu_gib=16.0))
    assert _args(kube.get("Deployment", NS, "vllm")) == ["--model", "Qwen/Qwen3-8B", "--kv-offloading-size", "16.0"]
    assert act.tunable_knobs() == frozenset({"cpu_gib"})
    with pytest.raises(PermanentActuationError, match="no configured target actuates cpu_eviction"):
        act.apply(act.current().replace(cpu_eviction="lfu"))


def test_a_flag_in_command_or_given_twice_is_refused(kube):
    obj = _with_args("lmcache-mp", ["--chunk-size", "256", "--chunk-size=512"], container="lmcache")
    kube.put(obj)
    act = actuator_for(kube, [{"kind": "lmcache-mp-args", "name": "lmcache-mp", "container": "lmcache"}],
                       FakeTime())
    with pytest.raises(PermanentActuationError, match="--chunk-size is given twice"):
        act.current()
    obj = _with_args("lmcache-mp", [], container="lmcache")
    obj["spec"]["template"]["spec"]["containers"][0]["command"] = ["lmcache_server", "--chunk-size", "256"]
    kube.put(obj)
    with pytest.raises(PermanentActuationError, match="set in `command`"):
        act.current()


def test_knob_values_are_validated():
    with pytest.raises(ValueError, match="kv_penalty_host: must be a number in 0..1"):
        Knobs(kv_penalty_host=1.5)
    with pytest.raises(ValueError, match="router_temperature: must be a number >= 0"):
        Knobs(router_temperature=-1.0)
    assert Knobs.from_mapping({"router": "power_of_two", "kv_penalty_external": 1}).kv_penalty_external == 1.0


LMCACHE_DISK = ("chunk_size: 256\nlocal_cpu: true\nmax_local_cpu_size: 5.0\ncache_policy: LRU\n"
                "local_disk: file:///mnt/curvine/lmcache\nmax_local_disk_size: 200\n")


def test_cache_policy_is_one_knob_for_cpu_and_an_lmcache_disk_l2(kube):
    kube.put(configmap("lmcache-config", {"lmcache.yaml": LMCACHE_DISK}))
    kube.put(deployment("vllm"))
    act = actuator_for(kube, [{"kind": "lmcache-configmap", "name": "lmcache-config", "key": "lmcache.yaml",
                               "restart": [{"kind": "Deployment", "name": "vllm"}]}], FakeTime())
    assert act.coupled_knobs() == {"l2_eviction": "cpu_eviction"}
    assert "l2_eviction" in act.tunable_knobs()
    live = act.current()
    assert (live.cpu_eviction, live.l2_eviction) == ("lru", "lru")
    with pytest.raises(PermanentActuationError, match="cpu_eviction='lfu' and l2_eviction='lru' are one setting"):
        act.apply(live.replace(cpu_eviction="lfu"))
    assert kube.get("ConfigMap", NS, "lmcache-config")["data"]["lmcache.yaml"] == LMCACHE_DISK
    act.apply(live.replace(cpu_eviction="lfu", l2_eviction="lfu"))
    assert "cache_policy: LFU\n" in kube.get("ConfigMap", NS, "lmcache-config")["data"]["lmcache.yaml"]
    assert act.current().l2_eviction == "lfu"
    # without a local-disk backend the two are independent (l2_eviction is not LMCache's)
    kube.put(configmap("lmcache-config", {"lmcache.yaml": LMCACHE_DISK.replace(
        "local_disk: file:///mnt/curvine/lmcache", "local_disk: null")}))
    assert act.coupled_knobs() == {} and "l2_eviction" not in act.tunable_knobs()


def test_a_configmap_patch_an_lmcache_env_var_would_override_is_refused(kube):
    text = "chunk_size: 256\nmax_local_cpu_size: 5.0\n"
    kube.put(configmap("lmcache-config", {"lmcache.yaml": text}))
    kube.put(deployment("vllm", env=[{"name": "LMCACHE_CONFIG_FILE", "value": "/etc/lmcache/lmcache.yaml"},
                                     {"name": "LMCACHE_CHUNK_SIZE", "value": "256"}]))
    act = actuator_for(kube, [{"kind": "lmcache-configmap", "name": "lmcache-config", "key": "lmcache.yaml",
                               "restart": [{"kind": "Deployment", "name": "vllm"}]}], FakeTime())
    live = act.current()
    with pytest.raises(PermanentActuationError,
                       match=r"chunk_tokens \(chunk_size\): container vllm of Deployment llm/vllm sets "
                             r"LMCACHE_CHUNK_SIZE, which overrides the config file"):
        act.apply(live.replace(chunk_tokens=512))
    assert kube.get("ConfigMap", NS, "lmcache-config")["data"]["lmcache.yaml"] == text
    assert kube.get("Deployment", NS, "vllm")["metadata"]["generation"] == 1  # nothing rolled
    act.apply(live.replace(cpu_gib=8.0))  # a key no env var overrides goes through
    assert "max_local_cpu_size: 8.0" in kube.get("ConfigMap", NS, "lmcache-config")["data"]["lmcache.yaml"]


def test_accepted_values_follow_the_deployment_mode(kube):
    kube.put(_with_args("lmcache-mp", ["--eviction-policy", "LRU"], container="lmcache"))
    kube.put(_with_args("vllm-router", ["--policy", "round_robin"], container="router"))
    act = actuator_for(kube, [{"kind": "lmcache-mp-args", "name": "lmcache-mp", "container": "lmcache"},
                              {"kind": "vllm-router-args", "name": "vllm-router", "container": "router"}],
                       FakeTime())
    accepted = act.accepted_values()
    assert accepted["cpu_eviction"] == ("lru", "arc", "isolated_lru", "noop")
    assert accepted["router"] == ("roundrobin", "kvaware", "random", "cache_aware", "power_of_two", "consistent_hash")
