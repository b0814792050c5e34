"""The emulated cluster: N vLLM pods (each with its Curvine FUSE mount) and one Curvine master,
all on 127.0.0.1, each serving the real exposition format of its component.

Restarts behave like a Kubernetes rollout replacing a pod: the pod's endpoints close (scrapes get
"connection refused"), its metric state is replaced by a fresh one (counters at zero, `_created`
at the new start time) and, through the `on_restart` hooks, the twin drops the pod's private
caches and the KV-event publisher resets its sequence and announces `AllBlocksCleared`.

The twin has no notion of a pod being down, so it keeps serving the restarting pod's share of the
requests (with the caches it just dropped). Those requests belong to the new process: while the
pod is down they are held back and recorded by the fresh metric state when it starts, so every
request the twin served is in exactly one process's counters (the ground truth stays complete).
"""
from __future__ import annotations

import dataclasses
import threading
import time
from collections.abc import Callable
from typing import Self

from emulator.cluster.exposition import render_python_client, render_rust_text
from emulator.cluster.http_endpoint import MetricsEndpoint
from emulator.cluster.pod_metrics import (
    CurvineFuseMetrics,
    CurvineMasterMetrics,
    PodIdentity,
    RequestOutcome,
    VllmPodMetrics,
)

RestartHook = Callable[[str], None]


def pod_names(n: int) -> tuple[str, ...]:
    if n < 1:
        raise ValueError(f"--pods must be at least 1, got {n}")
    return tuple(f"vllm-{i}" for i in range(n))


class EmulatedPod:
    """One vLLM pod: the engine's `/metrics` (with LMCache's series) and its FUSE mount's."""

    def __init__(self, name: str, identity: PodIdentity, clock: Callable[[], float], *, vllm_port: int = 0,
                 fuse_port: int = 0) -> None:
        self.name = name
        self.identity = identity
        self._clock = clock
        self.restarts = 0
        self._lock = threading.Lock()
        self._held: list[RequestOutcome] | None = None  # requests served while the pod is down
        self._held_evictions = 0
        self._held_io: list[tuple[str, int, tuple[float, ...]]] = []
        self.metrics = VllmPodMetrics(identity, clock())
        self.fuse = CurvineFuseMetrics(clock())
        self.vllm_endpoint = MetricsEndpoint(lambda: render_python_client(self.metrics.snapshot()), vllm_port)
        self.fuse_endpoint = MetricsEndpoint(lambda: render_rust_text(self.fuse.snapshot()), fuse_port)

    @property
    def up(self) -> bool:
        return self.vllm_endpoint.running

    def start(self) -> None:
        self.vllm_endpoint.start()
        self.fuse_endpoint.start()

    def stop(self) -> None:
        self.vllm_endpoint.stop()
        self.fuse_endpoint.stop()

    def record(self, outcome: RequestOutcome) -> None:
        with self._lock:
            if self._held is not None:
                self._held.append(outcome)
            else:
                self.metrics.record(outcome)

    def record_cpu_evictions(self, chunks: int) -> None:
        with self._lock:
            if self._held is not None:
                self._held_evictions += max(chunks, 0)
            else:
                self.metrics.record_cpu_evictions(chunks)

    def record_io(self, io_type: str, nbytes: int, latencies_us: tuple[float, ...] | list[float]) -> None:
        """The engine's L2 I/O through the node's FUSE mount (held, like its requests, while the
        engine is down: the FUSE daemon sees that I/O when the new engine does it)."""
        with self._lock:
            if self._held is not None:
                self._held_io.append((io_type, nbytes, tuple(latencies_us)))
                return
        self.fuse.record_io(io_type, nbytes, latencies_us)

    def go_down(self) -> None:
        """The old process is gone: its counters are no longer updated."""
        with self._lock:
            self._held = []
            self._held_evictions = 0
        self.vllm_endpoint.stop()

    def reset_state(self) -> None:
        """A new process: fresh counters whose `_created` is now, with the requests served while
        the pod was down. The FUSE daemon is per node and survives a pod restart, so its counters
        carry on."""
        with self._lock:
            self.metrics = VllmPodMetrics(self.identity, self._clock())
            for o in self._held or ():
                self.metrics.record(o)
            self.metrics.record_cpu_evictions(self._held_evictions)
            for io_type, nbytes, lat in self._held_io:
                self.fuse.record_io(io_type, nbytes, lat)
            self._held = None
            self._held_evictions = 0
            self._held_io = []
            self.restarts += 1


@dataclasses.dataclass(frozen=True)
class ClusterSpec:
    pods: int = 4
    identity: PodIdentity = dataclasses.field(default_factory=PodIdentity)
    restart_downtime_s: float = 0.5  # wall seconds a restarting pod is unreachable
    # 0: free ports; else pod i serves vLLM's /metrics on base_port + i, its FUSE mount's on
    # base_port + pods + i, and the Curvine master on base_port + 2 * pods
    base_port: int = 0

    def ports(self) -> tuple[list[tuple[int, int]], int]:
        """((vLLM port, FUSE port) per pod, master port); all 0 without a base port."""
        b, n = self.base_port, self.pods
        if not b:
            return [(0, 0)] * n, 0
        return [(b + i, b + n + i) for i in range(n)], b + 2 * n


class EmulatedCluster:
    """Owns every endpoint; thread-safe restarts; hooks tell the twin and publishers."""

    def __init__(self, spec: ClusterSpec, clock: Callable[[], float] = time.time,
                 sleep: Callable[[float], None] = time.sleep) -> None:
        self.spec = spec
        self._clock = clock
        self._sleep = sleep
        pod_ports, master_port = spec.ports()
        self.pods: dict[str, EmulatedPod] = {
            n: EmulatedPod(n, spec.identity, clock, vllm_port=v, fuse_port=f)
            for n, (v, f) in zip(pod_names(spec.pods), pod_ports, strict=True)}
        self.master = CurvineMasterMetrics(clock())
        self.master_endpoint = MetricsEndpoint(lambda: render_rust_text(self.master.snapshot()), master_port)
        self._restart_hooks: list[RestartHook] = []
        self._lock = threading.Lock()
        self.master_restarts = 0

    # -- lifecycle ---------------------------------------------------------------------------------
    def start(self) -> None:
        for pod in self.pods.values():
            pod.start()
        self.master_endpoint.start()

    def stop(self) -> None:
        for pod in self.pods.values():
            pod.stop()
        self.master_endpoint.stop()

    def __enter__(self) -> Self:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def on_restart(self, hook: RestartHook) -> None:
        """`hook(pod_name)` runs when the pod goes down (its caches are gone from then on)."""
        self._restart_hooks.append(hook)

    # -- restarts ------------------------------------------------------------------------------------
    def restart_pod(self, name: str, downtime_s: float | None = None) -> None:
        """Replace one pod: endpoint down, cold state, hooks, endpoint back after the downtime."""
        self.restart_pods([name], downtime_s)

    def restart_pods(self, names: list[str] | tuple[str, ...], downtime_s: float | None = None) -> None:
        """Replace several pods at once (a non-rolling rollout): all down for one downtime."""
        unknown = [n for n in names if n not in self.pods]
        if unknown:
            raise KeyError(f"no emulated pod {', '.join(unknown)}; pods: {', '.join(self.pods)}")
        with self._lock:
            for name in names:
                self.pods[name].go_down()
                for hook in self._restart_hooks:
                    hook(name)
            self._sleep(self.spec.restart_downtime_s if downtime_s is None else downtime_s)
            for name in names:  # the new process starts after the downtime
                self.pods[name].reset_state()
                self.pods[name].vllm_endpoint.start()

    def restart_master(self, downtime_s: float | None = None) -> None:
        """Curvine master restart (eviction settings are read at start): counters reset, the
        cached data on the workers stays."""
        with self._lock:
            self.master_endpoint.stop()
            self.master = CurvineMasterMetrics(self._clock())
            self.master_restarts += 1
            self._sleep(self.spec.restart_downtime_s if downtime_s is None else downtime_s)
            self.master_endpoint.start()

    # -- discovery -------------------------------------------------------------------------------------
    def targets(self) -> list[dict[str, str]]:
        """Static scrape targets: one entry per endpoint with its role, pod and URL."""
        out = []
        for pod in self.pods.values():
            out.append({"role": "vllm", "pod": pod.name, "url": pod.vllm_endpoint.url})
            out.append({"role": "curvine-fuse", "pod": pod.name, "url": pod.fuse_endpoint.url})
        out.append({"role": "curvine-master", "pod": "curvine-master", "url": self.master_endpoint.url})
        return out
