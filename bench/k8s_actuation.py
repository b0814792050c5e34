"""Kubernetes actuation: planning cost and API round trips per operation.

Prints, per target kind:
- the pure planning cost (read tokens + plan a guarded patch) against copying the object
  (`copy.deepcopy`) in the same process: a ratio, so machine speed cancels out;
- the API requests one apply, mark_good and rollback make against the emulated API server;
- the wall time of one apply on the emulator against one bare `kubectl patch --local` (the
  emulator applies every patch with kubectl, so this ratio is the agent's own overhead + 1).

Run: TIERPILOT_SHARED=../shared .venv/bin/python bench/k8s_actuation.py
"""
from __future__ import annotations

import collections
import copy
import json
import sys
import time
import tomllib
from pathlib import Path

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from agent.k8s.mapping import load_mappings
from agent.k8s.settings import settings_from_mapping
from agent.k8s.targets import Target
from contracts.knobs import Knobs
from tests.conftest import shared_path
from tests.support.kube import (
    NS,
    FakeTime,
    KubeServer,
    actuator_for,
    configmap,
    deployment,
    iec_sample,
    iec_validator,
    kubectl_patch_local,
)

TUNED = Knobs(chunk_tokens=512, cpu_gib=10.0, cpu_eviction="lfu", l2_eviction="lfu", l2_high_watermark=0.9,
              l2_low_watermark=0.7, router="kvaware", l2_min_prompt_tokens=1024)
CURVINE = '[master]\nhostname = "curvine-master"\nenable_quota_eviction = true\n\n[worker]\ndir_reserved = "10GB"\n'


def cases(shared: Path) -> dict[str, tuple[dict, list[dict], list[dict]]]:
    """kind -> (target spec, objects to create, the object the target patches first)."""
    env = [{"name": f"VAR_{i}", "value": str(i)} for i in range(20)]
    return {
        "deployment-env": ({"kind": "deployment-env", "name": "vllm", "container": "vllm"},
                           [deployment("vllm", env=env)]),
        "lmcache-configmap": ({"kind": "lmcache-configmap", "name": "lmc", "key": "lmcache.yaml",
                               "restart": [{"name": "vllm"}]},
                              [configmap("lmc", {"lmcache.yaml": "chunk_size: 256\nlocal_cpu: true\n"}),
                               deployment("vllm")]),
        "router-configmap": ({"kind": "router-configmap", "name": "dyn", "key": "dynamic_config.json"},
                             [configmap("dyn", {"dynamic_config.json": '{"routing_logic": "roundrobin"}'})]),
        "hyperpod-iec": ({"kind": "hyperpod-iec", "name": "llama-8b-intel-routing"}, [iec_sample(shared)]),
        "curvine-configmap": ({"kind": "curvine-configmap", "name": "curvine", "key": "curvine-cluster.toml",
                               "restart": [{"kind": "StatefulSet", "name": "curvine-master"}]},
                              [configmap("curvine", {"curvine-cluster.toml": CURVINE}),
                               deployment("curvine-master", kind="StatefulSet", replicas=1)]),
    }


def timeit(fn, n: int) -> float:
    start = time.perf_counter()
    for _ in range(n):
        fn()
    return (time.perf_counter() - start) / n


def main() -> None:
    shared = shared_path()
    table = cases(shared)
    maps = load_mappings()
    print("== planning (pure), per call; ratio = plan / one reference step in the same process:")
    print("   parsing the config file once (ConfigMap kinds) or deep-copying the object (the others)")
    for kind, (spec, objs) in table.items():
        conf = settings_from_mapping({"namespace": NS, "targets": [spec]})
        target = Target.build(conf.targets[0], maps, conf)
        obj = objs[0]
        n = 2000
        plan = timeit(lambda t=target, o=obj: t.plan(o, t.tokens_for(TUNED, o), "bench"), n)
        if spec.get("key"):
            text = obj["data"][spec["key"]]
            parse = {"lmcache-configmap": yaml.safe_load, "curvine-configmap": tomllib.loads,
                     "router-configmap": json.loads}[kind]
            ref, ref_name = timeit(lambda t=text, f=parse: f(t), n), "parse"
        else:
            ref, ref_name = timeit(lambda o=obj: copy.deepcopy(o), n), "deepcopy"
        print(f"{kind:20s} plan {plan * 1e6:8.1f} us   {ref_name:8s} {ref * 1e6:8.1f} us   ratio {plan / ref:5.2f}")

    print("\n== API requests per operation on the emulated API server (GET/PATCH/POST/...)")
    bare = timeit(lambda: kubectl_patch_local(deployment("x"), "merge", {"metadata": {"labels": {"a": "b"}}}), 5)
    for kind, (spec, objs) in table.items():
        server = KubeServer(schemas={"inferenceendpointconfigs": iec_validator(shared)}).start()
        try:
            for obj in objs:
                server.put(obj)
            fixed = {"router": "prefixaware"} if kind == "hyperpod-iec" else {}
            act = actuator_for(server, [spec], FakeTime(), fixed_knobs=fixed)
            owned = {k: getattr(TUNED, k) for k in act.tunable_knobs()}
            knobs = act.current().replace(**owned)
            counts = {}
            for op, fn in (("mark_good", lambda a=act: a.mark_good(a.current())),
                           ("apply", lambda a=act, k=knobs: a.apply(k)), ("rollback", lambda a=act: a.rollback())):
                before = len(server.emu.log)
                start = time.perf_counter()
                fn()
                elapsed = time.perf_counter() - start
                c = collections.Counter(r["method"] for r in server.emu.log[before:])
                counts[op] = (dict(sorted(c.items())), elapsed)
            apply_counts, apply_s = counts["apply"]
            patches = apply_counts.get("PATCH", 0)
            print(f"{kind:20s} " + "  ".join(f"{op} {c}" for op, (c, _) in counts.items()))
            print(f"{'':20s} apply {apply_s * 1000:7.1f} ms = {apply_s / bare:5.2f} x one kubectl patch "
                  f"({bare * 1000:.1f} ms); {patches} patch(es) applied by kubectl in the emulator")
            assert server.get(objs[0]["kind"], NS, objs[0]["metadata"]["name"]) is not None
        finally:
            server.stop()


if __name__ == "__main__":
    main()
