"""The project's kubelet (emulator/engines/kubelet.py, podspec.py): Deployments and ConfigMaps in
kmock's API (served over HTTP to the real `kubernetes` client) run as processes, from the container
args and env exactly; a fake container runtime records what each process was started with, and a
fake engine reads it as vLLM does (its flags, and the variables it reads)."""
from __future__ import annotations

import json
import sys
import threading
import urllib.request
from pathlib import Path

import pytest
from kubernetes import client as k8s

from emulator.engines.child import EngineError
from emulator.engines.configmap_volume import project_configmap
from emulator.engines.engine import EngineSpec, engine_command, engine_python
from emulator.engines.images import deployment, engine_container, images
from emulator.engines.kubelet import Kubelet, ProcessRuntime
from emulator.engines.podspec import (
    Image,
    PodInfo,
    PodSpecError,
    container_env,
    expand,
    pod_command,
    translate,
)
from emulator.engines.tiering import TieringConfig
from tests.support.kube import NS, FakeTime, Fault, actuator_for, configmap, serve
from tests.support.prometheus import free_port

GIB = 1 << 30
CONFIG = {"kv_connector": "OffloadingConnector", "kv_role": "kv_both",
          "kv_connector_extra_config": {"spec_name": "CpuTieringOffloadingSpec", "cpu_bytes_to_use": 2 * GIB,
                                        "eviction_policy": "lru"}}
IMAGE = {"vllm-cpu": Image(("python", "-m", "vllm.entrypoints.cli.main"), (("PATH", "/usr/bin"),))}
ENGINE_READS = ("VLLM_CPU_OMP_THREADS_BIND", "VLLM_CPU_KVCACHE_SPACE", "PYTHONHASHSEED")


def engine_view(argv: tuple[str, ...], env: dict[str, str]) -> dict:
    """What a vLLM engine would run with: its flags and the variables it reads, nothing else."""
    flags = dict(zip(argv[5::2], argv[6::2], strict=False))
    extra = json.loads(flags["--kv-transfer-config"])["kv_connector_extra_config"]
    return {"cpu_bytes": extra["cpu_bytes_to_use"], "eviction": extra["eviction_policy"],
            "block_size": flags.get("--block-size"), "env": {k: env[k] for k in ENGINE_READS if k in env}}


class FakeRuntime:
    def __init__(self) -> None:
        self.started: list[tuple[str, object]] = []
        self.stopped: list[str] = []
        self.live: set[str] = set()

    def start(self, pod, cmd):
        self.started.append((pod, cmd))
        self.live.add(pod)
        return pod

    answering = True  # False: containers run but their readiness probe fails

    def wait_ready(self, handle):
        if not self.answering:
            raise EngineError(f"pod {handle} did not answer its readiness probe")
        return 0.0

    def probe(self, handle):
        return handle in self.live and self.answering

    def running(self, handle):
        return handle in self.live

    def stop(self, handle):
        self.stopped.append(handle)
        self.live.discard(handle)


def vllm_deployment(name: str = "vllm", replicas: int = 2) -> dict:
    container = {"name": "vllm", "image": "vllm-cpu",
                 "args": ["serve", "/models/tiny", "--host", "$(POD_IP)", "--port", "8000", "--block-size", "32",
                          "--kv-transfer-config", json.dumps(CONFIG, separators=(",", ":"))],
                 "env": [{"name": "POD_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}},
                         {"name": "VLLM_CPU_OMP_THREADS_BIND", "value": "0"}],
                 "readinessProbe": {"httpGet": {"path": "/health", "port": 8000}}}
    return {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": name, "namespace": NS},
            "spec": {"replicas": replicas, "selector": {"matchLabels": {"app": name}},
                     "template": {"metadata": {"labels": {"app": name}}, "spec": {"containers": [container]}}}}


@pytest.fixture
def kube(shared_dir):
    yield from serve(shared_dir)


@pytest.fixture
def kubelet(kube, tmp_path):
    for kind in ("Deployment", "ConfigMap", "Pod"):  # listed before any exists
        kube.emu.resources[kube.resource(kind)] = {}
    api = kube.api_client()
    runtime = FakeRuntime()
    fake = FakeTime()
    return Kubelet(k8s.AppsV1Api(api), k8s.CoreV1Api(api), NS, tmp_path, IMAGE, runtime, clock=fake.clock)


def views(kubelet) -> list[dict]:
    return [engine_view(p.cmd.argv, dict(p.cmd.env)) for _, p in sorted(kubelet.pods["vllm"].items())]


def test_each_replica_runs_the_containers_command_line(kube, kubelet):
    kube.manual_rollout("Deployment", NS, "vllm")  # the status is the kubelet's to write
    kube.put(vllm_deployment())
    events = kubelet.sync()
    assert [e.what for e in events] == ["started", "started"]
    argvs = [p.cmd.argv for p in kubelet.pods["vllm"].values()]
    assert argvs[0][:6] == ("python", "-m", "vllm.entrypoints.cli.main", "serve", "/models/tiny", "--host")
    assert {a[6] for a in argvs} == {"127.0.0.10", "127.0.0.11"}  # $(POD_IP), one loopback IP per replica
    assert [p.cmd.ready_url for p in kubelet.pods["vllm"].values()] == ["http://127.0.0.10:8000/health",
                                                                        "http://127.0.0.11:8000/health"]
    assert views(kubelet)[0] == {"cpu_bytes": 2 * GIB, "eviction": "lru", "block_size": "32",
                                 "env": {"VLLM_CPU_OMP_THREADS_BIND": "0"}}
    assert kubelet.sync() == []  # nothing changed: nothing restarts
    pods = {p["metadata"]["name"]: p["status"]["podIP"] for p in kube.objects_of("Pod")}
    assert sorted(pods.values()) == ["127.0.0.10", "127.0.0.11"]
    assert kube.get("Deployment", NS, "vllm")["status"]["readyReplicas"] == 2
    kube.edit("Deployment", NS, "vllm", lambda o: o["spec"].update(replicas=1))
    assert [e.what for e in kubelet.sync()] == ["stopped"]
    assert [p["status"]["podIP"] for p in kube.objects_of("Pod")] == ["127.0.0.10"]


def test_a_tier_knob_written_by_the_agent_rolls_the_replicas_with_the_new_flags(kube, kubelet):
    kube.put(vllm_deployment())
    kubelet.sync()
    act = actuator_for(kube, [{"kind": "vllm-tiering-args", "name": "vllm", "container": "vllm"}], FakeTime())
    live = act.current()
    act.mark_good(live)
    act.apply(live.replace(cpu_gib=3.0, cpu_eviction="arc"))
    events = kubelet.sync()
    # one replica at a time: stop, start (ready), then the next
    assert [(e.what, e.pod[-1]) for e in events] == [("stopped", "0"), ("started", "0"), ("stopped", "1"),
                                                     ("started", "1")]
    assert [(v["cpu_bytes"], v["eviction"]) for v in views(kubelet)] == [(3 * GIB, "arc")] * 2


def test_the_agent_rolls_a_fleet_split_over_deployments_one_deployment_after_the_other(kube, kubelet):
    for name in ("vllm-a", "vllm-b"):  # one engine per Deployment, the kubelet writing their rollout status
        kube.put(vllm_deployment(name, replicas=1))
        kube.manual_rollout("Deployment", NS, name)
    kubelet.sync()
    fake = FakeTime()
    passes: list[list[str]] = []

    def sleep(seconds: float) -> None:  # the kubelet runs while the actuator waits on a rollout
        fake.sleep(seconds)
        stopped = [e.pod.rsplit("-", 2)[0] for e in kubelet.sync() if e.what == "stopped"]
        passes.extend([stopped] if stopped else [])

    act = actuator_for(kube, [{"kind": "vllm-tiering-args", "name": n, "container": "vllm"} for n in ("vllm-a", "vllm-b")],
                       fake)
    act._sleep = sleep
    live = act.current()
    act.mark_good(live)
    act.apply(live.replace(cpu_gib=3.0))
    # vllm-b was patched once vllm-a had rolled out: never both engines down at once
    assert passes == [["vllm-a"], ["vllm-b"]]
    assert all(v["cpu_bytes"] == 3 * GIB for name in ("vllm-a", "vllm-b")
               for v in [engine_view(p.cmd.argv, dict(p.cmd.env)) for p in kubelet.pods[name].values()])
    act.rollback()
    assert passes[2:] == [["vllm-a"], ["vllm-b"]]  # a rollback too


def test_a_knob_written_to_the_wrong_place_restarts_the_pods_but_changes_nothing_they_run(kube, kubelet):
    kube.put(vllm_deployment())
    kubelet.sync()
    before = views(kubelet)

    def wrong(obj):
        tpl = obj["spec"]["template"]
        tpl["metadata"]["annotations"] = {"vllm.ai/cpu-bytes-to-use": str(8 * GIB)}
        tpl["spec"]["containers"][0]["env"].append({"name": "VLLM_CPU_BYTES_TO_USE", "value": str(8 * GIB)})

    kube.edit("Deployment", NS, "vllm", wrong)
    events = kubelet.sync()
    assert [e.what for e in events].count("started") == 2  # a new pod template is a rollout, as in Kubernetes
    assert views(kubelet) == before  # ... but the engines run exactly as before
    assert all(p.cmd.env["VLLM_CPU_BYTES_TO_USE"] == str(8 * GIB) for p in kubelet.pods["vllm"].values())


def test_a_configmap_change_rewrites_mounted_files_and_leaves_env_until_the_next_start(kube, kubelet, tmp_path):
    kube.put(configmap("curvine-config", {"curvine-cluster.toml": "policy = 'lru'\n", "LOG": "info"}))
    dep = vllm_deployment("curvine-master", replicas=1)
    spec = dep["spec"]["template"]["spec"]
    spec["containers"][0].update(image="curvine", command=["master", "--config", "/etc/curvine/curvine-cluster.toml"],
                                 args=[], envFrom=[{"configMapRef": {"name": "curvine-config"}, "prefix": "CV_"}],
                                 volumeMounts=[{"name": "conf", "mountPath": "/etc/curvine"}])
    spec["volumes"] = [{"name": "conf", "configMap": {"name": "curvine-config"}}]
    kube.put(dep)
    kubelet.sync()
    pod = kubelet.pods["curvine-master"][0]
    path = Path(pod.cmd.argv[2])
    assert path.is_relative_to(tmp_path) and path.read_text() == "policy = 'lru'\n"
    assert pod.cmd.env["CV_LOG"] == "info"
    kube.edit("ConfigMap", NS, "curvine-config", lambda o: o["data"].update({"curvine-cluster.toml": "policy = 'lfu'\n",
                                                                            "LOG": "debug"}))
    events = kubelet.sync()
    assert [e.what for e in events] == ["files"]  # no restart: the file changes under the running process
    assert path.read_text() == "policy = 'lfu'\n"
    assert kubelet.pods["curvine-master"][0].cmd.env["CV_LOG"] == "info"  # env is read at container start


def test_a_pod_waits_for_the_configmap_its_volume_projects(kube, kubelet):
    dep = vllm_deployment("curvine-master", replicas=1)
    spec = dep["spec"]["template"]["spec"]
    spec["containers"][0].update(volumeMounts=[{"name": "conf", "mountPath": "/etc/curvine"}])
    spec["volumes"] = [{"name": "conf", "configMap": {"name": "curvine-config"}}]
    kube.put(dep)  # before its ConfigMap, as a `kubectl apply` of both may land
    assert [(e.what, e.reason) for e in kubelet.sync()] == [
        ("waiting", "MountVolume.SetUp failed: configmap 'curvine-config' not found")]
    assert kubelet.sync() == [] and kubelet.runtime.started == []  # still waiting, said once
    kube.put(configmap("curvine-config", {"curvine-cluster.toml": "policy = 'lru'\n"}))
    assert [e.what for e in kubelet.sync()] == ["started"]
    pod = kubelet.pods["curvine-master"][0]
    assert (kubelet.scratch / "pods" / pod.name / "volumes" / "conf" / "curvine-cluster.toml").read_text() == \
        "policy = 'lru'\n"


def test_an_exited_process_is_started_again_and_deleted_deployments_stop(kube, kubelet):
    kube.put(vllm_deployment(replicas=1))
    kubelet.sync()
    kubelet.runtime.live.clear()  # the process died
    assert [e.what for e in kubelet.sync()] == ["restarted"]
    assert kubelet.pods["vllm"][0].restarts == 1
    kube.edit("Deployment", NS, "vllm", lambda o: o["spec"].update(replicas=0))
    assert [e.what for e in kubelet.sync()] == ["stopped"]


def test_a_running_pod_that_was_not_ready_turns_ready_when_its_probe_answers_and_the_roll_goes_on(kube, kubelet):
    kube.manual_rollout("Deployment", NS, "vllm")
    kubelet.runtime.answering = False  # started, but slower to answer than the kubelet waits
    kube.put(vllm_deployment(replicas=2))
    assert [e.what for e in kubelet.sync()] == ["started", "unready", "started", "unready"]
    assert [e.what for e in kubelet.sync()] == []  # still running, still not Ready: no restart
    assert kube.get("Deployment", NS, "vllm")["status"].get("readyReplicas", 0) == 0
    kubelet.runtime.answering = True
    assert [e.what for e in kubelet.sync()] == ["ready", "ready"]
    assert kube.get("Deployment", NS, "vllm")["status"]["readyReplicas"] == 2
    ready = {c["type"]: c["status"] for p in kube.objects_of("Pod") for c in p["status"]["conditions"]}
    assert ready["Ready"] == "True"
    # a rollout whose first updated replica is slow to answer holds until it is Ready
    kubelet.runtime.answering = False
    kube.edit("Deployment", NS, "vllm", lambda o: o["spec"]["template"]["metadata"]["labels"].update(v="2"))
    assert [e.what for e in kubelet.sync()] == ["stopped", "started", "unready"]
    assert [e.what for e in kubelet.sync()] == []  # held: replica 1 keeps the old template
    kubelet.runtime.answering = True
    assert [e.what for e in kubelet.sync()] == ["ready", "stopped", "started"]
    assert kube.get("Deployment", NS, "vllm")["status"]["readyReplicas"] == 2


def test_env_composition_and_expansion_follow_the_kubelet():
    pod = PodInfo("p-0", NS, "127.0.0.5", {"app": "x"}, {"note": "n"})
    container = {"envFrom": [{"configMapRef": {"name": "cm"}}],
                 "env": [{"name": "A", "value": "1"}, {"name": "B", "value": "$(A)-$(NOPE)-$$(A)"},
                         {"name": "K", "valueFrom": {"configMapKeyRef": {"name": "cm", "key": "K"}}},
                         {"name": "ANN", "valueFrom": {"fieldRef": {"fieldPath": "metadata.annotations['note']"}}},
                         {"name": "OPT", "valueFrom": {"configMapKeyRef": {"name": "cm", "key": "no",
                                                                            "optional": True}}}]}
    env = container_env(container, pod, {"cm": {"K": "from-cm", "A": "0"}}, Image((), (("PATH", "/bin"),)))
    assert env == {"PATH": "/bin", "K": "from-cm", "A": "1", "B": "1-$(NOPE)-$(A)", "ANN": "n"}
    assert expand("$(A)$(A)", {"A": "x"}) == "xx"
    with pytest.raises(PodSpecError, match="secretKeyRef"):
        container_env({"env": [{"name": "S", "valueFrom": {"secretKeyRef": {"name": "s", "key": "k"}}}]}, pod, {},
                      Image(()))
    with pytest.raises(PodSpecError, match="no such ConfigMap key"):
        container_env({"env": [{"name": "K", "valueFrom": {"configMapKeyRef": {"name": "x", "key": "k"}}}]}, pod,
                      {}, Image(()))


def test_mount_paths_are_rewritten_to_their_host_directories(tmp_path):
    mounts = {"/mnt/l2": Path("/srv/l2"), "/etc/c": tmp_path}
    assert translate('{"root_dir":"/mnt/l2/kv","x":"/mnt/l22"}', mounts) == '{"root_dir":"/srv/l2/kv","x":"/mnt/l22"}'
    assert translate("--config=/etc/c/a.toml", mounts) == f"--config={tmp_path}/a.toml"
    template = {"spec": {"containers": [{"name": "c", "image": "unknown", "args": ["x"]}]}}
    with pytest.raises(PodSpecError, match="unknown to this kubelet"):
        pod_command(template, None, PodInfo("p", NS, "127.0.0.1"), {}, {}, tmp_path)


def test_configmap_files_are_swapped_atomically(tmp_path):
    project_configmap(tmp_path / "v", {"a": "1"}, "000001")
    link = tmp_path / "v" / "a"
    assert link.is_symlink() and link.read_text() == "1"
    project_configmap(tmp_path / "v", {"a": "2"}, "000002")
    assert link.read_text() == "2" and not (tmp_path / "v" / "..000001").exists()


def test_an_engine_deployment_runs_the_engines_own_command_line(kube, kubelet, tmp_path):
    spec = EngineSpec(model=Path("/m"), port=8000, cpu_bind="1", dtype="float32",
                      tiering=TieringConfig(cpu_bytes=1 << 20, fs_root=Path("/l2")))
    kube.put(deployment("vllm", NS, [engine_container(spec)]))
    kubelet.images = images(tmp_path)
    kubelet.sync()
    pod = kubelet.pods["vllm"][0]
    want = engine_command(spec, engine_python(), pod.name)
    want[want.index("--host") + 1] = pod.ip
    assert list(pod.cmd.argv) == want  # engine.py's command line, with the pod's IP and CPU-tier region name
    assert pod.cmd.env["VLLM_CPU_OMP_THREADS_BIND"] == "1" and "VLLM_CPU_KVCACHE_SPACE" not in pod.cmd.env


def test_real_processes_roll_and_see_their_configmap_files_change(kube, tmp_path):
    """Python's http.server as the container: ready on its pod IP, serving a ConfigMap volume."""
    for kind in ("Deployment", "ConfigMap", "Pod"):
        kube.emu.resources[kube.resource(kind)] = {}
    port = free_port()
    kube.put(configmap("site", {"index.txt": "one"}))
    container = {"name": "web", "image": "none",
                 "command": [sys.executable, "-m", "http.server", "--bind", "$(POD_IP)", "--directory", "/srv/site",
                             str(port)],
                 "env": [{"name": "POD_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}}],
                 "volumeMounts": [{"name": "site", "mountPath": "/srv/site"}],
                 "readinessProbe": {"httpGet": {"path": "/index.txt", "port": port}}}
    kube.put(deployment("web", NS, [container],
                        volumes=[{"name": "site", "configMap": {"name": "site"}}]))
    api = kube.api_client()
    kubelet = Kubelet(k8s.AppsV1Api(api), k8s.CoreV1Api(api), NS, tmp_path, {},
                      ProcessRuntime(tmp_path / "logs", ready_timeout_s=60))
    try:
        kubelet.sync()
        pod = kubelet.pods["web"][0]
        url = f"http://{pod.ip}:{port}/index.txt"
        assert _get(url) == "one"
        kube.edit("ConfigMap", NS, "site", lambda o: o["data"].update({"index.txt": "two"}))
        assert [e.what for e in kubelet.sync()] == ["files"]
        assert _get(url) == "two" and kubelet.pods["web"][0].handle is pod.handle  # the same process re-read it
        kube.edit("Deployment", NS, "web", lambda o: o["spec"]["template"]["metadata"].update(
            annotations={"tierpilot.io/config-hash": "x"}))
        assert [e.what for e in kubelet.sync()] == ["stopped", "started"]
        assert pod.handle.proc is None and _get(url) == "two"
    finally:
        kubelet.shutdown()


def _get(url: str) -> str:
    with urllib.request.urlopen(url, timeout=10) as resp:
        return resp.read().decode()


def test_the_command_has_help_with_an_example(capsys):
    from emulator.engines.kubelet import main

    with pytest.raises(SystemExit) as exc:
        main(["--help"])
    assert exc.value.code == 0 and "example: python -m emulator.engines.kubelet --server" in capsys.readouterr().out


class Passes(threading.Event):
    """A stop event that is set after `n` waits (one per pass of `run`)."""

    def __init__(self, n: int) -> None:
        super().__init__()
        self.n = n

    def wait(self, timeout=None):
        self.n -= 1
        if self.n <= 0:
            self.set()
        return self.is_set()


def test_the_loop_outlives_a_failing_api_call(kube, kubelet):
    kube.put(vllm_deployment(replicas=1))
    kube.inject(Fault("GET", "configmaps", status=500))
    kubelet.run(Passes(2), interval_s=0)
    assert kube.emu.faults[0].times == 0  # the first pass met the error
    assert [e.what for e in kubelet.events] == ["started"]  # ... and the second ran
