"""deploy/helm/tierpilot: a plain `helm install` observes only. With the default values the tuner
plans in dry-run (the agent's own settings, read from the rendered ConfigMap and environment, say
so), the study needs no Secret (every object the pods reference is rendered), live tuning needs a
persistent study, the Prometheus Operator objects are rendered only when the cluster serves their
CRDs (or the values ask), and NOTES.txt says all of that at install time."""
from __future__ import annotations

import json
import shutil

import pytest
import yaml

from agent.runtime.assembly import actuation_settings
from agent.settings import load_settings as load_agent_settings
from tests.test_helm_chart import CHART, MONITORING, OPERATOR_CRDS, RELEASE, _one, helm, template
from tests.test_k8s_deploy import workload

POSTGRESQL = ["--set", "tuner.storage.type=postgresql", "--set", "tuner.storage.existingSecret=study-dsn"]
STUDY = "sqlite:////var/lib/tierpilot/tierpilot.db"


def literal_env(docs: list[dict]) -> dict[str, str]:
    (c,) = workload(docs)["spec"]["template"]["spec"]["containers"]
    return {e["name"]: e["value"] for e in c["env"] if "value" in e}


def agent_settings(docs: list[dict], tmp_path):
    """The settings the agent runs with: the rendered agent.yaml and the container's literal env."""
    data = _one(docs, "ConfigMap", "tierpilot-config")["data"]
    (tmp_path / "agent.yaml").write_text(data["agent.yaml"])
    env = literal_env(docs)
    if "targets.yaml" in data:
        (tmp_path / "targets.yaml").write_text(data["targets.yaml"])
        assert env["TIERPILOT_K8S_TARGETS"] == "/etc/tierpilot/targets.yaml"
        env["TIERPILOT_K8S_TARGETS"] = str(tmp_path / "targets.yaml")
    else:
        assert "TIERPILOT_K8S_TARGETS" not in env
    return load_agent_settings(path=tmp_path / "agent.yaml", env=env), env


def unresolved_references(docs: list[dict]) -> list[tuple[str, str]]:
    """Objects the pods reference by name (Secrets, ConfigMaps, claims, the ServiceAccount) that the
    render does not create: each one a pod that waits on something the user never made. (A
    StatefulSet's volumeClaimTemplates are made by the StatefulSet: they are no `volumes` entry.)"""
    created = {(d["kind"], d["metadata"]["name"]) for d in docs}
    refs: set[tuple[str, str]] = set()
    for d in docs:
        if d["kind"] not in ("Deployment", "StatefulSet"):
            continue
        pod = d["spec"]["template"]["spec"]
        if "serviceAccountName" in pod:  # else the namespace's own `default`
            refs.add(("ServiceAccount", pod["serviceAccountName"]))
        refs |= {("Secret", s["name"]) for s in pod.get("imagePullSecrets", [])}
        for c in pod["containers"] + pod.get("initContainers", []):
            for e in c.get("env", []):
                ref = e.get("valueFrom", {})
                if "secretKeyRef" in ref:
                    refs.add(("Secret", ref["secretKeyRef"]["name"]))
                if "configMapKeyRef" in ref:
                    refs.add(("ConfigMap", ref["configMapKeyRef"]["name"]))
            for e in c.get("envFrom", []):
                refs |= {(kind, e[key]["name"]) for key, kind in (("secretRef", "Secret"),
                                                                  ("configMapRef", "ConfigMap")) if key in e}
        for v in pod.get("volumes", []):
            if "secret" in v:
                refs.add(("Secret", v["secret"]["secretName"]))
            if "configMap" in v:
                refs.add(("ConfigMap", v["configMap"]["name"]))
            if "persistentVolumeClaim" in v:
                refs.add(("PersistentVolumeClaim", v["persistentVolumeClaim"]["claimName"]))
    return sorted(refs - created)


def notes(tmp_path, *args: str) -> str:
    """NOTES.txt as `helm install` prints it: `helm template` skips NOTES.txt, so a copy of the chart
    renders the same text through a define into a manifest (the same values, the same Capabilities)."""
    chart = tmp_path / "chart"
    shutil.copytree(CHART, chart)
    text = (chart / "templates" / "NOTES.txt").read_text()
    (chart / "templates" / "_notes_under_test.tpl").write_text(
        '{{- define "notes-under-test" -}}\n' + text + "\n{{- end -}}\n")
    (chart / "templates" / "notes-under-test.yaml").write_text('notes: {{ include "notes-under-test" . | toJson }}\n')
    proc = helm("template", RELEASE, str(chart), "--namespace", "llm", "--show-only",
                "templates/notes-under-test.yaml", *args)
    assert proc.returncode == 0, proc.stderr
    return yaml.safe_load(proc.stdout)["notes"]


# -- the tuner ------------------------------------------------------------------------------------
LIVE = ["--set", "tuner.dryRun=false", *POSTGRESQL]
ENGINE = {"kind": "deployment-env", "name": "vllm", "container": "vllm"}
ROUTER = {"kind": "router-configmap", "name": "router-dyn", "key": "dynamic_config.json",
          "restart": [{"kind": "Deployment", "name": "vllm-router"}]}
TARGETS = ["--set-json", f"actuation.targets={json.dumps([ENGINE, ROUTER])}"]


def verbs_by_name(docs: list[dict]) -> dict[str, set[str]]:
    """Every verb a Role grants, by resourceName ("*" for unnamed rules)."""
    out: dict[str, set[str]] = {}
    for role in (d for d in docs if d["kind"] == "Role"):
        for rule in role["rules"]:
            for name in rule.get("resourceNames") or [f"*{rule['resources'][0]}"]:
                out.setdefault(name, set()).update(rule["verbs"])
    return out


def test_a_default_install_plans_in_shadow_mode_and_installs_no_example_target(tmp_path):
    docs = template()
    env = literal_env(docs)
    assert env["TIERPILOT_DRY_RUN"] == "true" and env["TIERPILOT_TUNER__MODE"] == "shadow"
    agent, env = agent_settings(docs, tmp_path)
    assert agent.tuner.enabled and agent.tuner.mode == "shadow" and agent.tuner.apply == "hot"
    assert actuation_settings(agent, env, required=False) is None  # no target: nothing is read or written
    assert "deployments" not in json.dumps([d for d in docs if d["kind"] == "Role"])
    assert not any("patch" in v or "create" in v and n == "*events" for n, v in verbs_by_name(docs).items())


@pytest.mark.parametrize("args, patched", [
    ([], set()),                                                  # the default: shadow, no target
    (["--set", "tuner.enabled=false", *TARGETS], set()),          # observe only
    (TARGETS, set()),                                             # shadow (dry-run) over named targets
    ([*LIVE, *TARGETS, "--set", "tuner.apply=none"], set()),      # live, every move a proposal
    ([*LIVE, *TARGETS], {"router-dyn", "vllm-router"}),           # live, apply hot (the default)
    ([*LIVE, *TARGETS, "--set", "tuner.apply=all"], {"router-dyn", "vllm-router", "vllm"}),
], ids=["default", "tuner-off", "shadow", "live-none", "live-hot", "live-all"])
def test_patch_is_granted_only_where_the_tuner_may_apply(args, patched):
    verbs = verbs_by_name(template(*args))
    assert {n for n, v in verbs.items() if "patch" in v} == patched
    assert ("create" in verbs.get("*events", set())) is bool(patched)  # Events only from a tuner that writes
    if "--set-json" in args and "tuner.enabled=false" not in args:
        assert verbs["vllm"] & {"get"} and verbs["router-dyn"] & {"get"}  # read what runs, whatever the mode


def test_live_tuning_needs_a_target_and_a_valid_apply():
    for args, message in (
        (LIVE, "tuner.dryRun=false needs actuation.targets"),
        ([*LIVE, *TARGETS, "--set", "tuner.apply=some"], 'tuner.apply: "some" is not none, hot or all'),
    ):
        proc = helm("template", RELEASE, str(CHART), *args)
        assert proc.returncode != 0 and message in proc.stderr, (args, proc.stderr)


def test_network_policy_scopes_the_api_server_and_the_metrics_port(tmp_path):
    policy = _one(template(), "NetworkPolicy")["spec"]
    assert "from" not in policy["ingress"][0] and "to" not in policy["egress"][-1]  # unknown: open, and said so
    text = notes(tmp_path)
    assert "API server egress: ports 443, 6443 to ANY address" in text
    assert "kubectl get endpoints kubernetes -n default" in text and "monitoringNamespace" in text
    docs = template("--set", "networkPolicy.monitoringNamespace=monitoring",
                    "--set", "networkPolicy.apiServer.cidrs={10.0.0.1/32}")
    policy = _one(docs, "NetworkPolicy")["spec"]
    assert policy["ingress"][0]["from"] == [
        {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}}}]
    assert policy["egress"][-1]["to"] == [{"ipBlock": {"cidr": "10.0.0.1/32"}}]
    text = notes(tmp_path / "scoped", "--set", "networkPolicy.monitoringNamespace=monitoring",
                 "--set", "networkPolicy.apiServer.cidrs={10.0.0.1/32}")
    assert "the namespace monitoring only" in text and "API server egress: 10.0.0.1/32." in text


def test_the_default_study_is_ephemeral_and_needs_nothing(tmp_path):
    docs = template()
    agent, _ = agent_settings(docs, tmp_path)
    assert agent.tuner.storage == STUDY
    pod = workload(docs)["spec"]["template"]["spec"]
    (c,) = pod["containers"]
    state = next(m for m in c["volumeMounts"] if m["mountPath"] == "/var/lib/tierpilot")
    volume = next(v for v in pod["volumes"] if v["name"] == state["name"])
    assert set(volume) == {"name", "emptyDir"} and volume["emptyDir"].get("medium") != "Memory"
    assert not [d for d in docs if d["kind"] in ("Secret", "PersistentVolumeClaim", "StatefulSet")]
    egress = _one(docs, "NetworkPolicy")["spec"]["egress"]
    assert 5432 not in {p["port"] for r in egress for p in r["ports"]}  # no PostgreSQL to reach


@pytest.mark.parametrize("args", [
    [],
    ["--set", "tuner.enabled=false"],
    ["--set", "shard.count=3", "--set", "export.fleet=all"],
    ["--set", "replicaCount=1", "--set", "tuner.storage.type=sqlite", "--set", "export.fleet=all"],
    ["--set", "tuner.storage.type=postgresql", "--set", "postgresql.enabled=true"],
    ["--set", "tuner.dryRun=false", "--set", "tuner.storage.type=postgresql", "--set", "postgresql.enabled=true",
     *TARGETS],
    OPERATOR_CRDS,
], ids=["default", "tuner-off", "sharded", "sqlite", "bundled-postgresql", "live-bundled-postgresql", "crds"])
def test_the_pods_reference_only_what_the_release_creates(args):
    assert unresolved_references(template(*args)) == []


def test_the_check_finds_a_missing_secret():
    docs = template(*POSTGRESQL)
    assert unresolved_references(docs) == [("Secret", "study-dsn")]


@pytest.mark.parametrize("args, storage", [
    (POSTGRESQL, None),
    (["--set", "tuner.storage.type=sqlite", "--set", "replicaCount=1", "--set", "export.fleet=all"], STUDY),
])
def test_live_tuning_with_a_persistent_study(tmp_path, args, storage):
    docs = template("--set", "tuner.dryRun=false", *args, *TARGETS)
    agent, env = agent_settings(docs, tmp_path)
    assert env["TIERPILOT_DRY_RUN"] == "false" and agent.dry_run is False
    assert agent.tuner.mode == "live" and agent.tuner.apply == "hot"
    assert actuation_settings(agent, env).dry_run is False
    (c,) = workload(docs)["spec"]["template"]["spec"]["containers"]
    study = next(e for e in c["env"] if e["name"] == "TIERPILOT_TUNER__STORAGE")
    if storage is None:
        assert study["valueFrom"]["secretKeyRef"] == {"name": "study-dsn", "key": "dsn"}
    else:
        assert agent.tuner.storage == storage
        _one(docs, "PersistentVolumeClaim", "tierpilot-state")


@pytest.mark.parametrize("args, message", [
    (["--set", "tuner.dryRun=false", *TARGETS],
     ("tuner.dryRun=false needs a persistent study: set tuner.storage.type to postgresql "
      "(or sqlite with replicaCount: 1)")),
    (["--set", "tuner.dryRun=maybe"], 'tuner.dryRun: "maybe" is not true or false'),
    (["--set", "tuner.storage.type=pvc"], 'tuner.storage.type: "pvc" is not ephemeral, sqlite or postgresql'),
    (["--set", "postgresql.enabled=true"],
     "postgresql.enabled=true holds the study only with tuner.storage.type=postgresql"),
    (["--set", "serviceMonitor.enabled=yes"], 'serviceMonitor.enabled: "yes" is not auto, true or false'),
    (["--set", "podMonitor.enabled=on"], 'podMonitor.enabled: "on" is not auto, true or false'),
    (["--set", "prometheusRule.enabled=crds"], 'prometheusRule.enabled: "crds" is not auto, true or false'),
])
def test_unsafe_or_unknown_values_fail_with_one_line(args, message):
    proc = helm("template", RELEASE, str(CHART), *args)
    assert proc.returncode != 0 and message in proc.stderr.splitlines()[0], (args, proc.stderr)


def test_tuning_off_needs_no_study():
    docs = template("--set", "tuner.enabled=false", "--set", "tuner.dryRun=false")
    pod = workload(docs)["spec"]["template"]["spec"]
    assert {v["name"] for v in pod["volumes"]} == {"config", "tmp"}
    assert "TIERPILOT_TUNER__STORAGE" not in {e["name"] for e in pod["containers"][0]["env"]}


# -- the Prometheus Operator objects --------------------------------------------------------------
def monitoring_kinds(docs: list[dict]) -> set[str]:
    return {d["kind"] for d in docs if d["apiVersion"].startswith("monitoring.coreos.com/")}


def test_no_prometheus_operator_object_without_its_crd():
    assert monitoring_kinds(template()) == set()


@pytest.mark.parametrize("kind", MONITORING.values())
def test_auto_renders_exactly_the_kinds_the_cluster_serves(kind):
    assert monitoring_kinds(template("--api-versions", f"monitoring.coreos.com/v1/{kind}")) == {kind}
    assert monitoring_kinds(template(*OPERATOR_CRDS)) == set(MONITORING.values())


@pytest.mark.parametrize("key", MONITORING)
def test_true_forces_and_false_refuses(key):
    assert monitoring_kinds(template("--set", f"{key}.enabled=true")) == {MONITORING[key]}
    assert monitoring_kinds(template("--set", f"{key}.enabled=auto")) == set()
    assert monitoring_kinds(template(*OPERATOR_CRDS, "--set", f"{key}.enabled=false")) == set(MONITORING.values()) - {
        MONITORING[key]}


# -- NOTES.txt ------------------------------------------------------------------------------------
def test_notes_say_shadow_the_image_to_build_and_how_to_go_live(tmp_path):
    text = notes(tmp_path)
    assert "SHADOW (nothing is changed)" in text and "no patch" in text
    assert "Targets: none (actuation.targets" in text
    assert "docker build -f deploy/Dockerfile -t ghcr.io/tierpilot/tierpilot:0.1.0 ." in text  # build it first
    assert "--set tuner.dryRun=false" in text and "tuner.storage.type=postgresql" in text
    named = notes(tmp_path / "named", *TARGETS)
    assert "deployment-env vllm, router-configmap router-dyn (read only)" in named  # what it reads
    live = notes(tmp_path / "live", *LIVE, *TARGETS)
    assert "LIVE, tuner.apply=hot: the router's knobs; restart-requiring moves are proposals" in live
    assert "tierpilot k8s apply-proposal" in live and "SHADOW" not in live and "Study: postgresql" in live
    assert "Tuning: off" in notes(tmp_path / "off", "--set", "tuner.enabled=false")


def test_notes_say_which_monitoring_objects_were_rendered_and_why_not(tmp_path):
    text = notes(tmp_path)
    for key, kind in MONITORING.items():
        line = next(line for line in text.splitlines() if line.strip().startswith(kind))
        assert "not rendered" in line and f"monitoring.coreos.com/v1/{kind}" in line, line
        assert f"--set {key}.enabled=true" in line, line
    assert "Prometheus Operator" in text
    text = notes(tmp_path / "crds", *OPERATOR_CRDS, "--set", "prometheusRule.enabled=false")
    lines = {kind: next(line for line in text.splitlines() if line.strip().startswith(kind))
             for kind in MONITORING.values()}
    assert "not rendered" not in lines["ServiceMonitor"] and "rendered" in lines["ServiceMonitor"]
    assert "rendered" in lines["PodMonitor"] and "not rendered" not in lines["PodMonitor"]
    assert "prometheusRule.enabled=false" in lines["PrometheusRule"] and "off" in lines["PrometheusRule"]
