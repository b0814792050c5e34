"""deploy/: every overlay rendered by `kubectl kustomize`, validated by kubernetes-validate, and its
RBAC compared with the verbs the agent's code uses (agent/k8s/rbac.py)."""
from __future__ import annotations

import re
import subprocess
from pathlib import Path

import kubernetes_validate
import pytest
import yaml

from agent.k8s.mapping import load_mappings
from agent.k8s.rbac import required_rules, used_verbs
from agent.k8s.settings import settings_from_mapping
from agent.settings import load_settings as load_agent_settings
from tests.conftest import REPO_ROOT
from tests.support.kube import kubectl_path

DEPLOY = REPO_ROOT / "deploy"
OVERLAYS = ("plain-vllm", "production-stack", "hyperpod", "live", "sharded", "prometheus-source", "native-tiering")
LIVE_TUNING = DEPLOY / "components" / "live-tuning"  # turns any overlay live (the PostgreSQL study)
CUSTOM_KINDS = {"ServiceMonitor", "PodMonitor", "PrometheusRule"}  # Prometheus Operator: no schema offline


@pytest.fixture(scope="module")
def rendered() -> dict[str, list[dict]]:
    out = {}
    for overlay in OVERLAYS:
        proc = subprocess.run([kubectl_path(), "kustomize", str(DEPLOY / "overlays" / overlay)],
                              capture_output=True, text=True, timeout=120, check=False)
        assert proc.returncode == 0, f"{overlay}: {proc.stderr}"
        out[overlay] = [d for d in yaml.safe_load_all(proc.stdout) if d]
    return out


def _one(docs, kind, name=None):
    found = [d for d in docs if d["kind"] == kind and (name is None or d["metadata"]["name"] == name)]
    assert len(found) == 1, (kind, name, [d["metadata"]["name"] for d in found])
    return found[0]


def workload(docs) -> dict:
    """The agent's workload: the Deployment, or the StatefulSet of a sharded install."""
    found = [d for d in docs if d["kind"] in ("Deployment", "StatefulSet") and d["metadata"]["name"] == "tierpilot"]
    assert len(found) == 1, [d["kind"] for d in found]
    return found[0]


def _config(docs) -> dict[str, str]:
    cms = [d for d in docs if d["kind"] == "ConfigMap" and d["metadata"]["name"].startswith("tierpilot-config-")]
    assert len(cms) == 1
    return cms[0]["data"]


def rbac_problems(roles: list[dict], expected: list[dict]) -> list[str]:
    """Why these Roles are not exactly the least privilege `expected` (empty when they are)."""
    problems = []
    used = used_verbs()
    target_plurals = {r["resources"][0] for r in expected if r.get("resourceNames") and r["resources"][0] not in
                      ("leases",)}

    def flat(rules):
        return {(g, res, v, n) for r in rules for g in r.get("apiGroups", []) for res in r.get("resources", [])
                for v in r.get("verbs", []) for n in (r.get("resourceNames") or ["<any>"])}

    have = flat([rule for role in roles for rule in role.get("rules", [])])
    for g, res, v, n in sorted(have):
        if "*" in (g, res, v, n):
            problems.append(f"wildcard in rule {g}/{res} {v} {n}")
        allowed = used.get("targets", set()) if res in target_plurals else used.get(res, set())
        if v not in allowed:
            problems.append(f"verb {v!r} on {res} is never used by the agent's code (uses: {sorted(allowed)})")
    want = flat(expected)
    problems += [f"extra grant {x}" for x in sorted(have - want)]
    problems += [f"missing grant {x}" for x in sorted(want - have)]
    return problems


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_overlay_renders_and_validates(rendered, overlay):
    docs = rendered[overlay]
    kinds = sorted(d["kind"] for d in docs)
    for kind in ("ServiceAccount", "Role", "RoleBinding", "Service", "ServiceMonitor", "PodMonitor",
                 "PrometheusRule", "ConfigMap"):
        assert kind in kinds, (overlay, kind)
    assert workload(docs)["kind"] == ("StatefulSet" if overlay == "sharded" else "Deployment")
    assert not {"ClusterRole", "ClusterRoleBinding"} & set(kinds), "nothing cluster-wide"
    for doc in docs:
        if doc["kind"] in CUSTOM_KINDS:
            continue
        kubernetes_validate.validate(doc, "1.37.0", strict=True)  # raises on any schema error


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_rbac_is_exactly_what_the_code_uses(rendered, overlay):
    docs = rendered[overlay]
    settings = settings_from_mapping(yaml.safe_load(_config(docs)["targets.yaml"]), source=f"{overlay} targets")
    roles = [d for d in docs if d["kind"] == "Role"]
    assert {r["metadata"]["namespace"] for r in roles} == {settings.namespace}
    agent = yaml.safe_load(_config(docs)["agent.yaml"])
    scrapes = agent.get("source", "scrape") == "scrape"
    env = {e["name"]: e.get("value") for e in workload(docs)["spec"]["template"]["spec"]["containers"][0]["env"]}
    # observing (shadow mode) the agent writes nothing; live (components/live-tuning), within tuner.apply
    writes = agent["tuner"]["apply"] if env["TIERPILOT_TUNER__MODE"] == "live" else "none"
    assert (writes == "none") is (overlay != "live")
    assert rbac_problems(roles, required_rules(settings, pod_watch=scrapes, writes=writes)) == []
    bound = {b["roleRef"]["name"] for b in docs if b["kind"] == "RoleBinding"}
    assert bound == {r["metadata"]["name"] for r in roles}
    assert all(s["name"] == "tierpilot" for b in docs if b["kind"] == "RoleBinding" for s in b["subjects"])


def test_the_rbac_check_catches_wildcards_and_unused_verbs(rendered):
    docs = rendered["plain-vllm"]
    settings = settings_from_mapping(yaml.safe_load(_config(docs)["targets.yaml"]))
    roles = [d for d in docs if d["kind"] == "Role"]
    expected = required_rules(settings)
    wild = yaml.safe_load(yaml.safe_dump(roles))
    wild[0]["rules"][0]["verbs"] = ["*"]
    assert any("wildcard" in p for p in rbac_problems(wild, expected))
    extra = yaml.safe_load(yaml.safe_dump(roles))
    extra[1]["rules"][0]["verbs"].append("delete")
    assert any("'delete' on deployments is never used" in p for p in rbac_problems(extra, expected))
    unnamed = yaml.safe_load(yaml.safe_dump(roles))
    for role in unnamed:
        for rule in role["rules"]:
            rule.pop("resourceNames", None)
    assert any(p.startswith("extra grant") for p in rbac_problems(unnamed, expected))


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_agent_deployment_is_locked_down_and_wired(rendered, overlay, tmp_path):
    docs = rendered[overlay]
    dep = workload(docs)
    pod = dep["spec"]["template"]["spec"]
    (c,) = pod["containers"]
    assert pod["securityContext"]["runAsNonRoot"] is True and pod["securityContext"]["runAsUser"] != 0
    assert c["securityContext"] == {"allowPrivilegeEscalation": False, "readOnlyRootFilesystem": True,
                                    "capabilities": {"drop": ["ALL"]}}
    assert set(c["resources"]) == {"requests", "limits"}
    assert {"cpu", "memory"} <= set(c["resources"]["requests"]) and {"cpu", "memory"} <= set(c["resources"]["limits"])
    assert c["readinessProbe"]["httpGet"]["path"] == "/readyz"  # 503 until the first scrape cycle
    assert c["livenessProbe"]["httpGet"]["path"] == "/healthz"  # 503 when the scheduler is stuck
    port = {p["name"]: p["containerPort"] for p in c["ports"]}["metrics"]
    env = {e["name"]: e.get("value") for e in c["env"]}
    assert env["TIERPILOT_DRY_RUN"] == ("false" if overlay == "live" else "true")  # observe only unless live
    mounts = {m["mountPath"]: m["name"] for m in c["volumeMounts"]}
    assert mounts["/etc/tierpilot"] == "config"
    config_volume = next(v for v in pod["volumes"] if v["name"] == "config")
    data = _config(docs)
    assert config_volume["configMap"]["name"] == next(
        d["metadata"]["name"] for d in docs if d["kind"] == "ConfigMap" and "targets.yaml" in d.get("data", {}))
    assert Path(env["TIERPILOT_K8S_TARGETS"]).name in data and Path(c["args"][-1]).name in data
    (tmp_path / "agent.yaml").write_text(data["agent.yaml"])
    agent = load_agent_settings(path=tmp_path / "agent.yaml", env={})
    assert agent.server.port == port
    assert agent.targets.kubernetes.namespace == yaml.safe_load(data["targets.yaml"])["namespace"]

    svc = _one(docs, "Service", "tierpilot")
    assert svc["spec"]["selector"].items() <= dep["spec"]["template"]["metadata"]["labels"].items()
    sm = _one(docs, "ServiceMonitor")
    assert sm["spec"]["selector"]["matchLabels"].items() <= svc["metadata"]["labels"].items()
    assert sm["spec"]["endpoints"][0]["port"] in {p["name"] for p in svc["spec"]["ports"]}
    pm = _one(docs, "PodMonitor")
    assert pm["spec"]["selector"]["matchLabels"] and pm["spec"]["podMetricsEndpoints"][0]["path"] == "/metrics"
    rule = _one(docs, "PrometheusRule")
    assert rule["spec"]["groups"], "the dashboards' alert rules are wrapped"
    if overlay == "sharded":
        assert_sharded_wiring(docs, agent, dep)


def assert_sharded_wiring(docs: list[dict], agent, sts: dict) -> None:
    """A sharded install: one StatefulSet pod per shard behind a headless Service, every replica a
    peer by its stable name (the agent skips its own), the token mounted from a Secret as a
    projected key (updated on rotation, unlike a subPath), fleet series exported by every shard."""
    from agent.collect.shard import other_peers

    count = agent.shard.count
    assert count > 1 and sts["spec"]["replicas"] == count and agent.export.fleet == "all"
    peers_svc = _one(docs, "Service", sts["spec"]["serviceName"])
    assert peers_svc["spec"]["clusterIP"] == "None" and peers_svc["spec"]["publishNotReadyAddresses"] is True
    assert peers_svc["spec"]["selector"].items() <= sts["spec"]["template"]["metadata"]["labels"].items()
    assert peers_svc["metadata"]["labels"]["app.kubernetes.io/component"] != "agent"  # not scraped twice
    svc = sts["spec"]["serviceName"]
    assert len(agent.shard.peers) == count
    for i in range(count):
        assert other_peers(agent.shard.peers, f"tierpilot-{i}") == tuple(
            p for p in agent.shard.peers if not p.startswith(f"http://tierpilot-{i}.{svc}."))
        assert len(other_peers(agent.shard.peers, f"tierpilot-{i}")) == count - 1
    pod = sts["spec"]["template"]["spec"]
    (c,) = pod["containers"]
    mount = next(m for m in c["volumeMounts"] if m["name"] == "peer-token")
    assert "subPath" not in mount and mount["readOnly"] is True
    secret = next(v for v in pod["volumes"] if v["name"] == "peer-token")["secret"]
    assert agent.shard.token_file == Path(mount["mountPath"]) / secret["items"][0]["path"]
    assert agent.shard.allow_unauthenticated is False
    egress = _one(docs, "NetworkPolicy")["spec"]["egress"]
    assert any(r.get("to") == [{"podSelector": {"matchLabels": sts["spec"]["selector"]["matchLabels"]}}]
               and r["ports"] == [{"port": 9400, "protocol": "TCP"}] for r in egress)


def test_dockerfile_runs_as_non_root_and_copies_only_what_exists():
    text = (DEPLOY / "Dockerfile").read_text()
    users = re.findall(r"^USER\s+(\S+)", text, re.MULTILINE)
    assert users and users[-1].split(":")[0] not in ("0", "root")
    assert re.search(r"^EXPOSE 9400$", text, re.MULTILINE)
    assert 'ENTRYPOINT ["tierpilot"]' in text
    for src in re.findall(r"^COPY (?!--from)(.+) \S+$", text, re.MULTILINE):
        for item in src.split():
            assert (REPO_ROOT / item).exists(), f"Dockerfile copies missing {item}"


def test_deploy_doc_covers_every_style_and_target_kind():
    doc = (REPO_ROOT / "docs" / "deploy.md").read_text()
    for phrase in ("plain cluster", "production-stack", "HyperPod", "dry-run", "restart"):
        assert phrase.lower() in doc.lower(), phrase
    for kind in load_mappings():
        assert f"`{kind}`" in doc, kind


def test_declared_discovery_calls_match_agent_discovery():
    """rbac.DISCOVERY_CALLS stands for agent/collect/discovery.py: it lists pods in one namespace and watches them."""
    from agent.k8s.rbac import DISCOVERY_CALLS

    source = (REPO_ROOT / "agent" / "collect" / "discovery.py").read_text()
    assert {(c.verb, c.resource) for c in DISCOVERY_CALLS} == {("list", "Pod"), ("watch", "Pod")}
    assert "list_namespaced_pod" in source and "watch.Watch" in source
    assert "read_namespaced_pod" not in source  # so the Role needs no `get` on pods
