"""A small kubelet for one namespace: Deployments in a Kubernetes API become real processes here.

It reads the namespace's Deployments and ConfigMaps through the `kubernetes` client (injected:
`AppsV1Api` and `CoreV1Api` objects, e.g. over kmock's HTTP API in tests and in the demo) and runs
each replica's container as the kubelet would (emulator/engines/podspec.py: the argv from command
and args, the environment from env and envFrom, ConfigMap volumes as files). Each `sync()`:

- Deployments are reconciled side by side (their pods start together, as on a node); a
  Deployment whose pod template changed (args, env, image, annotations: any byte of it) is
  rolled, one replica at a time (maxSurge 0, maxUnavailable 1: a replica keeps its pod IP, so its
  ports are free only once the old process is gone): stop the old process, start the new command
  line, wait until its readiness probe answers, then the next replica;
- a replica whose process exited is started again (restartPolicy Always), after the kubelet's
  back-off once it keeps crashing (CrashLoopBackOff: kubelet_status.py); a replica is Ready once
  its readiness probe answers (a running replica that is not Ready is probed again each pass),
  and an updated replica that is not Ready holds the roll (the replicas still on the old template
  keep running);
- a pod with a ConfigMap volume whose ConfigMap does not exist (and is not `optional`) waits,
  not started (ContainerCreating, "MountVolume.SetUp failed"), until the ConfigMap appears;
- a ConfigMap change rewrites the files of every pod that mounts it, atomically, as the kubelet
  does (a `..data` symlink swapped to a new directory: configmap_volume.py). A process that re-reads its file (the
  emulated Curvine master re-reads nothing: it reads its TOML at start) sees it; one that reads at
  start sees it at its next start, which is why a restart-requiring file change is paired with a
  pod-template annotation (the agent's config hash) that rolls the pods. Environment variables
  from a ConfigMap are, as in Kubernetes, read only when the container starts;
- replicas above `spec.replicas`, and the pods of a deleted Deployment, are stopped.

Pods get stable loopback IPs (127.0.0.N per Deployment and replica ordinal), so several replicas
bind the same port; each running pod is published as a Pod object (labels, annotations,
status.podIP, readiness, restarts) so the agent's discovery finds it, and the Deployment's status
says how many of its pods are ready, with the controller's conditions (a rollout that makes no
progress for `progressDeadlineSeconds` reports `ProgressDeadlineExceeded`). The container runtime
is injected (container_runtime.py: real child processes; tests use fakes).
"""
from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from emulator.engines.child import EngineError
from emulator.engines.configmap_volume import project_configmap
from emulator.engines.container_runtime import PodProcess, ProcessRuntime, Runtime
from emulator.engines.kubelet_status import (
    BACKOFF_RESET_S,
    PROGRESS_DEADLINE_S,
    ReplicaCounts,
    deployment_status,
    pod_status,
    restart_delay,
    same_status,
)
from emulator.engines.podspec import Image, PodCommand, PodInfo, PodSpecError, pod_command, template_hash

log = logging.getLogger("tierpilot.kubelet")


@dataclass
class Pod:
    name: str
    deployment: str
    ordinal: int
    template_hash: str
    ip: str
    cmd: PodCommand
    handle: Any
    configmaps: tuple[str, ...]  # the ConfigMaps its volumes project
    container: str = "main"
    image: str = "-"
    restarts: int = 0
    ready: bool = False
    started_at: float = 0.0
    crashes: int = 0  # exits in a row, each soon after its start (the back-off's count)
    restart_at: float | None = None  # exited: when the back-off lets it start again


@dataclass(frozen=True)
class PodEvent:
    """Something the kubelet did: `started`, `stopped`, `restarted` (the process had exited),
    `backoff` (it keeps crashing: CrashLoopBackOff), `unready` (it did not answer its readiness
    probe), `files`, `waiting`, `failed`."""

    what: str
    pod: str
    at: float
    reason: str = ""


class Kubelet:
    """Runs the Deployments of `namespace` as processes (`sync()` once, `run()` until stopped)."""

    def __init__(self, apps: Any, core: Any, namespace: str, scratch: Path, images: Mapping[str, Image],
                 runtime: Runtime, *, clock: Callable[[], float] = time.monotonic,
                 on_event: Callable[[PodEvent], None] | None = None, publish: bool = True) -> None:
        self.apps, self.core, self.namespace = apps, core, namespace
        self.scratch, self.images, self.runtime = Path(scratch), dict(images), runtime
        self.clock, self.on_event, self.publish = clock, on_event, publish
        self.pods: dict[str, dict[int, Pod]] = {}
        self.events: list[PodEvent] = []
        self._ips: dict[tuple[str, int], str] = {}
        self._cm_seen: dict[str, dict[str, str]] = {}
        self._waiting: set[str] = set()  # pods whose ConfigMap volume is absent, not started yet
        # Deployment -> (template hash, when its rollout last made progress, ready updated replicas then)
        self._progress: dict[str, tuple[str, float, int]] = {}
        self._stamp = 0
        self._lock = threading.Lock()

    # -- reading the API -------------------------------------------------------------------------
    def _configmaps(self) -> dict[str, dict[str, str]]:
        items = self.core.list_namespaced_config_map(self.namespace).items
        return {cm.metadata.name: dict(cm.data or {}) for cm in items}

    def _deployments(self) -> dict[str, dict[str, Any]]:
        items = self.apps.list_namespaced_deployment(self.namespace).items
        client = self.apps.api_client
        return {d.metadata.name: client.sanitize_for_serialization(d) for d in items}

    # -- one pass --------------------------------------------------------------------------------
    def sync(self) -> list[PodEvent]:
        """Bring the processes in line with the API once; the events of this pass."""
        with self._lock:
            before = len(self.events)
            configmaps = self._configmaps()
            self._update_files(configmaps)
            deployments = self._deployments()
            for name in [n for n in self.pods if n not in deployments]:
                for ordinal in list(self.pods[name]):
                    self._stop(name, ordinal, "Deployment deleted")
                del self.pods[name]
            for name, obj in deployments.items():  # IPs in a stable order before the pods start side by side
                for ordinal in range(int((obj.get("spec") or {}).get("replicas", 1))):
                    self._ip(name, ordinal)
            if len(deployments) > 1:  # Deployments start side by side; one Deployment's replicas one by one
                with ThreadPoolExecutor(len(deployments), thread_name_prefix="kubelet-pod") as pool:
                    list(pool.map(lambda item: self._reconcile(item[0], item[1], configmaps), deployments.items()))
            else:
                for name, obj in deployments.items():
                    self._reconcile(name, obj, configmaps)
            return self.events[before:]

    def run(self, stop: threading.Event, interval_s: float = 1.0) -> None:
        """`sync()` every `interval_s` until `stop` is set; a failing pass is logged and retried."""
        while not stop.is_set():
            try:
                self.sync()
            except Exception as exc:  # noqa: BLE001 - the loop outlives one bad pass, as the kubelet does
                log.warning("kubelet sync: %s", exc)
            stop.wait(interval_s)

    def shutdown(self) -> None:
        with self._lock:
            for name in list(self.pods):
                for ordinal in list(self.pods[name]):
                    self._stop(name, ordinal, "kubelet shutdown")
            self.pods.clear()

    # -- internals -------------------------------------------------------------------------------
    def _event(self, what: str, pod: str, reason: str = "") -> None:
        ev = PodEvent(what, pod, self.clock(), reason)
        self.events.append(ev)
        log.info("%s %s %s", what, pod, reason)
        if self.on_event is not None:
            self.on_event(ev)

    def _ip(self, deployment: str, ordinal: int) -> str:
        key = (deployment, ordinal)
        if key not in self._ips:
            self._ips[key] = f"127.0.0.{10 + len(self._ips)}"
        return self._ips[key]

    def _reconcile(self, name: str, obj: dict[str, Any], configmaps: dict[str, dict[str, str]]) -> None:
        spec = obj.get("spec") or {}
        template = spec.get("template") or {}
        want, replicas = template_hash(template), int(spec.get("replicas", 1))
        pods = self.pods.setdefault(name, {})
        for ordinal in sorted(o for o in pods if o >= replicas):
            self._stop(name, ordinal, "scaled down")
        for ordinal in range(replicas):
            pod = pods.get(ordinal)
            if pod is not None and pod.template_hash == want:
                self._keep_running(pod)
                continue
            if pod is not None:
                if any(p.template_hash == want and not p.ready for p in pods.values()):
                    break  # maxUnavailable 1: an updated replica that is not Ready holds the roll
                self._stop(name, ordinal, "pod template changed")
            self._start(name, ordinal, template, want, configmaps)
        self._write_status(name, obj, replicas, want)

    def _keep_running(self, pod: Pod) -> None:
        """restartPolicy Always: an exited container starts again, after the back-off. A running
        container that is not Ready is probed again each pass, and turns Ready when it answers."""
        if pod.restart_at is None and self.runtime.running(pod.handle):
            if not pod.ready and self.runtime.probe(pod.handle):
                pod.ready = True
                self._event("ready", pod.name, "the readiness probe succeeded")
                self._publish_status(pod)
            return
        now = self.clock()
        if pod.restart_at is None:  # found exited
            if now - pod.started_at >= BACKOFF_RESET_S:
                pod.crashes = 0
            pod.crashes += 1
            pod.ready = False
            delay = restart_delay(pod.crashes)
            pod.restart_at = now + delay
            if delay > 0:
                message = f"back-off {delay:g}s restarting failed container={pod.container} pod={pod.name}"
                self._event("backoff", pod.name, message)
                self._publish_status(pod, "CrashLoopBackOff", message)
        if now < pod.restart_at:
            return
        pod.restart_at = None
        self.runtime.stop(pod.handle)
        pod.handle = self.runtime.start(pod.name, pod.cmd)
        pod.restarts += 1
        pod.started_at = now
        self._event("restarted", pod.name, "the process exited (restartPolicy Always)")
        self._await_ready(pod)
        self._publish_status(pod)

    def _await_ready(self, pod: Pod) -> None:
        try:
            self.runtime.wait_ready(pod.handle)
        except EngineError as exc:  # it exited or never answered: not Ready; the next pass restarts it
            pod.ready = False
            self._event("unready", pod.name, str(exc))
        else:
            pod.ready = True

    def _start(self, name: str, ordinal: int, template: dict[str, Any], want: str,
               configmaps: dict[str, dict[str, str]]) -> None:
        meta = template.get("metadata") or {}
        pod_name = f"{name}-{want}-{ordinal}"
        info = PodInfo(pod_name, self.namespace, self._ip(name, ordinal), dict(meta.get("labels") or {}),
                       dict(meta.get("annotations") or {}))
        pod_dir = self.scratch / "pods" / pod_name
        try:
            cmd = pod_command(template, None, info, configmaps, self.images, pod_dir)
        except PodSpecError as exc:
            self._event("failed", pod_name, str(exc))
            return
        volumes = (template.get("spec") or {}).get("volumes") or []
        absent = [v["configMap"]["name"] for v in volumes if "configMap" in v and not v["configMap"].get("optional")
                  and v["configMap"]["name"] not in configmaps]
        if absent:  # as the kubelet: the pod waits (ContainerCreating) until the ConfigMap exists
            if pod_name not in self._waiting:
                self._waiting.add(pod_name)
                self._event("waiting", pod_name, f"MountVolume.SetUp failed: configmap {absent[0]!r} not found")
            return
        self._waiting.discard(pod_name)
        projected = []
        for vol in volumes:
            if "configMap" in vol:
                cm = vol["configMap"]["name"]
                self._project(pod_dir / "volumes" / vol["name"], configmaps.get(cm, {}))
                projected.append(cm)
            elif "emptyDir" in vol:
                (pod_dir / "volumes" / vol["name"]).mkdir(parents=True, exist_ok=True)
        main = ((template.get("spec") or {}).get("containers") or [{}])[0]
        handle = self.runtime.start(pod_name, cmd)
        pod = Pod(pod_name, name, ordinal, want, info.ip, cmd, handle, tuple(projected),
                  container=main.get("name") or "main", image=main.get("image") or "-", started_at=self.clock())
        self.pods[name][ordinal] = pod
        self._event("started", pod_name, " ".join(cmd.argv[-4:]))
        self._await_ready(pod)
        self._publish_pod(pod, info)

    def _stop(self, name: str, ordinal: int, reason: str) -> None:
        pod = self.pods[name].pop(ordinal)
        self.runtime.stop(pod.handle)
        self._event("stopped", pod.name, reason)
        if self.publish:
            try:
                self.core.delete_namespaced_pod(pod.name, self.namespace)
            except Exception as exc:  # noqa: BLE001 - the Pod object is a report; the process is what runs
                log.debug("delete pod %s: %s", pod.name, exc)

    def _project(self, target: Path, data: Mapping[str, str]) -> None:
        self._stamp += 1
        project_configmap(target, data, f"{self._stamp:06d}")

    def _update_files(self, configmaps: dict[str, dict[str, str]]) -> None:
        for cm, data in configmaps.items():
            if self._cm_seen.get(cm, data) != data:
                for pods in self.pods.values():
                    for pod in pods.values():
                        if cm in pod.configmaps:
                            self._refresh(pod, cm, data)
            self._cm_seen[cm] = data

    def _refresh(self, pod: Pod, cm: str, data: Mapping[str, str]) -> None:
        obj = self.apps.read_namespaced_deployment(pod.deployment, self.namespace)
        volumes = self.apps.api_client.sanitize_for_serialization(obj)["spec"]["template"]["spec"].get("volumes", [])
        for vol in volumes:
            if (vol.get("configMap") or {}).get("name") == cm:
                self._project(self.scratch / "pods" / pod.name / "volumes" / vol["name"], data)
                self._event("files", pod.name, f"ConfigMap {cm} updated in volume {vol['name']}")

    def _publish_pod(self, pod: Pod, info: PodInfo) -> None:
        if not self.publish:
            return
        body = {"apiVersion": "v1", "kind": "Pod",
                "metadata": {"name": pod.name, "namespace": self.namespace, "labels": dict(info.labels),
                             "annotations": dict(info.annotations)},
                "spec": {"containers": [{"name": pod.container, "image": pod.image}]},
                "status": pod_status(pod.ip, pod.container, pod.image, ready=pod.ready, restarts=pod.restarts)}
        try:
            self.core.create_namespaced_pod(self.namespace, body)
        except Exception as exc:  # noqa: BLE001 - see _stop
            log.debug("create pod %s: %s", pod.name, exc)

    def _publish_status(self, pod: Pod, waiting: str | None = None, message: str = "") -> None:
        if not self.publish:
            return
        status = pod_status(pod.ip, pod.container, pod.image, ready=pod.ready, restarts=pod.restarts,
                            waiting=waiting, message=message)
        try:
            self.core.patch_namespaced_pod_status(pod.name, self.namespace, {"status": status})
        except Exception as exc:  # noqa: BLE001 - see _stop
            log.debug("status of pod %s: %s", pod.name, exc)

    def _write_status(self, name: str, obj: dict[str, Any], replicas: int, template: str) -> None:
        pods = self.pods.get(name, {}).values()
        updated = [p for p in pods if p.template_hash == template]
        counts = ReplicaCounts(len(pods), len(updated), sum(p.ready for p in updated))
        now = self.clock()
        seen, since, ready_then = self._progress.get(name, (template, now, -1))
        if seen != template or counts.ready > ready_then:  # a new rollout, or one more replica ready
            since, ready_then = now, counts.ready
        self._progress[name] = (template, since, ready_then)
        spec = obj.get("spec") or {}
        deadline = float(spec.get("progressDeadlineSeconds") or PROGRESS_DEADLINE_S)
        if not self.publish:
            return
        gen = (obj.get("metadata") or {}).get("generation", 1)
        want = deployment_status(gen, replicas, counts, f"{name}-{template}", deadline_exceeded=now - since > deadline)
        if same_status(obj.get("status") or {}, want):
            return
        try:
            self.apps.patch_namespaced_deployment_status(name, self.namespace, {"status": want})
        except Exception as exc:  # noqa: BLE001 - see _stop
            log.debug("status of %s: %s", name, exc)


__all__ = ["Kubelet", "Pod", "PodEvent", "PodProcess", "ProcessRuntime", "Runtime"]


def main(argv: list[str] | None = None) -> int:
    """`python -m emulator.engines.kubelet --server URL --namespace NS`: run until interrupted."""
    import argparse

    from kubernetes import client as k8s

    from emulator.engines.images import images

    ap = argparse.ArgumentParser(
        prog="python -m emulator.engines.kubelet",
        description="Run a namespace's Deployments as processes on this host (vllm-cpu, vllm-router, "
                    "curvine-master images), following changes to them and to the ConfigMaps they use.",
        epilog="example: python -m emulator.engines.kubelet --server http://127.0.0.1:8001 --namespace llm "
               "--scratch /var/tmp/kubelet")
    ap.add_argument("--server", required=True, help="the Kubernetes API's URL (no authentication)")
    ap.add_argument("--namespace", default="default", help="the namespace to run [default]")
    ap.add_argument("--scratch", type=Path, required=True, help="pods' volumes, logs and caches go here")
    ap.add_argument("--interval", type=float, default=1.0, help="seconds between passes [1.0]")
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    cfg = k8s.Configuration()
    cfg.host = args.server
    api = k8s.ApiClient(cfg)
    kubelet = Kubelet(k8s.AppsV1Api(api), k8s.CoreV1Api(api), args.namespace, args.scratch, images(args.scratch),
                      ProcessRuntime(args.scratch / "logs"))
    stop = threading.Event()
    try:
        kubelet.run(stop, args.interval)
    except KeyboardInterrupt:
        pass
    finally:
        kubelet.shutdown()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
