"""deploy/helm/tierpilot with `source.type: prometheus`: the agent.yaml the chart writes loads with
the agent's own parser and points at files the Deployment really mounts from the named Secrets and
ConfigMaps; nothing of direct scraping is rendered (no scrape ports, no pod watch unless KV events
need it); bad combinations fail the render with a one-line message naming the key."""
from __future__ import annotations

import json
import re
from pathlib import PurePosixPath
from typing import get_args

import kubernetes_validate
import pytest
import yaml

from agent.k8s.rbac import required_rules
from agent.k8s.settings import settings_from_mapping
from agent.settings import load_settings as load_agent_settings
from contracts.tier_model import Role
from tests.conftest import REPO_ROOT
from tests.test_helm_chart import CHART, CUSTOM_KINDS, RELEASE, _one, helm, template
from tests.test_k8s_deploy import rbac_problems, workload

URL = "https://mimir.example.net:8443/prometheus"
FULL = {
    "source": {"type": "prometheus", "prometheus": {
        "url": URL, "roles": {"vllm": 'job="llm/tierpilot-vllm"', "lmcache": 'job="lmcache"'},
        "podLabel": "kubernetes_pod_name", "namespaceLabel": "kubernetes_namespace", "timeoutSeconds": 7.5,
        "aggregate": "agent",
        "bearerToken": {"secretName": "mimir-token", "key": "jwt"},
        "tls": {"ca": {"secretName": "mimir-ca", "key": "root.pem"},
                "clientCert": {"secretName": "mimir-client", "certKey": "c.pem", "keyKey": "k.pem"},
                "insecureSkipVerify": True}}},
}
SCRAPE_PORTS = {8000, 8001, 9001, 9002, 9003, 9090}


def render(values: dict, *args: str) -> list[dict]:
    return template("--set-json", f"source={json.dumps(values['source'])}", *args)


def agent_settings(docs: list[dict], tmp_path):
    data = _one(docs, "ConfigMap", "tierpilot-config")["data"]
    (tmp_path / "agent.yaml").write_text(data["agent.yaml"])
    return load_agent_settings(path=tmp_path / "agent.yaml", env={}), data


def mounted_source(pod: dict, path) -> tuple[str, str, str]:
    """What the container sees at `path`: (secret|configMap, object name, key), through its
    volumeMounts and the volume's items; fails when nothing mounts it."""
    (c,) = pod["containers"]
    path = PurePosixPath(path)
    for m in c["volumeMounts"]:
        if path.parent != PurePosixPath(m["mountPath"]):
            continue
        assert "subPath" not in m and m["readOnly"] is True, m  # a subPath never sees a rotation
        vol = next(v for v in pod["volumes"] if v["name"] == m["name"])
        kind = "secret" if "secret" in vol else "configMap"
        src = vol[kind]
        name = src["secretName"] if kind == "secret" else src["name"]
        (key,) = [i["key"] for i in src["items"] if i["path"] == path.name]
        return kind, name, key
    raise AssertionError(f"nothing mounts {path}: {c['volumeMounts']}")


def egress_ports(docs: list[dict]) -> set[int]:
    return {p["port"] for r in _one(docs, "NetworkPolicy")["spec"]["egress"] for p in r["ports"]}


def test_every_key_reaches_the_agent_and_every_file_is_mounted(tmp_path):
    docs = render(FULL)
    for doc in docs:
        if doc["kind"] not in CUSTOM_KINDS:
            kubernetes_validate.validate(doc, "1.37.0", strict=True)
    agent, _ = agent_settings(docs, tmp_path)
    p = agent.prometheus
    assert agent.source == "prometheus" and p.url == URL
    assert p.roles == FULL["source"]["prometheus"]["roles"]
    assert (p.pod_label, p.namespace_label, p.timeout_s, p.aggregate) == (
        "kubernetes_pod_name", "kubernetes_namespace", 7.5, "agent")
    assert p.basic_auth is None and p.tls.insecure_skip_verify is True
    pod = workload(docs)["spec"]["template"]["spec"]
    assert mounted_source(pod, p.bearer_token_file) == ("secret", "mimir-token", "jwt")
    assert mounted_source(pod, p.tls.ca_file) == ("secret", "mimir-ca", "root.pem")
    assert mounted_source(pod, p.tls.cert_file) == ("secret", "mimir-client", "c.pem")
    assert mounted_source(pod, p.tls.key_file) == ("secret", "mimir-client", "k.pem")
    assert len({m["mountPath"] for m in pod["containers"][0]["volumeMounts"]}) == len(
        pod["containers"][0]["volumeMounts"])


def test_basic_auth_and_a_ca_from_a_configmap(tmp_path):
    values = {"source": {"type": "prometheus", "prometheus": {
        "url": "http://thanos-query.monitoring:10902",
        "basicAuth": {"username": "tierpilot", "secretName": "thanos-auth", "passwordKey": "pw"},
        "tls": {"ca": {"configMapName": "kube-root-ca.crt"}}}}}
    docs = render(values)
    agent, _ = agent_settings(docs, tmp_path)
    p = agent.prometheus
    assert p.bearer_token_file is None and p.basic_auth.username == "tierpilot"
    assert p.aggregate == "server" and (p.pod_label, p.namespace_label, p.timeout_s) == ("pod", "namespace", 10)
    assert p.tls.cert_file is None and p.tls.insecure_skip_verify is False
    pod = workload(docs)["spec"]["template"]["spec"]
    assert mounted_source(pod, p.basic_auth.password_file) == ("secret", "thanos-auth", "pw")
    assert mounted_source(pod, p.tls.ca_file) == ("configMap", "kube-root-ca.crt", "ca.crt")
    assert 10902 in egress_ports(docs)


def test_without_credentials_nothing_is_mounted(tmp_path):
    docs = render({"source": {"type": "prometheus", "prometheus": {"url": "http://prometheus:9090"}}})
    agent, _ = agent_settings(docs, tmp_path)
    assert agent.prometheus.bearer_token_file is None and agent.prometheus.basic_auth is None
    assert agent.prometheus.tls.ca_file is None
    pod = workload(docs)["spec"]["template"]["spec"]
    assert {v["name"] for v in pod["volumes"]} == {"config", "state", "tmp"}  # state: the tuner's study


def _pod_rules(docs: list[dict]) -> list[dict]:
    return [r for d in docs if d["kind"] == "Role" for r in d["rules"] if "pods" in r["resources"]]


@pytest.mark.parametrize("kv_events, tuner", [(True, True), (False, True), (False, False), (True, False)])
def test_nothing_of_direct_scraping_is_rendered(tmp_path, kv_events, tuner):
    """No scrape ports in the NetworkPolicy, the query API's port instead; pods are never watched,
    listed for the KV-event endpoints (the vLLM role alone) and for the actuator when tuning; the
    Roles are exactly what that code uses."""
    roles = {"vllm": {"selector": "app=vllm", "port": 8000}, "router": {"selector": "app=router", "port": 8001},
             "curvine-master": {"selector": "app=cm", "port": 9001}}
    args = ["--set", f"kvEvents.enabled={str(kv_events).lower()}", "--set", f"tuner.enabled={str(tuner).lower()}",
            "--set-json", f"discovery.kubernetes.roles={json.dumps(roles)}",
            "--set", "tuner.storage.type=postgresql", "--set", "tuner.storage.existingSecret=study",
            "--set-json", 'actuation.targets=[{"kind": "deployment-env", "name": "vllm", "container": "vllm"}]']
    docs = render({"source": {"type": "prometheus", "prometheus": {"url": "http://prom.monitoring:9090"}}}, *args)
    agent, data = agent_settings(docs, tmp_path)
    ports = egress_ports(docs)
    assert not ports & (SCRAPE_PORTS - {9090}) and 9090 in ports
    assert ({5557, 5558} <= ports) is kv_events and (5432 in ports) is tuner
    k8s = agent.targets.kubernetes
    assert k8s.enabled is kv_events and agent.kv_events.enabled is kv_events
    assert set(k8s.roles) == ({"vllm"} if kv_events else set()) and not agent.targets.static
    pods = _pod_rules(docs)
    assert [r["verbs"] for r in pods] == ([["list"]] if kv_events or tuner else [])
    if tuner:
        settings = settings_from_mapping(yaml.safe_load(data["targets.yaml"]), source="prometheus")
        lease = settings.lease.model_copy(update={"name": agent.actuation.lease_name})
        expected = required_rules(settings.model_copy(update={"lease": lease}), pod_watch=False,
                                  writes="none")  # the chart's default observes: shadow mode reads the target
        assert rbac_problems([d for d in docs if d["kind"] == "Role"], expected) == []
    # the query API rule reaches anywhere unless networkPolicy.queryApiTo names the peers
    (rule,) = [r for r in _one(docs, "NetworkPolicy")["spec"]["egress"] if r["ports"][0]["port"] == 9090]
    assert "to" not in rule


def test_kv_events_in_another_namespace_get_a_pods_role_there():
    docs = render({"source": {"type": "prometheus", "prometheus": {"url": "http://prom:9090"}}},
                  "--set", "discovery.kubernetes.namespace=serving")
    by_ns = {d["metadata"]["namespace"]: d for d in docs if d["kind"] == "Role" and
             any("pods" in r["resources"] for r in d["rules"])}
    assert [r["verbs"] for r in by_ns["serving"]["rules"]] == [["list"]]  # the KV-event endpoints
    assert [r["verbs"] for r in by_ns["llm"]["rules"] if r["resources"] == ["pods"]] == [["list"]]  # actuator


@pytest.mark.parametrize("url, port", [("http://prometheus.monitoring", 80), ("https://mimir.example.net", 443),
                                       ("https://mimir.example.net:8443/prometheus", 8443),
                                       ("http://[fd00::1]:9090", 9090)])
def test_the_query_api_port_comes_from_the_url(url, port):
    docs = render({"source": {"type": "prometheus", "prometheus": {"url": url}}},
                  "--set-json", 'networkPolicy.queryApiTo=[{"ipBlock":{"cidr":"10.0.0.0/8"}}]')
    rules = [r for r in _one(docs, "NetworkPolicy")["spec"]["egress"] if r.get("to") == [
        {"ipBlock": {"cidr": "10.0.0.0/8"}}]]
    assert [r["ports"] for r in rules] == [[{"port": port, "protocol": "TCP"}]]


def test_the_chart_takes_every_role_the_agent_knows(tmp_path):
    roles = {role: f'job="{role}"' for role in get_args(Role)}
    docs = render({"source": {"type": "prometheus", "prometheus": {
        "url": "http://p:9090", "roles": roles, "timeoutSeconds": 2}}})
    agent, _ = agent_settings(docs, tmp_path)
    assert agent.prometheus.roles == roles and agent.prometheus.timeout_s == 2


def test_direct_stays_the_default_and_unchanged():
    explicit = template("--set", "source.type=direct", "--set", "source.prometheus.url=http://ignored:9090")
    default = template()
    assert explicit == default
    agent = yaml.safe_load(_one(default, "ConfigMap", "tierpilot-config")["data"]["agent.yaml"])
    assert "source" not in agent and "prometheus" not in agent and agent["targets"]["kubernetes"]["enabled"]
    assert 8000 in egress_ports(default)


@pytest.mark.parametrize("args, message", [
    (["--set", "source.type=prometheus"], "source.type=prometheus needs source.prometheus.url"),
    (["--set", "source.type=prom"], 'source.type: "prom" is not direct or prometheus'),
    (["--set", "source.type=prometheus", "--set", "source.prometheus.url=prometheus:9090"],
     'source.prometheus.url: "prometheus:9090" must start with http:// or https://'),
    (["--set", "source.type=prometheus", "--set", "source.prometheus.url=http://p:9090", "--set", "shard.count=3",
      "--set", "export.fleet=all"], "shard.count > 1 is sharded direct scraping"),
    (["--set", "source.type=prometheus", "--set", "source.prometheus.url=http://p:9090",
      "--set", "source.prometheus.aggregate=both"], 'source.prometheus.aggregate: "both" is not server or agent'),
    (["--set", "source.type=prometheus", "--set", "source.prometheus.url=http://p:9090",
      "--set", "source.prometheus.roles.vllm-engine=job=x"], 'source.prometheus.roles: "vllm-engine" is not a role'),
    (["--set", "source.type=prometheus", "--set", "source.prometheus.url=http://p:9090",
      "--set-json", 'source.prometheus.roles={"vllm":{"job":"vllm"}}'],
     "source.prometheus.roles.vllm: give a series selector string"),
    (["--set", "source.type=prometheus", "--set", "source.prometheus.url=http://p:9090",
      "--set", "source.prometheus.timeoutSeconds=10s"], "source.prometheus.timeoutSeconds: 10s is not a number"),
    (["--set", "source.type=prometheus", "--set", "source.prometheus.url=http://p:9090",
      "--set", "source.prometheus.timeoutSeconds=0"], "source.prometheus.timeoutSeconds: 0 is not a number"),
    (["--set", "source.type=prometheus", "--set", "source.prometheus.url=http://p:9090",
      "--set", "source.prometheus.bearerToken.secretName=a", "--set", "source.prometheus.basicAuth.secretName=b",
      "--set", "source.prometheus.basicAuth.username=u"], "give bearerToken.secretName or basicAuth.secretName"),
    (["--set", "source.type=prometheus", "--set", "source.prometheus.url=http://p:9090",
      "--set", "source.prometheus.basicAuth.username=u"], "basicAuth needs both username and secretName"),
    (["--set", "source.type=prometheus", "--set", "source.prometheus.url=http://p:9090",
      "--set", "source.prometheus.tls.ca.secretName=a", "--set", "source.prometheus.tls.ca.configMapName=b"],
     "tls.ca: give secretName or configMapName, not both"),
    (["--set", "source.type=prometheus", "--set", "source.prometheus.url=http://p:9090",
      "--set", "discovery.kubernetes.roles=null", "--set", "podMonitor.enabled=false"],
     "kvEvents.enabled with source.type=prometheus finds the KV-event endpoints"),
])
def test_bad_combinations_fail_with_one_line(args, message):
    proc = helm("template", RELEASE, str(CHART), *args)
    assert proc.returncode != 0 and message in proc.stderr, (args, proc.stderr)
    assert message in proc.stderr.splitlines()[0], proc.stderr  # the first line says it all


def test_the_values_example_in_docs_deploy_renders_and_loads(tmp_path):
    doc = (REPO_ROOT / "docs" / "deploy.md").read_text()
    section = doc.split("### Reading from the cluster's Prometheus", 1)[1].split("\n### ", 1)[0]
    values = tmp_path / "prometheus-source.yaml"
    values.write_text(re.search(r"```yaml\n(.*?)```", section, re.DOTALL).group(1))
    docs = template("-f", str(values))
    agent, _ = agent_settings(docs, tmp_path)
    assert agent.source == "prometheus" and agent.prometheus.url.startswith("https://")
    pod = workload(docs)["spec"]["template"]["spec"]
    assert mounted_source(pod, agent.prometheus.bearer_token_file) == ("secret", "tierpilot-query-token", "token")
    assert mounted_source(pod, agent.prometheus.tls.ca_file) == ("configMap", "monitoring-ca", "ca.crt")
