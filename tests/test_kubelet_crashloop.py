"""A container that keeps crashing, through the project's kubelet and kmock's API: the kubelet's
restart back-off (CrashLoopBackOff in the Pod's status), a roll held by an updated replica that is
not Ready, the Deployment controller's ProgressDeadlineExceeded, and the agent's actuator rolling
a change that crashes the engine back to the last good configuration."""
from __future__ import annotations

import json

import pytest
from kubernetes import client as k8s

from contracts.actuator import RolloutTimeoutError
from emulator.engines.child import EngineError
from emulator.engines.kubelet import Kubelet
from emulator.engines.kubelet_status import ReplicaCounts, deployment_status, restart_delay
from tests.support.kube import NS, FakeTime, KubectlPatchError, actuator_for, kubectl, serve
from tests.test_kubelet import GIB, IMAGE, FakeRuntime, engine_view, vllm_deployment


class CrashingRuntime(FakeRuntime):
    """Containers whose CPU tier is above `limit_bytes` exit at start, as an engine whose host
    memory cannot hold its CPU tier does."""

    def __init__(self, limit_bytes: int) -> None:
        super().__init__()
        self.limit_bytes = limit_bytes

    def start(self, pod, cmd):
        handle = super().start(pod, cmd)
        if engine_view(cmd.argv, dict(cmd.env))["cpu_bytes"] > self.limit_bytes:
            self.live.discard(handle)
        return handle

    def wait_ready(self, handle):
        if handle not in self.live:
            raise EngineError(f"pod {handle} exited with 1 before it was healthy")
        return 0.0


@pytest.fixture
def kube(shared_dir):
    yield from serve(shared_dir)


def make_kubelet(kube, tmp_path, fake: FakeTime, limit_bytes: int = 8 * GIB) -> Kubelet:
    kube.manual_rollout("Deployment", NS, "vllm")  # the status is the kubelet's to write
    api = kube.api_client()
    return Kubelet(k8s.AppsV1Api(api), k8s.CoreV1Api(api), NS, tmp_path, IMAGE, CrashingRuntime(limit_bytes),
                   clock=fake.clock)


def crashing(deployment: dict) -> dict:
    args = deployment["spec"]["template"]["spec"]["containers"][0]["args"]
    config = json.loads(args[-1])
    config["kv_connector_extra_config"]["cpu_bytes_to_use"] = 64 * GIB
    args[-1] = json.dumps(config, separators=(",", ":"))
    return deployment


def pod_state(kube, ordinal: int) -> dict:
    pod = next(p for p in kube.objects_of("Pod") if p["metadata"]["name"].endswith(f"-{ordinal}"))
    status = pod["status"]["containerStatuses"][0]
    ready = next(c["status"] for c in pod["status"]["conditions"] if c["type"] == "Ready")
    return {"ready": ready, "restarts": status["restartCount"], "waiting": status["state"].get("waiting", {}).get("reason")}


def test_the_back_off_doubles_from_10_s_to_five_minutes():
    assert [restart_delay(n) for n in range(1, 9)] == [0, 10, 20, 40, 80, 160, 300, 300]


def test_a_crashing_container_backs_off_and_its_pod_shows_crash_loop_back_off(kube, tmp_path):
    fake = FakeTime()
    kubelet = make_kubelet(kube, tmp_path, fake)
    kube.put(crashing(vllm_deployment(replicas=1)))
    assert [e.what for e in kubelet.sync()] == ["started", "unready"]
    assert pod_state(kube, 0) == {"ready": "False", "restarts": 0, "waiting": None}
    assert [e.what for e in kubelet.sync()] == ["restarted", "unready"]  # the first restart: at once
    assert [e.what for e in kubelet.sync()] == ["backoff"]
    assert kubelet.events[-1].reason == f"back-off 10s restarting failed container=vllm pod={kubelet.pods['vllm'][0].name}"
    assert pod_state(kube, 0) == {"ready": "False", "restarts": 1, "waiting": "CrashLoopBackOff"}
    fake.t += 9.0
    assert kubelet.sync() == []  # still backing off
    fake.t += 1.0
    assert [e.what for e in kubelet.sync()] == ["restarted", "unready"]
    assert [e.what for e in kubelet.sync()] == ["backoff"]
    assert "back-off 20s" in kubelet.events[-1].reason
    status = kube.get("Deployment", NS, "vllm")["status"]
    assert (status["updatedReplicas"], status["readyReplicas"], status["availableReplicas"]) == (1, 0, 0)
    assert {c["type"]: c["reason"] for c in status["conditions"]} == {
        "Available": "MinimumReplicasAvailable", "Progressing": "ReplicaSetUpdated"}  # 1 replica, 1 may be down
    # what an operator reads with the real kubectl
    columns = ("READY:.status.containerStatuses[0].ready,REASON:.status.containerStatuses[0].state.waiting.reason,"
               "RESTARTS:.status.containerStatuses[0].restartCount")
    row = kubectl(kube, "get", "pods", "--no-headers", "-o", f"custom-columns={columns}").split()
    assert row == ["false", "CrashLoopBackOff", "2"], row


def test_a_container_that_ran_ten_minutes_restarts_at_once(kube, tmp_path):
    fake = FakeTime()
    kubelet = make_kubelet(kube, tmp_path, fake)
    kube.put(vllm_deployment(replicas=1))
    kubelet.sync()
    pod = kubelet.pods["vllm"][0]
    for _ in range(3):  # three quick crashes: the back-off has grown to 20 s
        kubelet.runtime.live.clear()
        kubelet.sync()
        fake.t += restart_delay(pod.crashes)
        kubelet.sync()
    assert pod.crashes == 3 and pod.restarts == 3 and pod.ready
    fake.t += 600.0
    kubelet.runtime.live.clear()
    assert [e.what for e in kubelet.sync()] == ["restarted"]  # ran 10 min: no back-off
    assert pod.crashes == 1 and pod.ready
    assert pod_state(kube, 0) == {"ready": "True", "restarts": 4, "waiting": None}


def test_the_progress_deadline_is_the_controllers_condition():
    counts = ReplicaCounts(total=2, updated=1, ready=0)
    late = deployment_status(3, 2, counts, "vllm-abc", deadline_exceeded=True)
    assert late["observedGeneration"] == 3 and late["unavailableReplicas"] == 2
    assert late["conditions"][1] == {"type": "Progressing", "status": "False", "reason": "ProgressDeadlineExceeded",
                                     "message": 'ReplicaSet "vllm-abc" has timed out progressing.'}
    assert late["conditions"][0]["status"] == "False"  # 2 replicas, none ready: below maxUnavailable 1
    done = deployment_status(3, 2, ReplicaCounts(2, 2, 2), "vllm-abc", deadline_exceeded=True)
    assert done["conditions"][1]["reason"] == "NewReplicaSetAvailable"  # complete: no deadline to miss


def test_a_change_that_crashes_the_engine_is_held_at_one_replica_and_rolled_back(kube, tmp_path):
    fake = FakeTime()
    kubelet = make_kubelet(kube, tmp_path, fake)
    deployment = vllm_deployment(replicas=2)
    deployment["spec"]["progressDeadlineSeconds"] = 60
    kube.put(deployment)
    kubelet.sync()
    act = actuator_for(kube, [{"kind": "vllm-tiering-args", "name": "vllm", "container": "vllm"}], fake,
                       rollout_timeout_s=600)
    good = act.current()
    act.mark_good(good)
    seen: list[tuple[dict, dict]] = []

    def kubelet_pass(_t: float) -> None:  # the kubelet runs while the agent waits for the rollout
        kubelet.sync()
        if len(kubelet.pods["vllm"]) == 2:
            seen.append((pod_state(kube, 0), engine_view(kubelet.pods["vllm"][1].cmd.argv, {})))

    def rollout_status(_t: float) -> None:  # once the deadline has passed, as kubectl reads it
        status = kube.get("Deployment", NS, "vllm")["status"]
        if not watched and any(c["reason"] == "ProgressDeadlineExceeded" for c in status.get("conditions", [])):
            with pytest.raises(KubectlPatchError) as out:
                kubectl(kube, "rollout", "status", "deployment/vllm", "--timeout=5s")
            watched.append(str(out.value))

    watched: list[str] = []
    fake.on_sleep.extend([kubelet_pass, rollout_status])
    start = fake.t
    with pytest.raises(RolloutTimeoutError) as err:
        act.apply(good.replace(cpu_gib=64.0))
    assert watched and 'deployment "vllm" exceeded its progress deadline' in watched[0], watched
    message = str(err.value)
    assert "progress deadline exceeded" in message and "has timed out progressing" in message
    assert "rolled back to the last good configuration" in message
    assert 60 < fake.t - start < 600  # the controller's deadline, not the agent's own timeout
    assert any(state["waiting"] == "CrashLoopBackOff" and state["restarts"] >= 2 for state, _ in seen)
    assert all(view["cpu_bytes"] == 2 * GIB for _, view in seen)  # replica 1 kept the old flags throughout
    fake.on_sleep.clear()
    kubelet.sync()
    assert [v["cpu_bytes"] for v in (engine_view(p.cmd.argv, {}) for p in kubelet.pods["vllm"].values())] == \
        [2 * GIB, 2 * GIB]
    status = kube.get("Deployment", NS, "vllm")["status"]
    assert (status["updatedReplicas"], status["readyReplicas"]) == (2, 2)
    assert {c["type"]: c["reason"] for c in status["conditions"]}["Progressing"] == "NewReplicaSetAvailable"
    assert act.current() == good
