"""The real-engine demo's Kubernetes path on one real engine, end to end: the demo writes its fleet as
objects into the kmock API (the Curvine master with its ConfigMap, the engine Deployment with native
tiering in `--kv-transfer-config`, then vllm-router on the engine's pod IP); the kubelet runs them as
processes; `tierpilot run` (a child process, with the kubeconfig the demo writes) discovers the pod
and serves its metrics; the agent's actuator (`tierpilot k8s apply`, the same KubernetesActuator the
tuner drives) patches the Deployment through the API, and the kubelet restarts the engine with the new
args: the new process's command line carries the new CPU tier, whose shared region vLLM sized from it,
and the agent follows the new pod. A request through the router is served before and after."""
from __future__ import annotations

import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from emulator.demo.engine_cluster import NAMESPACE
from emulator.demo.engine_kube import KubeWorld
from emulator.demo.engine_pass import knobs_from_deployment
from emulator.demo.engine_run import (
    EngineDemoSettings,
    fleet_design,
    start_agents,
    start_fleets,
    warm_up_prompts,
)
from emulator.demo.engine_tuning import ENGINE_KNOBS
from emulator.engines.client import StreamSender
from emulator.engines.tiering import shared_regions
from tests.support.real_engine import ROUTER_BINARY, skip_reason

# slow: two real engine starts (25-30 s each on an idle machine, minutes under the shared load)
pytestmark = [pytest.mark.skipif(skip_reason() is not None or ROUTER_BINARY is None,
                                 reason=skip_reason() or "no vllm-router"), pytest.mark.slow,
              pytest.mark.timeout(1200)]
MIB = 1 << 20


def _region_bytes(pod: str) -> int:
    return sum(p.stat().st_size for p in shared_regions(pod))


def _wait(cond, timeout_s: float, what: str):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        got = cond()
        if got:
            return got
        time.sleep(0.5)
    raise AssertionError(f"timed out: {what}")


def _served(url: str) -> bool:
    """One request through the router, answered (a fresh engine's first requests take a minute on a
    loaded machine: no timeout shorter than that)."""
    sender = StreamSender(url, model="tiny-llama", timeout_s=300.0, retry_for_s=60.0)
    return all(c.ok for c in sender.send_closed_loop(warm_up_prompts(1)))


def test_the_agent_patches_a_deployment_and_the_kubelet_restarts_the_engine_with_its_args() -> None:
    scratch = Path(tempfile.mkdtemp(prefix="tp-k8s-"))  # short: vLLM's ipc socket paths live in TMPDIR
    settings = EngineDemoSettings(engines=1, agent_port=0)
    design = fleet_design("tuned", settings, scratch)
    world = KubeWorld(scratch, progress=lambda _m: None).start()
    agents = {}
    try:
        routers = start_fleets(world, [design], lambda _m: None)
        assert {d["metadata"]["name"] for d in world.server.objects_of("Deployment")} == {
            "vllm-tuned-0", "curvine-master-tuned", "vllm-router-tuned"}
        first = world.kubelet.pods["vllm-tuned-0"][0]
        assert _region_bytes(first.name) >= ENGINE_KNOBS.cpu_gib * 1024 * MIB
        assert _served(routers["tuned"]), "the router served nothing"
        agents = start_agents(world, [design], settings, scratch, tuning={"tuned": False})
        agent = agents["tuned"]
        _wait(lambda: first.name in agent.pods_up(), 60, "the agent discovers the engine's pod")

        knobs = scratch / "knobs.yaml"
        knobs.write_text("cpu_gib: 0.046875\nchunk_tokens: 256\ncpu_eviction: lru\n")  # 48 MiB
        targets = scratch / "targets-tuned.yaml"
        out = subprocess.run([sys.executable, "-m", "agent.cli", "k8s", "--kubeconfig", str(scratch / "kubeconfig"),
                              "apply", str(targets), str(knobs)], check=False, capture_output=True, text=True,
                             timeout=600)
        assert out.returncode == 0, out.stdout + out.stderr
        live = world.deployment("vllm-tuned-0")
        assert knobs_from_deployment(live, ENGINE_KNOBS).cpu_gib == 0.046875
        assert [(e.what, e.pod) for e in world.events if e.pod.startswith("vllm-tuned-0")][:2] == [
            ("started", first.name), ("stopped", first.name)]
        second = world.kubelet.pods["vllm-tuned-0"][0]
        assert second.name != first.name and second.ip == first.ip  # a new pod, the same pod IP
        cmdline = Path(f"/proc/{second.handle.proc.pid}/cmdline").read_bytes().decode()
        assert f'"cpu_bytes_to_use":{48 * MIB}' in cmdline
        assert _region_bytes(second.name) >= 48 * MIB > _region_bytes(first.name)
        _wait(lambda: second.name in agent.pods_up(), 60, "the agent follows the new pod")
        assert _served(routers["tuned"]), "the router serves after the restart"
        assert world.server.get("Deployment", NAMESPACE, "vllm-tuned-0")["status"]["observedGeneration"] == \
            live["metadata"]["generation"]  # the kubelet reported the rollout done
    finally:
        for a in agents.values():
            a.stop()
        world.stop()
    shutil.rmtree(scratch, ignore_errors=True)  # kept when the test fails: the pods' and the agent's logs are there
