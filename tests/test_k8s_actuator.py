"""The Kubernetes actuator end to end: the real `kubernetes` client against the kmock emulator,
whose patches are applied by `kubectl patch --local` and whose IECs are checked against the CRD."""
from __future__ import annotations

import json

import pytest

from agent.k8s.patches import CONFIG_HASH_ANNOTATION, LAST_GOOD_ANNOTATION
from contracts.actuator import Actuator, PermanentActuationError, RefusedConfigError
from contracts.knobs import Knobs
from tests.support.kube import (
    NS,
    FakeTime,
    actuator_for,
    configmap,
    deployment,
    iec_sample,
    iec_validator,
    pod,
    serve,
)


@pytest.fixture
def kube(shared_dir):
    yield from serve(shared_dir)


TUNED = Knobs(chunk_tokens=512, cpu_gib=10.0, cpu_eviction="lfu", l2_min_prompt_tokens=1024)


def _env(obj):
    return obj["spec"]["template"]["spec"]["containers"][0].get("env")


def _reasons(server):
    return [e["reason"] for e in server.objects_of("Event")]


def test_plain_deployment_env_apply_mark_good_and_exact_rollback(kube):
    original_env = [{"name": "VLLM_LOGGING_LEVEL", "value": "INFO"}, {"name": "LMCACHE_CHUNK_SIZE", "value": "256"}]
    kube.put(deployment("vllm", env=original_env))
    kube.put(pod("vllm-a", "vllm"))
    kube.put(pod("vllm-b", "vllm"))
    kube.put(pod("other", "router"))
    fake = FakeTime()
    act = actuator_for(kube, [{"kind": "deployment-env", "name": "vllm", "container": "vllm"}], fake,
                       fixed_knobs={"l2_eviction": "lru"})
    assert isinstance(act, Actuator)
    assert act.current() == Knobs()  # absent LMCACHE_* vars read as LMCache's defaults
    assert act.last_good() is None
    act.mark_good(act.current())
    original = kube.get("Deployment", NS, "vllm")

    result = act.apply(TUNED)

    assert result.applied and not result.dry_run
    assert result.changed == {"chunk_tokens": (256, 512), "cpu_gib": (5.0, 10.0), "cpu_eviction": ("lru", "lfu"),
                              "l2_min_prompt_tokens": (0, 1024)}
    assert result.restarted == ("pod/llm/vllm-a", "pod/llm/vllm-b")
    live = kube.get("Deployment", NS, "vllm")
    assert _env(live) == [
        {"name": "VLLM_LOGGING_LEVEL", "value": "INFO"},
        {"name": "LMCACHE_CHUNK_SIZE", "value": "512"},
        {"name": "LMCACHE_MAX_LOCAL_CPU_SIZE", "value": "10.0"},
        {"name": "LMCACHE_CACHE_POLICY", "value": "LFU"},
        {"name": "LMCACHE_MIN_RETRIEVE_TOKENS", "value": "1024"},
    ]
    assert act.current() == TUNED
    patches = [r for r in kube.requests("PATCH", "deployments") if r["content_type"].startswith("application/json-")]
    assert patches, "env changes go as JSON Patch"
    assert act.last_good() == Knobs()
    record = json.loads(live["metadata"]["annotations"][LAST_GOOD_ANNOTATION])
    assert record["tokens"] == {"LMCACHE_CHUNK_SIZE": "256", "LMCACHE_MAX_LOCAL_CPU_SIZE": None,
                                "LMCACHE_CACHE_POLICY": None, "LMCACHE_MIN_RETRIEVE_TOKENS": None}

    back = act.rollback()

    assert back.applied and back.knobs == Knobs()
    restored = kube.get("Deployment", NS, "vllm")
    assert restored["spec"] == original["spec"]  # exactly: absent vars removed, the "256" kept as written
    assert _reasons(kube).count("TierpilotApplied") == 1
    assert _reasons(kube).count("TierpilotRolledBack") == 1
    assert act.metrics.snapshot()["results"][("deployment-env/llm/vllm", "apply", "applied")] == 1


def test_apply_of_the_running_config_changes_nothing(kube):
    kube.put(deployment("vllm", env=[]))
    fake = FakeTime()
    act = actuator_for(kube, [{"kind": "deployment-env", "name": "vllm"}], fake)
    result = act.apply(Knobs())
    assert not result.applied and result.changed == {}
    assert kube.requests("PATCH") == []


def test_lmcache_configmap_rolls_the_workload_and_rollback_restores_bytes(kube):
    text = "# LMCache for llama\nchunk_size: 256   # tokens\nlocal_cpu: true\nmax_local_cpu_size: 5.0\n"
    kube.put(configmap("lmcache-config", {"lmcache.yaml": text}))
    kube.put(deployment("vllm"))
    fake = FakeTime()
    act = actuator_for(kube, [{"kind": "lmcache-configmap", "name": "lmcache-config", "key": "lmcache.yaml",
                               "restart": [{"kind": "Deployment", "name": "vllm"}]}], fake)
    act.mark_good(act.current())
    original_deploy = kube.get("Deployment", NS, "vllm")

    act.apply(TUNED)

    cm = kube.get("ConfigMap", NS, "lmcache-config")
    assert cm["data"]["lmcache.yaml"] == ("# LMCache for llama\nchunk_size: 512   # tokens\nlocal_cpu: true\n"
                                          "max_local_cpu_size: 10.0\ncache_policy: LFU\nmin_retrieve_tokens: 1024\n")
    rolled = kube.get("Deployment", NS, "vllm")
    assert CONFIG_HASH_ANNOTATION in rolled["spec"]["template"]["metadata"]["annotations"]
    assert rolled["metadata"]["generation"] == 2
    strategic = [r for r in kube.requests("PATCH", "deployments") if "strategic" in r["content_type"]]
    assert len(strategic) == 1

    act.rollback()

    assert kube.get("ConfigMap", NS, "lmcache-config")["data"]["lmcache.yaml"] == text
    assert kube.get("Deployment", NS, "vllm")["spec"] == original_deploy["spec"]


def test_router_dynamic_config_hot_reloads_and_needs_a_session_key(kube):
    text = '{\n  "service_discovery": "k8s",\n  "routing_logic": "roundrobin"\n}\n'
    kube.put(configmap("router-dyn", {"dynamic_config.json": text}))
    fake = FakeTime()
    target = {"kind": "router-configmap", "name": "router-dyn", "key": "dynamic_config.json"}
    act = actuator_for(kube, [target], fake)
    assert act.current().router == "roundrobin"
    with pytest.raises(RefusedConfigError, match="session_key"):  # this candidate only: nothing written
        act.apply(Knobs(router="session"))
    result = act.apply(Knobs(router="prefixaware"))
    assert result.restarted == ()  # the router watches the file: no pod restarts
    assert kube.get("ConfigMap", NS, "router-dyn")["data"]["dynamic_config.json"] == (
        '{\n  "service_discovery": "k8s",\n  "routing_logic": "prefixaware"\n}\n')

    act = actuator_for(kube, [{**target, "session_key": "x-user-id"}], fake)
    act.apply(Knobs(router="session"))
    assert kube.get("ConfigMap", NS, "router-dyn")["data"]["dynamic_config.json"] == (
        '{\n  "session_key": "x-user-id",\n  "service_discovery": "k8s",\n  "routing_logic": "session"\n}\n')


def test_curvine_eviction_policy_refuses_what_curvine_cannot_do(kube):
    toml = '[master]\nhostname = "curvine-master"\nenable_quota_eviction = true\n\n[worker]\ndir_reserved = "10GB"\n'
    kube.put(configmap("curvine", {"curvine-cluster.toml": toml}))
    kube.put(deployment("curvine-master", kind="StatefulSet", replicas=1))
    fake = FakeTime()
    act = actuator_for(kube, [{"kind": "curvine-configmap", "name": "curvine", "key": "curvine-cluster.toml",
                               "restart": [{"kind": "StatefulSet", "name": "curvine-master"}]}], fake)
    live = act.current()
    assert (live.l2_eviction, live.l2_high_watermark, live.l2_low_watermark) == ("lru", 0.8, 0.6)
    with pytest.raises(PermanentActuationError, match="supported: lru, lfu"):
        act.apply(live.replace(l2_eviction="s3fifo"))
    assert kube.requests("PATCH") == []  # refused before any write

    act.apply(live.replace(l2_eviction="lfu", l2_high_watermark=0.9, l2_low_watermark=0.7))

    assert kube.get("ConfigMap", NS, "curvine")["data"]["curvine-cluster.toml"] == (
        '[master]\nhostname = "curvine-master"\nenable_quota_eviction = true\nquota_eviction_policy = "lfu"\n'
        'quota_eviction_high_rate = 0.9\nquota_eviction_low_rate = 0.7\n\n[worker]\ndir_reserved = "10GB"\n')
    sts = kube.get("StatefulSet", NS, "curvine-master")
    assert sts["metadata"]["generation"] == 2 and sts["status"]["observedGeneration"] == 2


def test_hyperpod_routing_strategy_and_its_limits(kube, shared_dir):
    kube.put(iec_sample(shared_dir))
    fake = FakeTime()
    act = actuator_for(kube, [{"kind": "hyperpod-iec", "name": "llama-8b-intel-routing"}], fake,
                       fixed_knobs={"router": "prefixaware"})
    assert act.current().router == "prefixaware"
    act.mark_good(act.current())

    result = act.apply(Knobs(router="kvaware"))

    iec = kube.get("InferenceEndpointConfig", NS, "llama-8b-intel-routing")
    assert iec["spec"]["intelligentRoutingSpec"] == {"enabled": True, "routingStrategy": "kvaware"}
    assert result.restarted == ("inferenceendpointconfig/llm/llama-8b-intel-routing",)
    assert list(iec_validator(shared_dir).iter_errors(iec)) == []
    assert all("json-patch" in r["content_type"] or "merge-patch" in r["content_type"]
               for r in kube.requests("PATCH", "inferenceendpointconfigs"))  # never strategic on a CR
    act.rollback()
    iec = kube.get("InferenceEndpointConfig", NS, "llama-8b-intel-routing")
    assert iec["spec"]["intelligentRoutingSpec"] == {"enabled": True, "routingStrategy": "prefixaware"}
    assert list(iec_validator(shared_dir).iter_errors(iec)) == []

    kube.put(iec_sample(shared_dir, "kv_cache_l1_l2"))  # no intelligentRoutingSpec: cannot be added
    act = actuator_for(kube, [{"kind": "hyperpod-iec", "name": "llama-8b-kv-cache-l1-l2"}], fake)
    with pytest.raises(PermanentActuationError, match="cannot be added to an existing deployment"):
        act.apply(Knobs(router="kvaware"))


def test_dry_run_per_call_and_global(kube):
    kube.put(deployment("vllm", env=[]))
    kube.put(pod("vllm-a", "vllm"))
    fake = FakeTime()
    act = actuator_for(kube, [{"kind": "deployment-env", "name": "vllm"}], fake)
    before = kube.get("Deployment", NS, "vllm")

    result = act.apply(TUNED, dry_run=True)

    assert result.dry_run and not result.applied and result.restarted == ("pod/llm/vllm-a",)
    assert result.changed["chunk_tokens"] == (256, 512)
    assert kube.get("Deployment", NS, "vllm") == before  # nothing stored
    assert {r["params"].get("dryRun") for r in kube.requests("PATCH")} == {"All"}  # server-side dry-run
    assert "TierpilotDryRun" in _reasons(kube)

    glob = actuator_for(kube, [{"kind": "deployment-env", "name": "vllm"}], fake, dry_run=True)
    assert glob.apply(TUNED).dry_run
    glob.mark_good(TUNED)
    assert kube.get("Deployment", NS, "vllm") == before
    assert glob.last_good() == TUNED  # kept in memory only


def test_knobs_no_target_actuates_are_refused(kube):
    kube.put(deployment("vllm", env=[]))
    act = actuator_for(kube, [{"kind": "deployment-env", "name": "vllm"}], FakeTime())
    assert act.tunable_knobs() == {"chunk_tokens", "cpu_gib", "cpu_eviction", "l2_min_prompt_tokens"}
    with pytest.raises(PermanentActuationError, match="no configured target actuates router"):
        act.apply(Knobs(router="kvaware"))


def test_cli_current_apply_and_rollback_through_a_kubeconfig(kube, tmp_path):
    import yaml
    from click.testing import CliRunner

    from agent.k8s.__main__ import main

    kube.put(deployment("vllm", env=[]))
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config", "current-context": "emu",
        "clusters": [{"name": "emu", "cluster": {"server": kube.url}}],
        "users": [{"name": "u", "user": {"token": "t"}}],
        "contexts": [{"name": "emu", "context": {"cluster": "emu", "user": "u"}}]}))
    targets = tmp_path / "targets.yaml"
    targets.write_text(yaml.safe_dump({"namespace": NS, "identity": "cli",
                                       "targets": [{"kind": "deployment-env", "name": "vllm"}]}))
    best = tmp_path / "best.yaml"
    best.write_text(yaml.safe_dump({"knobs": Knobs(chunk_tokens=512).to_dict(), "trial": 7}))
    runner = CliRunner()

    def cli(*args):
        return runner.invoke(main, ["--kubeconfig", str(kubeconfig), *map(str, args)])

    out = cli("current", targets)
    assert out.exit_code == 0 and "chunk_tokens: 256" in out.stdout
    out = cli("apply", targets, best, "--dry-run")
    assert out.exit_code == 0 and out.stdout.startswith("dry-run: 1 target(s) would change; chunk_tokens: 256 -> 512")
    assert _env(kube.get("Deployment", NS, "vllm")) == []
    default = tmp_path / "default.yaml"
    default.write_text(Knobs().to_yaml())
    assert cli("apply", targets, default, "--mark-good").exit_code == 0  # marks what runs as good
    out = cli("apply", targets, best)
    assert out.exit_code == 0, out.output
    assert _env(kube.get("Deployment", NS, "vllm")) == [{"name": "LMCACHE_CHUNK_SIZE", "value": "512"}]
    out = cli("rollback", targets)
    assert out.exit_code == 0, out.output
    assert _env(kube.get("Deployment", NS, "vllm")) == []

