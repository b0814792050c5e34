"""Target discovery: static file, Kubernetes pods by label selector (a fake PodApi for the logic,
the real kubernetes client against kmock for the wire), annotations, churn."""
from __future__ import annotations

import time

import pytest

from agent.collect.discovery import (
    CombinedTargets,
    FileTargets,
    KubernetesPodApi,
    KubernetesTargets,
    StaticTargets,
    attach_node_clients,
    pod_target,
    selector_matches,
)
from agent.settings import KubernetesSettings, RoleDiscovery
from contracts.tier_model import Target


def pod(name, labels, ip="10.0.0.5", phase="Running", annotations=None, node="n1", ns="llm"):
    return {"metadata": {"name": name, "namespace": ns, "labels": labels, "annotations": annotations or {}},
            "spec": {"nodeName": node}, "status": {"phase": phase, "podIP": ip}}


def test_pod_target_ports_paths_and_opt_out():
    cfg = RoleDiscovery(selector="app=vllm")
    assert pod_target(pod("v", {}), "vllm", cfg) == Target("http://10.0.0.5:8000/metrics", "vllm", "v", "llm", "n1")
    ann = {"prometheus.io/port": "8080", "prometheus.io/path": "/stats", "prometheus.io/scheme": "https"}
    assert pod_target(pod("v", {}, annotations=ann), "vllm", cfg).url == "https://10.0.0.5:8080/stats"
    # a sidecar role reads its own annotation, not prometheus.io/port (which belongs to vLLM)
    side = {"prometheus.io/port": "8000", "tierpilot.io/lmcache-port": "9091"}
    assert pod_target(pod("v", {}, annotations=side), "lmcache", RoleDiscovery(selector="x")).url == \
        "http://10.0.0.5:9091/metrics"
    assert pod_target(pod("v", {}), "curvine-fuse", RoleDiscovery(selector="x", port=9999)).url.endswith(":9999/metrics")
    assert pod_target(pod("v", {}, annotations={"prometheus.io/scrape": "false"}), "vllm", cfg) is None
    assert pod_target(pod("v", {}, phase="Pending"), "vllm", cfg) is None
    assert pod_target(pod("v", {}, ip=""), "vllm", cfg) is None
    assert pod_target(pod("v", {}, ip="fd00::5"), "vllm", cfg).url == "http://[fd00::5]:8000/metrics"


def test_selector_matching():
    assert selector_matches({"app": "vllm", "tier": "a"}, "app=vllm,tier==a")
    assert not selector_matches({"app": "vllm"}, "app=router")
    assert selector_matches({"app": "vllm"}, "app!=router,app,!gone")
    assert not selector_matches({"app": "vllm", "gone": "1"}, "!gone")


class FakePodApi:
    def __init__(self, pods, events):
        self.pods, self.events, self.calls = pods, events, []

    def list_pods(self, namespace, selector):
        self.calls.append(("list", namespace, selector))
        return [p for p in self.pods if selector_matches(p["metadata"]["labels"], selector)], "7"

    def watch_pods(self, namespace, selector, resource_version, timeout_s):
        self.calls.append(("watch", namespace, selector, resource_version))
        while self.events:
            yield self.events.pop(0)
        time.sleep(0.05)


def test_kubernetes_targets_follow_pod_churn():
    settings = KubernetesSettings(enabled=True, namespace="llm", roles={
        "vllm": RoleDiscovery(selector="app=vllm"), "curvine-fuse": RoleDiscovery(selector="app=fuse")})
    api = FakePodApi([pod("v0", {"app": "vllm"}), pod("f0", {"app": "fuse"}, ip="10.0.0.9")], [])
    kt = KubernetesTargets(api, settings)
    kt.refresh()
    assert sorted(t.url for t in kt.targets()) == ["http://10.0.0.5:8000/metrics", "http://10.0.0.9:9003/metrics"]
    kt.apply_event("vllm", "ADDED", pod("v1", {"app": "vllm"}, ip="10.0.0.6"))
    kt.apply_event("vllm", "ADDED", pod("r0", {"app": "router"}, ip="10.0.0.7"))  # unfiltered watch
    kt.apply_event("vllm", "MODIFIED", pod("v0", {"app": "vllm"}, phase="Failed"))
    assert sorted(t.pod for t in kt.targets()) == ["f0", "v1"]
    kt.apply_event("vllm", "DELETED", pod("v1", {"app": "vllm"}, ip="10.0.0.6"))
    assert sorted(t.pod for t in kt.targets()) == ["f0"]


def test_watch_thread_applies_events_and_stops():
    settings = KubernetesSettings(enabled=True, roles={"vllm": RoleDiscovery(selector="app=vllm")})
    api = FakePodApi([], [("ADDED", pod("v9", {"app": "vllm"}))])
    kt = KubernetesTargets(api, settings, retry_s=0.05)
    kt.start()
    try:
        deadline = time.monotonic() + 5
        while not kt.targets() and time.monotonic() < deadline:
            time.sleep(0.02)
        assert [t.pod for t in kt.targets()] == ["v9"]
    finally:
        kt.stop()
    assert api.calls[0] == ("list", None, "app=vllm")
    assert api.calls[1] == ("watch", None, "app=vllm", "7")


def test_real_kubernetes_client_against_kmock():
    from kubernetes import client as k8s

    from tests.support.kube import NS, KubeServer
    from tests.support.kube import pod as kube_pod

    server = KubeServer().start()
    try:
        for name, app, ip in (("vllm-0", "vllm", "10.1.0.1"), ("vllm-1", "vllm", "10.1.0.2"),
                              ("router-0", "router", "10.1.0.3")):
            obj = kube_pod(name, app)
            obj["status"] = {"phase": "Running", "podIP": ip}
            obj["metadata"]["annotations"] = {"prometheus.io/port": "8080"}
            server.put(obj)
        watching = __import__("threading").Event()

        class Recording(KubernetesPodApi):
            def watch_pods(self, *args, **kwargs):
                stream = super().watch_pods(*args, **kwargs)
                watching.set()  # kmock does not replay from a resourceVersion: mutate after this
                yield from stream

        api = Recording(k8s.CoreV1Api(server.api_client()))
        settings = KubernetesSettings(enabled=True, namespace=NS, watch_timeout_s=1,
                                      roles={"vllm": RoleDiscovery(selector="app=vllm")})
        kt = KubernetesTargets(api, settings, retry_s=0.1)
        kt.refresh()
        assert sorted(t.url for t in kt.targets()) == ["http://10.1.0.1:8080/metrics", "http://10.1.0.2:8080/metrics"]
        kt.start()
        try:
            assert watching.wait(5)
            time.sleep(0.5)
            new = kube_pod("vllm-2", "vllm")
            new["status"] = {"phase": "Running", "podIP": "10.1.0.4"}
            server.put(new)
            server.delete("Pod", NS, "vllm-0")
            deadline = time.monotonic() + 10
            while time.monotonic() < deadline and sorted(t.pod for t in kt.targets()) != ["vllm-1", "vllm-2"]:
                time.sleep(0.05)
            assert sorted(t.pod for t in kt.targets()) == ["vllm-1", "vllm-2"]
        finally:
            kt.stop(timeout=3)  # the client drops a silent watch after 1.5 s
    finally:
        server.stop()


def test_file_targets_reload_and_survive_a_bad_edit(tmp_path):
    f = tmp_path / "targets.yaml"
    f.write_text("targets:\n  - {url: 'http://10.0.0.1:8000/metrics', role: vllm, pod: v0}\n")
    ft = FileTargets(f)
    assert [t.pod for t in ft.targets()] == ["v0"]
    f.write_text("targets:\n  - {url: 'http://10.0.0.1:8000/metrics', role: gpu, pod: v0}\n")
    import os
    os.utime(f, (time.time() + 5, time.time() + 5))
    assert [t.pod for t in ft.targets()] == ["v0"]  # kept
    assert "key 'targets.0.role'" in ft.last_error
    f.write_text("targets:\n  - {url: 'http://10.0.0.2:8000/metrics', role: vllm, pod: v1}\n")
    os.utime(f, (time.time() + 10, time.time() + 10))
    assert [t.pod for t in ft.targets()] == ["v1"] and ft.last_error == ""


def test_node_fuse_client_is_credited_to_the_only_vllm_pod_on_its_node():
    ts = (Target("http://a/m", "vllm", "v0", node="n1"), Target("http://b/m", "curvine-fuse", "fuse-x", node="n1"),
          Target("http://c/m", "vllm", "v1", node="n2"), Target("http://d/m", "vllm", "v2", node="n2"),
          Target("http://e/m", "curvine-fuse", "fuse-y", node="n2"))
    out = {t.url: t.pod for t in attach_node_clients(ts)}
    assert out["http://b/m"] == "v0" and out["http://e/m"] == "fuse-y"


def test_combined_sources_deduplicate_urls():
    a = StaticTargets([Target("http://a/m", "vllm", "v0")])
    b = StaticTargets([Target("http://a/m", "vllm", "other"), Target("http://b/m", "router", "r")])
    assert [t.pod for t in CombinedTargets([a, b]).targets()] == ["v0", "r"]


@pytest.mark.parametrize("text, key", [("targets: 3", "targets"), ("other: []", None)])
def test_bad_target_files(tmp_path, text, key):
    from agent.collect.discovery import parse_target_file
    with pytest.raises(ValueError):
        parse_target_file(text)
