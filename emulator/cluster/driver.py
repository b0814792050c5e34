"""The scaled-real-time driver: feeds the workload to the twin at `time_scale` trace-seconds per
wall-second from a background thread, and pushes every served request into the emulated pods'
metric state (and the demo recorder), so the endpoints show the twin's live state.

The twin is reached through `TwinPort` (see `twin_adapter.py`), so the driver's clock, pacing and
locking are testable without it. All calls into the twin happen under `lock`; the actuator's
reconfigure and the cluster's restart hooks take the same lock.
"""
from __future__ import annotations

import dataclasses
import logging
import threading
import time
from collections.abc import Callable, Sequence
from typing import Protocol

from contracts.knobs import Knobs
from emulator.cluster.fleet import EmulatedCluster
from emulator.cluster.pod_metrics import L2Status, RequestOutcome
from emulator.cluster.timeline import Recorder, Served

log = logging.getLogger("tierpilot.emulated.driver")


@dataclasses.dataclass(frozen=True)
class PodLoad:
    running: int
    waiting: int
    gpu_usage: float
    cpu_bytes: float
    cpu_evicted_chunks: int  # since the last call


@dataclasses.dataclass(frozen=True)
class L2Load:
    status: L2Status
    evicted_files: int  # since the last call
    evicted_bytes: float
    read_latencies_us: tuple[float, ...] = ()


@dataclasses.dataclass(frozen=True)
class ServedRequest:
    """What the port returns for one request: the pod that served it and its outcome."""

    pod: str
    trace_ts: float
    outcome: RequestOutcome
    l2_chunk_latencies_us: tuple[float, ...] = ()
    l2_written_bytes: int = 0
    miss_tokens: tuple[int, int, int, int] = (0, 0, 0, 0)  # truth: cold, capacity, routing, tail


class TwinPort(Protocol):
    def arrival_times(self) -> Sequence[float]:
        """Trace-second arrival time of each workload request, in order."""
        ...

    def submit(self, index: int) -> ServedRequest:
        """Serve request number `index` on the twin."""
        ...

    def pod_load(self, pod: str) -> PodLoad: ...

    def l2_load(self) -> L2Load: ...

    def restart_pod(self, pod: str, at: float) -> None: ...

    def reconfigure(self, knobs: Knobs) -> None: ...


class ScaledRealtimeDriver:
    """Runs the workload against the twin in scaled real time, in its own thread."""

    def __init__(self, port: TwinPort, cluster: EmulatedCluster, recorder: Recorder, *,
                 time_scale: float = 60.0, phase_of: Callable[[float], int] = lambda _t: 0,
                 clock: Callable[[], float] = time.monotonic, tick_s: float = 0.05,
                 max_batch: int = 2000, on_step: Callable[[], None] | None = None) -> None:
        if time_scale <= 0:
            raise ValueError(f"time_scale must be > 0, got {time_scale}")
        self.port = port
        self.cluster = cluster
        self.recorder = recorder
        self.time_scale = time_scale
        self.phase_of = phase_of
        self._clock = clock
        self._tick_s = tick_s
        self._max_batch = max_batch
        self.lock = threading.RLock()
        self._arrivals = list(port.arrival_times())
        self._next = 0
        self._t0: float | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.error: BaseException | None = None
        self.served = 0
        self._on_step = on_step  # e.g. flush the KV-event publishers once per step
        cluster.on_restart(self._on_restart)

    # -- time ----------------------------------------------------------------------------------------
    def trace_now(self) -> float:
        """Current trace time (seconds since the workload start)."""
        if self._t0 is None:
            return 0.0
        return (self._clock() - self._t0) * self.time_scale

    @property
    def finished(self) -> bool:
        return self._next >= len(self._arrivals)

    @property
    def total_requests(self) -> int:
        return len(self._arrivals)

    # -- hooks -----------------------------------------------------------------------------------------
    def _on_restart(self, pod: str) -> None:
        with self.lock:
            self.port.restart_pod(pod, self.trace_now())

    def reconfigure(self, knobs: Knobs) -> None:
        with self.lock:
            self.port.reconfigure(knobs)

    # -- the loop --------------------------------------------------------------------------------------
    def step(self) -> int:
        """Serve every request due by now; refresh gauges. Returns how many were served."""
        now = self.trace_now()
        n = 0
        with self.lock:
            while self._next < len(self._arrivals) and self._arrivals[self._next] <= now and n < self._max_batch:
                self._serve(self._next, now)
                self._next += 1
                n += 1
            self._refresh_gauges(now)
            if self._on_step is not None:
                self._on_step()
        self.served += n
        return n

    def _serve(self, index: int, now: float) -> None:
        r = self.port.submit(index)
        pod = self.cluster.pods.get(r.pod)
        if pod is None:
            raise KeyError(f"twin served request {index} on unknown pod {r.pod!r}")
        pod.record(r.outcome)
        if r.l2_chunk_latencies_us:
            pod.record_io("read", r.outcome.l2_hit_tokens * pod.identity.kv_bytes_per_token,
                               r.l2_chunk_latencies_us)
        if r.l2_written_bytes:
            chunks = max(1, -(-r.outcome.stored_tokens // max(r.outcome.chunk_tokens, 1)))
            per_chunk = r.l2_written_bytes / chunks
            pod.record_io("write", r.l2_written_bytes, [per_chunk / 2e9 * 1e6 + 200.0] * chunks)
        o = r.outcome
        lat = r.l2_chunk_latencies_us
        cold, capacity, routing, tail = r.miss_tokens
        self.recorder.add_served(Served(r.trace_ts, r.pod, o.prompt_tokens, o.gpu_hit_tokens, o.cpu_hit_tokens,
                                        o.l2_hit_tokens, o.ttft_s, self.phase_of(r.trace_ts), len(lat),
                                        (sum(lat) / len(lat) / 1e6) if lat else 0.0, cold, capacity, routing, tail,
                                        now))

    def _refresh_gauges(self, now: float) -> None:
        l2 = self.port.l2_load()
        for name, pod in self.cluster.pods.items():
            load = self.port.pod_load(name)
            pod.metrics.set_load(running=load.running, waiting=load.waiting, gpu_usage=load.gpu_usage,
                                 cpu_bytes=load.cpu_bytes, l2_bytes=l2.status.used_bytes)
            pod.record_cpu_evictions(load.cpu_evicted_chunks)
            self.recorder.add_evictions("cpu", name, load.cpu_evicted_chunks, now)
            pod.fuse.set_files(l2.status.tracked_files)
        self.cluster.master.set_usage(l2.status)
        self.cluster.master.record_eviction(l2.evicted_files, l2.evicted_bytes)
        self.recorder.add_evictions("l2", "curvine-master", l2.evicted_files, now)

    def _run(self) -> None:
        try:
            while not self._stop.is_set() and not self.finished:
                self.step()
                self._stop.wait(self._tick_s)
        except BaseException as exc:
            log.exception("driver stopped on an error")
            self.error = exc

    def start(self) -> None:
        self._t0 = self._clock()
        self._thread = threading.Thread(target=self._run, name="twin-driver", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=10)
