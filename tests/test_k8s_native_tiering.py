"""Actuation of vLLM's native tiering: the JSON inside the vLLM container's `--kv-transfer-config`
flag, edited member by member (every other key kept as written), on the kmock emulator with the
real `kubernetes` client (each patch applied by `kubectl patch --local`)."""
from __future__ import annotations

import dataclasses
import json

import pytest

from agent.k8s.args_json import split_key
from agent.k8s.mapping import load_mappings
from agent.k8s.offline import acceptance
from agent.k8s.settings import settings_from_mapping
from agent.k8s.textconf import ConfigTextError, json_path_get, json_path_set
from contracts.actuator import PermanentActuationError
from emulator.cluster.curvine_config import quota_from_toml
from emulator.cluster.curvine_quota import QuotaError
from tests.support.kube import NS, FakeTime, actuator_for, configmap, deployment, serve
from tuners.space import SearchSpace
from tuners.space.modes import follow_deployment

GIB = 1 << 30
# as vLLM's docs and the project's engine launcher write it: compact, with keys the agent does not own
CONFIG = ('{"kv_connector":"OffloadingConnector","kv_role":"kv_both","kv_connector_extra_config":'
          '{"spec_name":"TieringOffloadingSpec","cpu_bytes_to_use":4294967296,"eviction_policy":"lru",'
          '"self_describing_kv_events":true,"secondary_tiers":[{"type":"fs","root_dir":"/mnt/curvine/kv",'
          '"enable_kv_events":true,"n_read_threads":4}],"vendor_option":{"x":[1,2]}}}')
TARGET = [{"kind": "vllm-tiering-args", "name": "vllm", "container": "vllm"}]


@pytest.fixture
def kube(shared_dir):
    yield from serve(shared_dir)


def _put(kube, args: list[str]) -> None:
    obj = deployment("vllm", container="vllm")
    obj["spec"]["template"]["spec"]["containers"][0]["args"] = list(args)
    kube.put(obj)


def _args(kube) -> list[str]:
    return kube.get("Deployment", NS, "vllm")["spec"]["template"]["spec"]["containers"][0]["args"]


def _extra(text: str) -> dict:
    return json.loads(text)["kv_connector_extra_config"]


def test_cpu_tier_chunk_and_eviction_are_members_of_the_flags_json(kube):
    args = ["--model", "Qwen/Qwen3-8B", "--block-size", "16", "--kv-transfer-config", CONFIG, "--port", "8000"]
    _put(kube, args)
    act = actuator_for(kube, TARGET, FakeTime())
    live = act.current()
    assert (live.cpu_gib, live.cpu_eviction) == (4.0, "lru")  # block_size absent: chunk_tokens not read here
    act.mark_good(live)
    act.apply(live.replace(cpu_gib=6.5, chunk_tokens=64, cpu_eviction="arc"))
    obj = kube.get("Deployment", NS, "vllm")
    new = _args(kube)
    assert new[:5] == args[:5] and new[6:] == args[6:]
    want = json.loads(CONFIG)
    want["kv_connector_extra_config"].update(cpu_bytes_to_use=int(6.5 * GIB), eviction_policy="arc", block_size=64)
    assert json.loads(new[5]) == want  # unknown keys (vendor_option, secondary_tiers...) kept
    assert new[5] == CONFIG.replace('{"spec_name"', '{"block_size":64,"spec_name"').replace(
        '"cpu_bytes_to_use":4294967296', f'"cpu_bytes_to_use":{int(6.5 * GIB)}').replace('"lru"', '"arc"')
    assert obj["metadata"]["generation"] == 2  # the pod template changed: the engines roll
    assert act.current().replace() == live.replace(cpu_gib=6.5, chunk_tokens=64, cpu_eviction="arc")
    act.rollback()
    assert _args(kube) == args  # byte for byte


def test_the_inline_form_stays_inline(kube):
    args = ["--block-size=32", f"--kv-transfer-config={CONFIG}"]
    _put(kube, args)
    act = actuator_for(kube, TARGET, FakeTime())
    act.apply(act.current().replace(cpu_gib=1.0, chunk_tokens=128))
    first, second = _args(kube)
    assert first == "--block-size=32" and second.startswith("--kv-transfer-config={")
    extra = _extra(second.split("=", 1)[1])
    assert (extra["cpu_bytes_to_use"], extra["block_size"], extra["eviction_policy"]) == (GIB, 128, "lru")


def test_values_vllm_would_refuse_are_refused_and_nothing_is_written(kube):
    args = ["--block-size", "128", "--kv-transfer-config", CONFIG]
    _put(kube, args)
    act = actuator_for(kube, TARGET, FakeTime())
    live = act.current()
    for knobs, message in (
            (live.replace(cpu_eviction="lfu"), ("cpu_eviction='lfu' cannot be expressed as --kv-transfer-config/"
                                               "kv_connector_extra_config/eviction_policy; supported: lru, arc")),
            (live.replace(cpu_gib=0.0), "cpu_gib=0.0 cannot be expressed .* must be above 0"),
            (live.replace(chunk_tokens=64), "chunk_tokens=64 cannot be expressed .* multiple of --block-size 128")):
        with pytest.raises(PermanentActuationError, match=message):
            act.apply(knobs)
    assert _args(kube) == args
    act.apply(live.replace(chunk_tokens=256))
    assert _extra(_args(kube)[3])["block_size"] == 256


def test_a_chunk_size_without_the_engines_block_size_is_refused(kube):
    _put(kube, ["--kv-transfer-config", CONFIG])
    act = actuator_for(kube, TARGET, FakeTime())
    with pytest.raises(PermanentActuationError, match="chunk_tokens=512 needs --block-size set explicitly"):
        act.apply(act.current().replace(chunk_tokens=512))
    # a target owning only the CPU tier's size and policy does not need it
    act = actuator_for(kube, [{**TARGET[0], "knobs": ["cpu_gib", "cpu_eviction"]}], FakeTime())
    act.apply(act.current().replace(cpu_gib=8.0))
    assert _extra(_args(kube)[1])["cpu_bytes_to_use"] == 8 * GIB


def test_an_unconfigured_connector_is_not_created(kube):
    bare = '{"kv_connector":"OffloadingConnector","kv_role":"kv_both"}'
    _put(kube, ["--block-size", "16", "--kv-transfer-config", bare])
    act = actuator_for(kube, TARGET, FakeTime())
    with pytest.raises(PermanentActuationError, match="kv_connector_extra_config is absent; the agent does not "
                                                      "create it"):
        act.apply(act.current().replace(cpu_gib=2.0))
    _put(kube, ["--block-size", "16"])
    with pytest.raises(PermanentActuationError, match="--kv-transfer-config is not in args"):
        act.apply(act.current().replace(cpu_gib=2.0))


def test_the_tuner_searches_only_the_policies_vllm_has():
    conf = settings_from_mapping({"namespace": NS, "targets": TARGET + [
        {"kind": "curvine-configmap", "name": "curvine-config", "key": "curvine-cluster.toml",
         "restart": [{"kind": "StatefulSet", "name": "curvine-master"}]},
        {"kind": "vllm-router-args", "name": "vllm-router", "container": "router"}]})
    acc = acceptance(conf, load_mappings())
    assert acc.accepts["cpu_eviction"] == ("lru", "arc") and acc.accepts["l2_eviction"] == ("lru", "lfu")
    space = SearchSpace.from_limits(tune_cpu_eviction=True).for_targets(acc)
    assert space.choices("cpu_eviction") == ("lru", "arc")
    assert {"chunk_tokens", "cpu_gib", "l2_eviction", "router"} <= {d.name for d in space.dimensions}
    cpu = next(d for d in space.dimensions if d.name == "cpu_gib")  # vLLM refuses a CPU tier of 0 bytes
    assert acc.above == {"cpu_gib": 0.0} and cpu.grid()[0] == space.limits.cpu_gib_step > 0
    unbounded = SearchSpace.from_limits().for_targets(dataclasses.replace(acc, above={}))
    assert next(d for d in unbounded.dimensions if d.name == "cpu_gib").grid()[0] == 0.0  # 0 offered without it


def test_json_path_edits_keep_every_other_byte():
    text = '{\n  "a": 1,\n  "extra": {"keep": [1, 2], "policy": "lru"}\n}'
    assert json_path_get(text, ("extra", "policy")) == '"lru"'
    assert json_path_get(text, ("extra", "missing")) is None
    out = json_path_set(text, {("extra", "policy"): '"arc"', ("extra", "size"): "7"})
    assert out == '{\n  "a": 1,\n  "extra": {"size": 7,"keep": [1, 2], "policy": "arc"}\n}'
    assert json_path_set(out, {("extra", "policy"): '"lru"', ("extra", "size"): None}) == text
    with pytest.raises(ConfigTextError, match="nope is absent"):
        json_path_set(text, {("nope", "x"): "1"})
    with pytest.raises(ConfigTextError, match="a is not a JSON object"):
        json_path_get(text, ("a", "x"))
    assert split_key("--kv-transfer-config/kv_connector_extra_config/block_size") == (
        "--kv-transfer-config", ("kv_connector_extra_config", "block_size"))
    assert split_key("--block-size") == ("--block-size", ())


def test_the_l2_quota_policy_reaches_the_emulated_curvine_master(kube):
    """The fs tier never evicts; the shared mount's master does. The emulated master reads the
    `[master]` keys the curvine-configmap target writes, so a tuned policy is the one it runs."""
    toml = '[master]\nhostname = "curvine-master"\nenable_quota_eviction = true\n'
    kube.put(configmap("curvine", {"curvine-cluster.toml": toml}))
    kube.put(deployment("curvine-master", kind="StatefulSet", replicas=1))
    act = actuator_for(kube, [{"kind": "curvine-configmap", "name": "curvine", "key": "curvine-cluster.toml",
                               "restart": [{"kind": "StatefulSet", "name": "curvine-master"}]}], FakeTime())
    before = quota_from_toml(toml, capacity_bytes=GIB)
    assert (before.policy, before.high_watermark, before.low_watermark) == ("lru", 0.8, 0.6)
    act.apply(act.current().replace(l2_eviction="lfu", l2_high_watermark=0.9, l2_low_watermark=0.7))
    after = quota_from_toml(kube.get("ConfigMap", NS, "curvine")["data"]["curvine-cluster.toml"], capacity_bytes=GIB)
    assert (after.policy, after.high_watermark, after.low_watermark, after.capacity_bytes) == ("lfu", 0.9, 0.7, GIB)
    with pytest.raises(QuotaError, match="policy 'arc'"):
        quota_from_toml('[master]\nquota_eviction_policy = "arc"\n', capacity_bytes=GIB)


def test_kv_offloading_size_wins_over_cpu_bytes_to_use_so_the_json_is_not_edited(kube):
    # vLLM writes --kv-offloading-size x 2^30 over cpu_bytes_to_use (vllm/config/vllm.py): the
    # JSON member would have no effect
    args = ["--block-size", "16", "--kv-offloading-size", "8", "--kv-transfer-config", CONFIG]
    _put(kube, args)
    act = actuator_for(kube, TARGET, FakeTime())
    live = act.current()
    assert live.cpu_gib == 8.0  # what runs, not the JSON's 4 GiB
    with pytest.raises(PermanentActuationError, match="--kv-offloading-size 8 is set and vLLM writes it over"):
        act.apply(live.replace(cpu_gib=2.0))
    assert _args(kube) == args
    act.apply(live.replace(cpu_eviction="arc"))  # the other members are still the agent's
    assert _extra(_args(kube)[5])["eviction_policy"] == "arc" and _extra(_args(kube)[5])["cpu_bytes_to_use"] == 4 * GIB


def test_the_live_actuator_offers_lru_and_arc_and_the_space_follows(kube):
    _put(kube, ["--block-size", "16", "--kv-transfer-config", CONFIG])
    act = actuator_for(kube, TARGET, FakeTime())
    assert act.accepted_values() == {"cpu_eviction": ("lru", "arc")}
    assert act.tunable_knobs() == frozenset({"cpu_gib", "chunk_tokens", "cpu_eviction"})
    space = follow_deployment(SearchSpace.from_limits(tune_cpu_eviction=True), act.accepted_values(),
                              act.coupled_knobs())
    assert space.choices("cpu_eviction") == ("lru", "arc")
