"""The chart's `source.type: prometheus` wiring, run: against a real Prometheus that demands what a
hardened query API demands: HTTPS with its own CA, a client certificate (mutual TLS) and basic
auth (Prometheus' --web.config.file). The agent.yaml `helm template` renders is loaded with the
agent's parser after the Secrets are laid out where the Deployment mounts them (as kubelet would);
one agent cycle then reads the vLLM pod through the query API. A wrong or rotated password, or no
client certificate, is a reasoned status, and the rotated file is read again on the next cycle.
And with KV events on, the runtime built from the rendered agent.yaml (the vLLM role alone, nothing
scraped, no pod watch) still lists the vLLM pods' KV-event endpoints from the Kubernetes API (the
emulator)."""
from __future__ import annotations

import base64
import json
import shutil
import signal
import ssl
import subprocess
import time
import urllib.error
import urllib.request
from pathlib import Path

import bcrypt
import pytest
import yaml

from agent.collect.discovery import KubernetesTargets, StaticTargets
from agent.runtime.app import Agent
from agent.runtime.assembly import build_runtime
from agent.settings import load_settings
from tests.support.fake_targets import MetricsServer
from tests.support.kube import NS, serve
from tests.support.prometheus import PROMETHEUS_BIN, free_port, write_config
from tests.test_helm_chart import _one, template
from tests.test_k8s_deploy import workload
from tests.test_promsource_aggregate import _engine_payload

PASSWORD = "correct horse battery staple"


def _openssl(*args: str, cwd: Path) -> None:
    openssl = shutil.which("openssl")
    if openssl is None:
        pytest.fail("openssl not found (make setup installs Debian's openssl)")
    subprocess.run([openssl, *args], cwd=cwd, check=True, capture_output=True, timeout=30)


def _certificates(d: Path) -> None:
    """ca.crt; server.crt for IP 127.0.0.1 and client.crt (clientAuth), both signed by the CA."""
    ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]
    _openssl("req", "-x509", *ec, "-keyout", "ca.key", "-out", "ca.crt", "-days", "1", "-subj", "/CN=test-ca",
             "-addext", "basicConstraints=critical,CA:TRUE", "-addext", "keyUsage=critical,keyCertSign,cRLSign",
             cwd=d)
    for name, ext in (("server", "subjectAltName=IP:127.0.0.1\nextendedKeyUsage=serverAuth\n"),
                      ("client", "extendedKeyUsage=clientAuth\n")):
        (d / f"{name}.ext").write_text(ext)
        _openssl("req", *ec, "-keyout", f"{name}.key", "-out", f"{name}.csr", "-subj", f"/CN={name}", cwd=d)
        _openssl("x509", "-req", "-in", f"{name}.csr", "-CA", "ca.crt", "-CAkey", "ca.key", "-CAcreateserial",
                 "-out", f"{name}.crt", "-days", "1", "-extfile", f"{name}.ext", cwd=d)


def _client_context(d: Path) -> ssl.SSLContext:
    ctx = ssl.create_default_context(cafile=str(d / "ca.crt"))
    ctx.load_cert_chain(str(d / "client.crt"), str(d / "client.key"))
    return ctx


@pytest.fixture()
def secure_prometheus(tmp_path):
    """A real Prometheus behind mutual TLS and basic auth, scraping one vLLM pod (job vllm)."""
    if not Path(PROMETHEUS_BIN).exists():
        pytest.fail(f"prometheus not found at {PROMETHEUS_BIN} (make setup installs it)")
    d = tmp_path / "prom"
    d.mkdir()
    _certificates(d)
    (d / "web.yml").write_text(yaml.safe_dump({
        "tls_server_config": {"cert_file": str(d / "server.crt"), "key_file": str(d / "server.key"),
                              "client_auth_type": "RequireAndVerifyClientCert", "client_ca_file": str(d / "ca.crt")},
        "basic_auth_users": {"tierpilot": bcrypt.hashpw(PASSWORD.encode(), bcrypt.gensalt(rounds=4)).decode()}}))
    with MetricsServer() as pods:
        pods.route("/metrics", text=_engine_payload())
        host = pods.url("/metrics").split("//", 1)[1].split("/", 1)[0]
        write_config(d / "prometheus.yml", [], job="vllm",
                     static_configs=[{"targets": [host], "labels": {"pod": "vllm-0", "namespace": "llm"}}])
        port = free_port()
        log = (d / "prometheus.log").open("wb")
        proc = subprocess.Popen([PROMETHEUS_BIN, f"--config.file={d / 'prometheus.yml'}",
                                 f"--storage.tsdb.path={d / 'data'}", f"--web.listen-address=127.0.0.1:{port}",
                                 f"--web.config.file={d / 'web.yml'}", "--log.level=warn"],
                                stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        log.close()
        try:
            url = f"https://127.0.0.1:{port}"
            _wait_scraped(url, _client_context(d), proc, d / "prometheus.log")
            yield url, d
        finally:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(5)


def _wait_scraped(url: str, ctx: ssl.SSLContext, proc: subprocess.Popen, log: Path) -> None:
    auth = "Basic " + base64.b64encode(f"tierpilot:{PASSWORD}".encode()).decode()
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        assert proc.poll() is None, log.read_text()[-2000:]
        req = urllib.request.Request(f"{url}/api/v1/query?query=up%3D%3D1", headers={"Authorization": auth})
        try:
            with urllib.request.urlopen(req, context=ctx, timeout=3) as resp:
                if json.loads(resp.read())["data"]["result"]:
                    return
        except (urllib.error.URLError, ConnectionError, OSError):
            pass
        time.sleep(0.3)
    raise AssertionError("Prometheus never scraped the pod: " + log.read_text()[-2000:])


def _kubelet(pod: dict, objects: dict[tuple[str, str], dict[str, bytes]], root: Path) -> dict[str, str]:
    """Write every Secret / ConfigMap key the container mounts under `root` + mountPath/path, as
    kubelet projects them; returns mountPath -> the directory it maps to."""
    (c,) = pod["containers"]
    moved = {}
    for m in c["volumeMounts"]:
        vol = next(v for v in pod["volumes"] if v["name"] == m["name"])
        if "secret" in vol:
            src = objects[("Secret", vol["secret"]["secretName"])]
        elif "configMap" in vol and vol["name"] != "config":
            src = objects[("ConfigMap", vol["configMap"]["name"])]
        else:
            continue
        items = vol.get("secret", vol.get("configMap"))["items"]
        target = root / m["mountPath"].lstrip("/")
        target.mkdir(parents=True)
        for item in items:
            (target / item["path"]).write_bytes(src[item["key"]])
        moved[m["mountPath"]] = str(target)
    return moved


def test_the_rendered_config_reads_a_real_prometheus_over_mtls_with_basic_auth(secure_prometheus, tmp_path):
    url, certs = secure_prometheus
    source = {"type": "prometheus", "prometheus": {
        "url": url, "roles": {"vllm": 'job="vllm"'},
        "basicAuth": {"username": "tierpilot", "secretName": "query-auth", "passwordKey": "password"},
        "tls": {"ca": {"configMapName": "query-ca", "key": "ca.crt"},
                "clientCert": {"secretName": "query-client"}}}}
    docs = template("--set-json", f"source={json.dumps(source)}", "--set", "kvEvents.enabled=false",
                    "--set", "tuner.enabled=false")
    objects = {("Secret", "query-auth"): {"password": PASSWORD.encode() + b"\n"},
               ("ConfigMap", "query-ca"): {"ca.crt": (certs / "ca.crt").read_bytes()},
               ("Secret", "query-client"): {"tls.crt": (certs / "client.crt").read_bytes(),
                                            "tls.key": (certs / "client.key").read_bytes()}}
    moved = _kubelet(workload(docs)["spec"]["template"]["spec"], objects, tmp_path / "root")
    assert len(moved) == 3
    text = _one(docs, "ConfigMap", "tierpilot-config")["data"]["agent.yaml"]
    for mount, there in moved.items():
        text = text.replace(mount + "/", there + "/")
    (tmp_path / "agent.yaml").write_text(text)
    settings = load_settings(tmp_path / "agent.yaml", env={})
    assert settings.source == "prometheus" and settings.prometheus.tls.cert_file is not None

    agent = Agent(settings, StaticTargets(()))
    snap = agent.scrape_now(timeout=60)
    assert [(t.target.pod, t.up) for t in snap.targets] == [("vllm-0", True)], snap.targets
    assert [t.tier for t in snap.tiers] == ["gpu"] and snap.tiers[0].hit_ratio == pytest.approx(4000 / 14000)

    # the Secret is rotated to a password Prometheus does not take: the next cycle reads the file again
    password_file = settings.prometheus.basic_auth.password_file
    password_file.write_text("rotated-but-wrong")
    (status,) = agent.scrape_now(timeout=60).targets
    assert not status.up and status.reason == "http_4xx", status
    password_file.write_text(PASSWORD)
    assert agent.scrape_now(timeout=60).targets[0].up

    # without the client certificate the TLS handshake is refused: a reasoned status, not a crash
    bare = settings.model_copy(update={"prometheus": settings.prometheus.model_copy(update={
        "tls": settings.prometheus.tls.model_copy(update={"cert_file": None, "key_file": None})})})
    (status,) = Agent(bare, StaticTargets(())).scrape_now(timeout=60).targets
    assert not status.up and status.reason, status


@pytest.fixture()
def kube(shared_dir):
    yield from serve(shared_dir)


def test_the_rendered_config_still_finds_the_kv_event_endpoints(kube, tmp_path):
    def pod(name, ip, annotations):
        return {"apiVersion": "v1", "kind": "Pod", "metadata": {
            "name": name, "namespace": NS, "labels": {"app": "vllm-llama"}, "annotations": annotations},
            "spec": {"containers": [{"name": "vllm", "image": "i"}]}, "status": {"phase": "Running", "podIP": ip}}

    kube.put(pod("vllm-0", "10.0.0.1", {"tierpilot.io/kv-events-port": "5557", "tierpilot.io/model": "m"}))
    kube.put(pod("vllm-1", "10.0.0.2", {}))  # publishes no events
    source = {"type": "prometheus", "prometheus": {"url": "http://127.0.0.1:1"}}
    docs = template("--set-json", f"source={json.dumps(source)}", "--set", "tuner.enabled=false",
                    "--set", "export.fleet=all", "--set-json",
                    'discovery.kubernetes.roles={"vllm":{"selector":"app=vllm-llama","port":8000}}',
                    namespace=NS)
    (tmp_path / "agent.yaml").write_text(_one(docs, "ConfigMap", "tierpilot-config")["data"]["agent.yaml"])
    settings = load_settings(tmp_path / "agent.yaml", env={})
    assert settings.source == "prometheus" and set(settings.targets.kubernetes.roles) == {"vllm"}
    rt = build_runtime(settings, api_client=kube.api_client(), env={})
    try:
        assert type(rt.agent.cycle).__name__ == "AggregatedCycle"  # the query API, not a scrape
        assert not [s for s in rt.agent.target_source.sources if isinstance(s, KubernetesTargets)]  # no watch
        assert rt.kv_refresh() == 1
        assert [(s.pod, s.endpoint) for s in rt.kv._wanted] == [("vllm-0", "tcp://10.0.0.1:5557")]
    finally:
        rt.kv.stop()


def test_an_agent_reading_the_query_api_builds_no_pod_watch():
    """Agent() without injected targets (agent.runtime.sources.targets_from_settings): with `source:
    prometheus` targets.kubernetes (kept for the KV-event endpoints) starts no scrape discovery,
    so no Kubernetes client is even loaded here."""
    settings = load_settings(env={}, source="prometheus", prometheus={"url": "http://127.0.0.1:1"},
                             targets={"kubernetes": {"enabled": True, "namespace": NS,
                                                     "roles": {"vllm": {"selector": "app=vllm-llama"}}}})
    agent = Agent(settings)
    assert not [s for s in agent.target_source.sources if isinstance(s, KubernetesTargets)]
