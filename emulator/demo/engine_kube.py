"""The real-engine demo's Kubernetes: the faithful kmock API on 127.0.0.1, the project's kubelet
running its Deployments as real processes, and `tierpilot run` (the production agent, as a child
process) pointed at it by a kubeconfig file.

    world = KubeWorld(scratch, progress=print).start()
    world.create(objects)                       # Deployments and ConfigMaps, as `kubectl apply` would
    ips = world.wait_pods(["vllm-tuned-0"])     # the kubelet started them; their pod IPs
    agent = AgentProcess(scratch, "tuned", config, port).start()
    ...
    agent.stop(); world.stop()

The API server leaves every Deployment's rollout to the kubelet (manual rollout: it writes the
status once the new pods answer their readiness probes), so the agent's actuator waits for real
restarts. The kubelet's pod events (started, stopped, restarted) are kept with the demo's clock.
"""
from __future__ import annotations

import json
import os
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from kubernetes import client as k8s

from emulator.cluster.kube_server import KubeServer
from emulator.demo.engine_cluster import NAMESPACE
from emulator.engines.child import ChildProcess, EngineError, http_status
from emulator.engines.engine import REPO
from emulator.engines.images import images
from emulator.engines.kubelet import Kubelet, PodEvent, ProcessRuntime
from emulator.engines.tiering import shared_regions


class ReadyRuntime(ProcessRuntime):
    """Real processes, each readiness noted as (pod, clock) (how long a restart kept a pod away)."""

    def __init__(self, *args: Any, clock: Callable[[], float], **kw: Any) -> None:
        super().__init__(*args, **kw)
        self.clock = clock
        self.ready: list[tuple[str, float]] = []
        self.closed = False  # set while the world stops: nothing starts again

    def start(self, pod: str, cmd: Any) -> Any:
        if self.closed:
            raise EngineError(f"pod {pod}: the kubelet is stopping")
        return super().start(pod, cmd)

    def wait_ready(self, handle: Any) -> float:
        seconds = super().wait_ready(handle)
        self.ready.append((handle.name, self.clock()))
        return seconds


class KubeWorld:
    """kmock's API and the kubelet (in a thread, a sync every second) over one namespace."""

    def __init__(self, scratch: Path, *, progress: Callable[[str], None] = print,
                 clock: Callable[[], float] = time.monotonic, ready_timeout_s: float = 420.0) -> None:
        self.scratch, self.progress, self.clock = Path(scratch), progress, clock
        self.ready_timeout_s = ready_timeout_s
        self.server = KubeServer()
        self.kubelet: Kubelet | None = None
        self.runtime: ReadyRuntime | None = None
        self.events: list[PodEvent] = []
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> KubeWorld:
        self.server.start()
        for kind in ("Deployment", "ConfigMap", "Pod"):  # the kinds the kubelet lists exist, even empty
            self.server.emu.resources[self.server.resource(kind)] = {}
        api = self.server.api_client()
        root = self.scratch / "kubelet"
        self.runtime = ReadyRuntime(root / "logs", ready_timeout_s=self.ready_timeout_s, clock=self.clock)
        self.kubelet = Kubelet(k8s.AppsV1Api(api), k8s.CoreV1Api(api), NAMESPACE, root, images(root), self.runtime,
                               clock=self.clock, on_event=self._on_event)
        self._thread = threading.Thread(target=self.kubelet.run, args=(self._stop, 1.0), name="kubelet", daemon=True)
        self._thread.start()
        return self

    @property
    def ready(self) -> list[tuple[str, float]]:
        return self.runtime.ready if self.runtime is not None else []

    def _on_event(self, ev: PodEvent) -> None:
        self.events.append(ev)
        if ev.what in ("started", "stopped", "restarted", "failed", "unready", "backoff"):
            self.progress(f"kubelet: {ev.what} {ev.pod}" + (f" ({ev.reason})" if ev.what != "started" else ""))

    def create(self, objects: Iterable[dict[str, Any]]) -> None:
        """Objects as an outside writer creates them; Deployments roll out by the kubelet only."""
        for obj in objects:
            if obj["kind"] == "Deployment":
                self.server.manual_rollout("Deployment", NAMESPACE, obj["metadata"]["name"])
            self.server.put(obj)

    def kubeconfig(self, path: Path) -> Path:
        return self.server.write_kubeconfig(path, NAMESPACE)

    def wait_pods(self, deployments: list[str], timeout_s: float | None = None) -> dict[str, str]:
        """Block until each Deployment's first replica runs and is ready; its pod IP by Deployment.
        A pod that could not start, or exited before it was ready, fails it at once."""
        assert self.kubelet is not None
        deadline = self.clock() + (timeout_s or self.ready_timeout_s * max(1, len(deployments)))
        while True:
            pods = {name: self.kubelet.pods.get(name, {}).get(0) for name in deployments}
            ready = {n: p.ip for n, p in pods.items() if p is not None and p.ready and self._published(p.name)}
            if len(ready) == len(deployments):
                return ready
            failed = [e for e in self.events if e.what in ("failed", "unready")]  # could not start, or crashed
            if failed:
                raise EngineError(f"kubelet: pod {failed[-1].pod} failed: {failed[-1].reason}")
            if self.clock() > deadline:
                missing = ", ".join(sorted(set(deployments) - set(ready)))
                raise EngineError(f"kubelet: {missing} not ready in time (logs: {self.scratch / 'kubelet' / 'logs'})")
            time.sleep(0.5)

    def _published(self, pod: str) -> bool:
        return self.server.get("Pod", NAMESPACE, pod) is not None

    def deployment(self, name: str) -> dict[str, Any] | None:
        return self.server.get("Deployment", NAMESPACE, name)

    def patches(self, plural: str = "deployments") -> list[dict[str, Any]]:
        """Every PATCH the API server received for `plural` (the agent's and the kubelet's status writes)."""
        return self.server.requests("PATCH", plural)

    def stop(self) -> None:
        """Stop every pod (a sync waiting for a pod to become ready gives up at once), then the kubelet
        and the API server."""
        self._stop.set()
        if self.kubelet is not None and self.runtime is not None:
            self.runtime.closed = True
            for pods in list(self.kubelet.pods.values()):
                for pod in list(pods.values()):
                    self.runtime.stop(pod.handle)
        if self._thread is not None:
            self._thread.join(timeout=60)
        if self.kubelet is not None:
            self.kubelet.shutdown()
            for pod in {e.pod for e in self.events}:  # a killed engine leaves its CPU tier's region
                for path in shared_regions(pod):
                    path.unlink(missing_ok=True)
        self.server.stop()


class AgentProcess(ChildProcess):
    """`tierpilot run --config FILE` (python -m agent.cli run), logging to `agent-<name>.log`."""

    kind = "tierpilot run"
    healthy_timeout_s = 120.0

    def __init__(self, scratch: Path, name: str, config: dict[str, Any], port: int, **kw: Any) -> None:
        super().__init__(scratch, f"agent-{name}.log", **kw)
        self.name, self.config, self.port = name, config, port
        self.config_path = self.scratch / f"agent-{name}.yaml"
        self.spec = self  # ChildProcess's messages name `spec.port`

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> AgentProcess:
        import yaml

        self.config_path.write_text(yaml.safe_dump(self.config, sort_keys=False))
        env = {**os.environ, "PYTHONPATH": str(REPO), "PYTHONUNBUFFERED": "1"}
        env.pop("KUBECONFIG", None)  # the config names its kubeconfig
        self._launch([sys.executable, "-m", "agent.cli", "run", "--config", str(self.config_path)], env)
        return self

    def _healthy(self) -> bool:
        return http_status(f"{self.url}/metrics", 2.0) == 200

    def health(self) -> dict[str, Any] | None:
        """/healthz as JSON (it answers 503 while degraded, with the same body), or None."""
        try:
            with urllib.request.urlopen(f"{self.url}/healthz", timeout=3.0) as r:
                return json.loads(r.read())
        except urllib.error.HTTPError as exc:
            try:
                return json.loads(exc.read())
            except ValueError:
                return None
        except (OSError, ValueError):
            return None

    def pods_up(self) -> set[str]:
        """The pods the agent scrapes successfully now (`tierpilot_target_up{pod} 1` on its /metrics)."""
        import re

        try:
            with urllib.request.urlopen(f"{self.url}/metrics", timeout=3.0) as r:
                text = r.read().decode()
        except OSError:
            return set()
        return {m.group(2) for m in re.finditer(r'^tierpilot_target_up\{([^}]*?)pod="([^"]+)"[^}]*\} 1(\.0)?$', text,
                                                re.MULTILINE)}

    def log_lines(self, start: int = 0) -> list[str]:
        try:
            return self.log_path.read_text(errors="replace").splitlines()[start:]
        except OSError:
            return []


__all__ = ["AgentProcess", "KubeWorld"]
