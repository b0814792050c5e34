"""The project's kubelet on a real vLLM CPU engine: one tiered engine described as a Deployment in
kmock's API, started from its container args and env; the agent's Kubernetes actuator changes the
CPU tier's size inside `--kv-transfer-config`, and the kubelet restarts the engine with it. The
engine's own evidence: the process's command line, `/health` on the pod IP, and the CPU tier's
shared region in /dev/shm, named after the pod and sized by the engine from `cpu_bytes_to_use`."""
from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

import pytest
from kubernetes import client as k8s

from emulator.engines.child import http_status
from emulator.engines.images import deployment, engine_container, images
from emulator.engines.kubelet import Kubelet, ProcessRuntime
from emulator.engines.tiering import TieringConfig, shared_regions
from tests.support.kube import NS, FakeTime, actuator_for, serve
from tests.support.real_engine import engine_spec, skip_reason

# slow: two real engine starts, 25-30 s each on an idle machine (4-5 min under the shared load)
pytestmark = [pytest.mark.skipif(skip_reason() is not None, reason=skip_reason() or ""), pytest.mark.slow]
MIB = 1 << 20


def _region_bytes(pod: str) -> int:
    return sum(p.stat().st_size for p in shared_regions(pod))


def test_a_deployment_patch_restarts_the_real_engine_with_the_new_cpu_tier(shared_dir):
    tmp_path = Path(tempfile.mkdtemp(prefix="kubelet-"))  # short: vLLM's ipc socket paths live in TMPDIR
    spec = engine_spec(cpu_bind="0", kv_events=False, tiering=TieringConfig(cpu_bytes=16 * MIB))
    server = next(gen := serve(shared_dir))
    for kind in ("Deployment", "ConfigMap", "Pod"):
        server.emu.resources[server.resource(kind)] = {}
    server.put(deployment("vllm", NS, [engine_container(spec)]))
    api = server.api_client()
    kubelet = Kubelet(k8s.AppsV1Api(api), k8s.CoreV1Api(api), NS, tmp_path, images(tmp_path),
                      ProcessRuntime(tmp_path / "logs", ready_timeout_s=420))
    try:
        kubelet.sync()
        first = kubelet.pods["vllm"][0]
        url = f"http://{first.ip}:{spec.port}/health"
        assert http_status(url, 5.0) == 200
        assert _region_bytes(first.name) >= 16 * MIB
        act = actuator_for(server, [{"kind": "vllm-tiering-args", "name": "vllm", "container": "vllm"}], FakeTime())
        live = act.current()
        act.mark_good(live)
        act.apply(live.replace(cpu_gib=48 * MIB / (1 << 30)))
        events = kubelet.sync()
        assert [e.what for e in events] == ["stopped", "started"]
        second = kubelet.pods["vllm"][0]
        assert second.name != first.name and first.handle.proc is None
        cmdline = Path(f"/proc/{second.handle.proc.pid}/cmdline").read_bytes().decode()
        assert f'"cpu_bytes_to_use":{48 * MIB}' in cmdline
        assert http_status(url, 5.0) == 200
        assert _region_bytes(second.name) >= 48 * MIB > _region_bytes(first.name)
    finally:
        kubelet.shutdown()
        for pod in {e.pod for e in kubelet.events}:  # a killed engine leaves its CPU tier's region
            for path in shared_regions(pod):
                path.unlink(missing_ok=True)
        next(gen, None)
    shutil.rmtree(tmp_path, ignore_errors=True)  # kept when the test fails: the pods' logs are there
