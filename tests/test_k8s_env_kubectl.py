"""The actuator's view of a container's environment, checked against the real kubectl.

What kubectl computes here, through the kmock API: which variables an `envFrom` source gives,
prefix applied, from the source as the API serves it (`kubectl set env --from=configmap/x
--prefix=P`); a later source overriding an earlier one (set env replaces a variable by name);
`env` overriding both (a strategic-merge patch of the env list, keyed by name); and each
`valueFrom` ConfigMap or Secret key read through the API (`kubectl set env --list --resolve`).

What kubectl cannot compute without a kubelet, and the oracle below states as the kubelet's
rules (pkg/kubelet/kubelet_pods.go): an absent `optional` source gives nothing (kubectl refuses
`--from` an absent object), an absent required one keeps the container from starting;
`$(VAR)` references are expanded and `fieldRef` filled in at start (kubectl prints them as
written or as a comment). For those the agent refuses to report a value, and the test checks that.
"""
from __future__ import annotations

import json

import pytest

from agent.k8s.api import KubeApi
from agent.k8s.envsources import container_sources, resolve_env
from tests.support.kube import (
    NS,
    FakeTime,
    KubectlPatchError,
    actuator_for,
    configmap,
    deployment,
    kubectl,
    secret,
    serve,
)

NAMES = ["LMCACHE_MAX_LOCAL_CPU_SIZE", "LMCACHE_CHUNK_SIZE", "OTHER", "HF_TOKEN", "X_LMCACHE_CHUNK_SIZE",
         "LMCACHE_OTHER", "CPU"]
CPU, CHUNK = "LMCACHE_MAX_LOCAL_CPU_SIZE", "LMCACHE_CHUNK_SIZE"


@pytest.fixture
def kube(shared_dir):
    yield from serve(shared_dir)


def _cm(name):
    return {"configMapRef": {"name": name}}


def _ref(field, name, key, **kw):
    return {"valueFrom": {field: {"name": name, "key": key, **kw}}}


# Each case: a container (envFrom, env). Sources: see _sources.
CASES = {
    "later-over-earlier": ([_cm("first"), {**_cm("second"), "prefix": "LMCACHE_"}], []),
    "earlier-under-later": ([{**_cm("second"), "prefix": "LMCACHE_"}, _cm("first")], []),
    "env-over-envfrom, configmap key": ([_cm("first")], [{"name": CHUNK, "value": "256"},
                                                         {"name": CPU, **_ref("configMapKeyRef", "tuning", "cpu")}]),
    "secret key": ([], [{"name": CPU, **_ref("secretKeyRef", "tsec", "cpu")}]),
    "secret after configmap, optional absent key": (
        [_cm("first"), {"secretRef": {"name": "keys"}}],
        [{"name": CPU, **_ref("configMapKeyRef", "tuning", "no", optional=True)}]),
    "configmap after secret": ([{"secretRef": {"name": "keys"}}, _cm("first")], []),
    "optional absent source, other prefix": ([{"configMapRef": {"name": "absent", "optional": True}},
                                              {**_cm("first"), "prefix": "X_"}], [{"name": "OTHER", "value": "o"}]),
}


def _sources(kube) -> None:
    kube.put(configmap("first", {CPU: "20", CHUNK: "512", "OTHER": "x"}))
    kube.put(configmap("second", {"MAX_LOCAL_CPU_SIZE": "40", "CHUNK_SIZE": "1024", "OTHER": "y"}))
    kube.put(configmap("tuning", {"cpu": "30"}))
    kube.put(secret("keys", {CHUNK: "2048", "HF_TOKEN": "hf_s3cr3t"}))
    kube.put(secret("tsec", {"cpu": "12", "unrelated": "z"}))


def kubectl_env(kube, containers: dict[str, dict]) -> dict[str, dict[str, str | None]]:
    """{container: {variable: value, or None where kubectl names the source but prints no value}}
    as kubectl composes it (see the module). Each container is rebuilt in a scratch Deployment."""
    scratch = deployment("oracle")
    scratch["spec"]["template"]["spec"]["containers"] = [{"name": c, "image": "i"} for c in containers]
    kube.put(scratch)
    for cname, c in containers.items():
        for entry in c.get("envFrom") or []:
            field = "configMapRef" if "configMapRef" in entry else "secretRef"
            ref, kind = entry[field], "configmap" if field == "configMapRef" else "secret"
            if ref.get("optional") and kube.get("ConfigMap" if kind == "configmap" else "Secret", NS, ref["name"]) \
                    is None:
                continue  # the kubelet's rule: an absent optional source gives nothing
            kubectl(kube, "set", "env", "deployment/oracle", "-c", cname, f"--from={kind}/{ref['name']}",
                    f"--prefix={entry.get('prefix', '')}")
    explicit = {cname: [e for e in c.get("env") or [] if not _absent_optional(kube, e)]
                for cname, c in containers.items()}
    # env over envFrom: a strategic merge keyed by name; a name envFrom gave is first deleted, so that
    # a `value` does not merge into a `valueFrom` entry (a merge would keep both fields)
    taken = {c["name"]: {e["name"] for e in c.get("env") or []}
             for c in kube.get("Deployment", NS, "oracle")["spec"]["template"]["spec"]["containers"]}
    deletes = {cname: [{"name": e["name"], "$patch": "delete"} for e in env if e["name"] in taken[cname]]
               for cname, env in explicit.items()}
    for step in (deletes, explicit):
        patch = {"spec": {"template": {"spec": {"containers": [
            {"name": cname, "env": entries} for cname, entries in step.items() if entries]}}}}
        if patch["spec"]["template"]["spec"]["containers"]:
            kubectl(kube, "patch", "deployment/oracle", "--type", "strategic", "-p", json.dumps(patch))
    out: dict[str, dict[str, str | None]] = {}
    current = ""
    for line in kubectl(kube, "set", "env", "deployment/oracle", "--list", "--resolve").splitlines():
        if line.startswith("# Deployment oracle, container "):
            current = line.rsplit(" ", 1)[1]
            out[current] = {}
        elif line.startswith("# "):
            out[current][line.split()[1]] = None  # named, not resolved (e.g. a fieldRef)
        elif "=" in line:
            name, value = line.split("=", 1)
            out[current][name] = value
    return out


def _absent_optional(kube, entry: dict) -> bool:
    """The kubelet's rule: a `valueFrom` key that is absent and `optional` leaves the variable as it was."""
    for field, kind in (("configMapKeyRef", "ConfigMap"), ("secretKeyRef", "Secret")):
        ref = (entry.get("valueFrom") or {}).get(field)
        if ref and ref.get("optional"):
            obj = kube.get(kind, NS, ref["name"])
            return obj is None or ref["key"] not in (obj.get("data") or {})
    return False


def agent_env(kube, container: dict) -> dict[str, object]:
    api = KubeApi(kube.api_client())
    lookup = container_sources(api.read, [container], NS, NAMES)
    return resolve_env(container, NS, lookup, NAMES)


def test_the_agent_reads_what_kubectl_composes(kube):
    _sources(kube)
    containers = {f"c{i}": {"name": f"c{i}", "envFrom": ef, "env": env}
                  for i, (ef, env) in enumerate(CASES.values())}
    oracle = kubectl_env(kube, containers)
    for (case, _), (cname, c) in zip(CASES.items(), containers.items(), strict=True):
        want = {k: v for k, v in oracle[cname].items() if k in NAMES}
        got = agent_env(kube, c)
        assert set(got) == set(want), case
        for name, found in got.items():
            if found.value is None:  # refused, never guessed: only an envFrom Secret's value is unread
                assert found.origin == "Secret llm/keys (envFrom)" and found.certain and want[name], (case, name)
            else:
                assert found.value == want[name], (case, name, found)


@pytest.mark.parametrize("case, entry, reason", [
    ("required-absent", {"envFrom": [_cm("absent")]}, "it does not exist and is not optional"),
    ("field-ref", {"env": [{"name": CPU, "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}}]},
     "the kubelet fills it in"),
    ("expansion", {"env": [{"name": "CPU", "value": "9"}, {"name": CPU, "value": "$(CPU)"}]}, "expansion"),
])
def test_what_kubectl_cannot_compute_is_refused_by_the_agent(kube, case, entry, reason):
    _sources(kube)
    c = {"name": "c", **entry}
    try:
        printed = kubectl_env(kube, {"c": c})["c"].get(CPU)
    except KubectlPatchError as exc:  # kubectl refuses --from an absent object: so does the kubelet
        printed = str(exc)
    assert printed != "9", "kubectl does not expand $(VAR)"
    found = agent_env(kube, c)[CPU]
    assert found.value is None and reason in found.why, (case, found)


def _running(kube, container: str = "vllm") -> dict[str, str | None]:
    live = kube.get("Deployment", NS, "vllm")
    c = next(c for c in live["spec"]["template"]["spec"]["containers"] if c["name"] == container)
    return kubectl_env(kube, {container: c})[container]


def test_after_apply_and_rollback_current_is_what_kubectl_says_runs(kube):
    """deployment-env over envFrom and valueFrom: after every step, current() is what the pods'
    environment holds by kubectl's reading of the live Deployment."""
    _sources(kube)
    dep = deployment("vllm", env=[{"name": "OTHER", "value": "o"}])
    dep["spec"]["template"]["spec"]["containers"][0]["envFrom"] = [_cm("first"), {**_cm("second"),
                                                                                  "prefix": "LMCACHE_"}]
    kube.put(dep)
    act = actuator_for(kube, [{"kind": "deployment-env", "name": "vllm", "container": "vllm"}], FakeTime())

    def check():
        env, live = _running(kube), act.current()
        assert (live.cpu_gib, live.chunk_tokens) == (float(env[CPU]), int(env[CHUNK])), env

    check()
    start = act.current()
    act.mark_good(start)
    act.apply(start.replace(cpu_gib=8.0, chunk_tokens=2048))  # env entries over envFrom
    check()
    act.rollback()  # the entries removed: envFrom runs again
    check()
    assert act.current() == start
    kube.edit("ConfigMap", NS, "second", lambda cm: cm["data"].update(MAX_LOCAL_CPU_SIZE="24"))  # a person
    check()
