"""Pure parts of agent/k8s on small hand-built inputs: exact values. Patch builders are checked
against `kubectl patch --local`."""
from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry

from agent.k8s import stores, textconf
from agent.k8s.api import ConflictError, ObjectRef, classify_api_error
from agent.k8s.backoff import Backoff
from agent.k8s.last_good import LastGood
from agent.k8s.mapping import KNOB_NAMES, MappingError, load_mappings, parse_mappings
from agent.k8s.metrics import ActuationCollector, ActuationMetrics
from agent.k8s.reapply import Budget
from agent.k8s.rollout import assess_deployment, assess_iec, assess_statefulset, wait_for_rollout
from agent.k8s.settings import ActuationConfigError, load_settings, settings_from_mapping
from agent.k8s.targets import Target
from contracts.actuator import PermanentActuationError, RetriableActuationError, TargetGoneError
from contracts.knobs import Knobs
from tests.conftest import REPO_ROOT
from tests.support.kube import (
    FakeTime,
    KubectlPatchError,
    deployment,
    iec_sample,
    iec_validator,
    kubectl_patch_local,
)

REF = ObjectRef("Deployment", "llm", "vllm")


# -- text editors -----------------------------------------------------------------------------

def test_yaml_edit_keeps_comments_and_restores_bytes():
    text = "# cfg\nchunk_size: 256  # tokens\nlocal_cpu: true\n"
    edited = textconf.yaml_set(text, {"chunk_size": "1024", "cache_policy": "LFU"})
    assert edited == "# cfg\nchunk_size: 1024  # tokens\nlocal_cpu: true\ncache_policy: LFU\n"
    assert textconf.yaml_set(edited, {"chunk_size": "256", "cache_policy": None}) == text
    with pytest.raises(textconf.ConfigTextError, match="not a scalar"):
        textconf.yaml_set("extra_config:\n  a: 1\n", {"extra_config": "2"})


def test_toml_edit_inside_its_section_only():
    text = '[master]\nquota_eviction_policy = "lru"\n[client]\nquota_eviction_policy = "x"\n'
    assert textconf.toml_get(text, "master.quota_eviction_policy") == '"lru"'
    assert textconf.toml_set(text, {"master.quota_eviction_policy": '"lfu"', "master.quota_eviction_low_rate": "0.5"}) \
        == '[master]\nquota_eviction_policy = "lfu"\nquota_eviction_low_rate = 0.5\n[client]\nquota_eviction_policy = "x"\n'
    with pytest.raises(textconf.ConfigTextError, match="not valid TOML"):
        textconf.toml_set(text, {"master.x": "not toml"})


def test_json_edit_keeps_the_file_layout():
    text = '{"a": 1, "routing_logic": "roundrobin"}'
    assert textconf.json_set(text, {"routing_logic": '"kvaware"'}) == '{"a": 1, "routing_logic": "kvaware"}'
    assert textconf.json_set(text, {"a": None}) == '{"routing_logic": "roundrobin"}'
    assert textconf.json_set(text, {"routing_logic": None}) == '{"a": 1}'


@settings(max_examples=60, deadline=None)
@given(values=st.dictionaries(st.sampled_from(["chunk_size", "max_local_cpu_size", "cache_policy", "x"]),
                              st.one_of(st.none(), st.integers(0, 4096), st.sampled_from(["LRU", "lfu"])),
                              max_size=4),
       trailing_newline=st.booleans())
def test_yaml_apply_then_restore_is_byte_exact(values, trailing_newline):
    original = "# LMCache\nchunk_size: 256\nlocal_cpu: true" + ("\n" if trailing_newline else "")
    # apply writes values; it deletes only lines it added itself (absent settings stay absent)
    values = {k: v for k, v in values.items() if v is not None or textconf.yaml_get(original, k) is None}
    keys = list(values)
    before = {k: textconf.yaml_get(original, k) for k in keys}
    edited = textconf.yaml_set(original, {k: None if v is None else textconf.yaml_token(v) for k, v in values.items()})
    assert textconf.yaml_set(edited, before) == original


# -- mapping ----------------------------------------------------------------------------------

def test_every_knob_is_actuated_by_some_kind():
    mapped = {k for m in load_mappings().values() for k in m.knobs}
    assert mapped == set(KNOB_NAMES)


def test_mapping_errors_name_the_kind_and_key():
    bad = {"x": {"resource": "ConfigMap", "store": "yaml-lines", "takes_effect": "hot-reload",
                 "settings": [{"knob": "chunk", "key": "k", "type": "int", "default": 1}]}}
    with pytest.raises(MappingError, match=r"x\.settings\[0\]\.knob: invalid value 'chunk'; valid choices: chunk_tokens"):
        parse_mappings(bad, source="m.yaml")
    bad["x"]["settings"][0].update(knob="router", type="enum", values={"session": "session"}, default="kvaware")
    with pytest.raises(MappingError, match="default: must be one of session"):
        parse_mappings(bad, source="m.yaml")


def test_setting_conversions():
    s = load_mappings()["deployment-env"].setting("cpu_eviction")
    assert s.to_component("lfu") == "LFU" and s.from_component("lfu") == "lfu" and s.from_component("FIFO") == "fifo"
    with pytest.raises(ValueError, match="'MRU' has no cpu_eviction equivalent"):
        s.from_component("MRU")
    cpu = load_mappings()["deployment-env"].setting("cpu_gib")
    assert cpu.same("5", 5.0) and not cpu.same("5.5", 5.0)


# -- API error table --------------------------------------------------------------------------

@pytest.mark.parametrize(("status", "body", "kind"), [
    (409, {"message": "modified"}, ConflictError),
    (422, {"message": "testing value /spec/x failed: test failed"}, ConflictError),
    (422, {"message": "spec.replicas: Invalid value"}, PermanentActuationError),
    (404, {"message": "not found"}, TargetGoneError),
    (403, {"message": "forbidden"}, PermanentActuationError),
    (500, "boom", RetriableActuationError),
    (503, None, RetriableActuationError),
    (429, {}, RetriableActuationError),
    (415, {}, PermanentActuationError),
])
def test_classify_api_error(status, body, kind):
    err = classify_api_error(status, json.dumps(body) if isinstance(body, dict) else body, verb="patch", ref=REF,
                             delay_s=4.0)
    assert type(err) is kind
    if kind is RetriableActuationError:
        assert err.delay_s == 4.0


# -- patch builders, checked with kubectl ------------------------------------------------------

def test_env_plan_is_guarded_and_kubectl_applies_it():
    obj = deployment("vllm", env=[{"name": "A", "value": "1"}, {"name": "LMCACHE_CHUNK_SIZE", "value": "256"}])
    obj["metadata"]["resourceVersion"] = "7"
    patch = stores.plan_tokens("env", obj, {"LMCACHE_CHUNK_SIZE": "512", "LMCACHE_CACHE_POLICY": "LFU", "A": None},
                               container="vllm")
    base = "/spec/template/spec/containers/0"
    assert patch.body == [
        {"op": "test", "path": f"{base}/name", "value": "vllm"},
        {"op": "test", "path": f"{base}/env/1", "value": {"name": "LMCACHE_CHUNK_SIZE", "value": "256"}},
        {"op": "test", "path": f"{base}/env/0", "value": {"name": "A", "value": "1"}},
        {"op": "test", "path": "/metadata/resourceVersion", "value": "7"},
        {"op": "replace", "path": f"{base}/env/1/value", "value": "512"},
        {"op": "remove", "path": f"{base}/env/0"},
        {"op": "add", "path": f"{base}/env/-", "value": {"name": "LMCACHE_CACHE_POLICY", "value": "LFU"}},
    ]
    out = kubectl_patch_local(obj, "json", patch.body)
    assert out["spec"]["template"]["spec"]["containers"][0]["env"] == [
        {"name": "LMCACHE_CHUNK_SIZE", "value": "512"}, {"name": "LMCACHE_CACHE_POLICY", "value": "LFU"}]
    moved = json.loads(json.dumps(obj))
    moved["spec"]["template"]["spec"]["containers"][0]["env"].reverse()  # a concurrent reorder
    with pytest.raises(KubectlPatchError, match="test failed"):
        kubectl_patch_local(moved, "json", patch.body)


def test_iec_pointer_plan_result_is_valid_against_the_crd(shared_dir):
    obj = iec_sample(shared_dir)
    conf = settings_from_mapping({"namespace": "llm", "targets": [{"kind": "hyperpod-iec",
                                                                   "name": obj["metadata"]["name"]}]})
    target = Target.build(conf.targets[0], load_mappings(), conf)
    patch = target.plan(obj, target.tokens_for(Knobs(router="session"), obj), "test")
    assert patch.body == [
        {"op": "test", "path": "/spec/intelligentRoutingSpec/routingStrategy", "value": "prefixaware"},
        {"op": "replace", "path": "/spec/intelligentRoutingSpec/routingStrategy", "value": "session"}]
    out = kubectl_patch_local(obj, "json", patch.body)
    assert list(iec_validator(shared_dir).iter_errors(out)) == []
    with pytest.raises(PermanentActuationError, match="/spec/worker/environmentVariables cannot be updated"):
        target.plan(obj, {"/spec/worker/environmentVariables": "[]"}, "test")


def test_restart_annotation_strategic_merge_matches_kubectl():
    from agent.k8s.writes import restart_patch as _restart_patch

    obj = deployment("vllm")
    set_patch = _restart_patch(obj, "abc123")
    assert set_patch.type == "strategic"
    rolled = kubectl_patch_local(obj, "strategic", set_patch.body)
    assert rolled["spec"]["template"]["metadata"]["annotations"] == {"tierpilot.io/config-hash": "abc123"}
    back = kubectl_patch_local(rolled, "json", _restart_patch(rolled, None).body)
    assert back["spec"]["template"] == obj["spec"]["template"]


# -- rollout ----------------------------------------------------------------------------------

def test_rollout_assessment():
    d = deployment("vllm", replicas=3)
    assert assess_deployment(d).done
    d["metadata"]["generation"] = 2
    assert assess_deployment(d).message == "waiting for the controller to observe the new generation"
    d["status"].update(observedGeneration=2, updatedReplicas=1, replicas=4)
    assert assess_deployment(d).message == "1 of 3 replicas updated"
    d["status"].update(updatedReplicas=3)
    assert assess_deployment(d).message == "1 old replicas pending termination"
    d["status"].update(replicas=3, availableReplicas=2)
    assert assess_deployment(d).message == "2 of 3 updated replicas available"
    d["status"]["conditions"] = [{"type": "Progressing", "reason": "ProgressDeadlineExceeded", "message": "x"}]
    assert assess_deployment(d).failed
    s = deployment("m", kind="StatefulSet", replicas=1)
    assert assess_statefulset(s).done
    assert assess_iec({"metadata": {"generation": 3}, "status": {"observedGeneration": 3,
                                                                  "state": "DeploymentFailed"}}).failed
    assert not assess_iec({"metadata": {"generation": 3}, "status": {"observedGeneration": 2}}).done


def test_wait_for_rollout_times_out_on_fake_time():
    fake = FakeTime()
    state = wait_for_rollout(lambda: {"metadata": {"generation": 2}, "status": {"observedGeneration": 1}},
                             assess_deployment, timeout_s=10, poll_s=4, clock=fake.clock, sleep=fake.sleep)
    assert not state.done and state.message.startswith("timed out after 10s")
    assert fake.slept == [4, 4, 2]


# -- records, settings, small state ------------------------------------------------------------

def test_last_good_record_round_trips():
    rec = LastGood(Knobs(chunk_tokens=512), {"LMCACHE_CHUNK_SIZE": "512", "LMCACHE_CACHE_POLICY": None},
                   {"vllm": None}, "2026-11-29T00:00:00Z", "tierpilot-0")
    obj = {"metadata": {"annotations": {"tierpilot.io/last-good": rec.to_json()}}}
    assert LastGood.from_object(obj, where="x") == rec
    with pytest.raises(PermanentActuationError, match="unreadable"):
        LastGood.from_object({"metadata": {"annotations": {"tierpilot.io/last-good": "{"}}}, where="x")


def test_settings_errors_name_the_file_and_key(tmp_path):
    p = tmp_path / "targets.yaml"
    p.write_text("namespace: llm\ntargets:\n- {kind: deployment-env, name: v, knobs: [router]}\n")
    with pytest.raises(ActuationConfigError, match=r"targets\[0\] \(deployment-env v\): knob 'router' is not mapped"):
        load_settings(p)
    p.write_text("namespace: llm\ntargets:\n- {kind: lmcache-configmap, name: c, key: k}\n")
    with pytest.raises(ActuationConfigError, match="`restart` is required"):
        load_settings(p)
    p.write_text("namespace: llm\ntargets: []\nlease: {duration_s: 5, renew_deadline_s: 10}\n")
    with pytest.raises(ActuationConfigError, match=str(p)):
        load_settings(p)
    for overlay in ("plain-vllm", "production-stack", "hyperpod"):
        load_settings(REPO_ROOT / "deploy" / "overlays" / overlay / "targets.yaml")


def test_backoff_and_budget():
    b = Backoff(base_s=1, max_s=5)
    assert [b.next_delay() for _ in range(5)] == [1, 2, 4, 5, 5]
    b.reset()
    assert b.next_delay() == 1
    fake = FakeTime()
    budget = Budget(2, 60, fake.clock)
    assert [budget.allow(), budget.allow(), budget.allow()] == [True, True, False]
    fake.sleep(60)
    assert budget.allow()


def test_collector_exposes_the_catalogued_metrics():
    m = ActuationMetrics()
    m.success("deployment-env/llm/vllm", "apply")
    m.result("deployment-env/llm/vllm", "apply", "conflict_retried")
    m.reapplied("deployment-env/llm/vllm")
    m.rollout_seconds("deployment-env/llm/vllm", 42.0)
    m.gone("curvine-configmap/llm/c")
    m.leader("a", True)
    m.dry_run = True
    reg = CollectorRegistry()
    reg.register(ActuationCollector(m))
    labels = {"workload": "deployment-env/llm/vllm", "operation": "apply", "result": "applied"}
    assert reg.get_sample_value("tierpilot_k8s_object_writes_total", labels) == 1
    assert reg.get_sample_value("tierpilot_reapplied_total", {"workload": "deployment-env/llm/vllm"}) == 1
    assert reg.get_sample_value("tierpilot_rollout_duration_seconds", {"workload": "deployment-env/llm/vllm"}) == 42
    assert reg.get_sample_value("tierpilot_workload_gone", {"workload": "curvine-configmap/llm/c"}) == 1
    assert reg.get_sample_value("tierpilot_leader", {"identity": "a"}) == 1
    assert reg.get_sample_value("tierpilot_dry_run") is None  # served once, by the tuner metrics
    doc = (REPO_ROOT / "docs" / "metrics.md").read_text()
    section = doc[doc.index("## Actuation (agent/k8s)"):]
    names = {s.name for fam in reg.collect() for s in fam.samples if not s.name.endswith("_created")}
    for name in names:
        assert f"`{name}`" in section, f"{name} is not catalogued in docs/metrics.md"
