"""A seeded emulated run that measures the agent's accuracy end to end, restarts included.

The demo's world without the tuner: the twin drives the emulated pods in scaled real time, the
real agent scrapes them over HTTP and follows their KV events, and a probe reads the agent's
`/metrics` every `probe_s` wall seconds and compares it with the truth (`accuracy.AccuracyMeter`).
Two rolling restarts happen at fixed cluster times: a plain rollout, then a configuration change
(CPU offload size, which restarts every vLLM pod). The cluster's clock is paced by the probe
(`PacedClock`): it runs at most one scrape interval past the last probe that read a new agent
snapshot, so a busy machine stretches the run instead of letting cluster time pass unobserved; the
run gives up only when the agent took no snapshot for `stall_s`. The tiers are sized so each one hits and the shared pool evicts, so
every signal has a truth to compare with. Used by `bench/accuracy.py` and the tests.
"""
from __future__ import annotations

import dataclasses
import logging
import math
import threading
import time
import urllib.request
from collections.abc import Sequence

from agent.kvevents import EndpointSpec
from contracts.knobs import DEFAULT_KNOBS, Knobs
from contracts.tier_model import Target
from emulator.cluster.catalogue import CURVINE_IO_S_BUCKETS
from emulator.cluster.driver import ScaledRealtimeDriver
from emulator.cluster.fleet import ClusterSpec, EmulatedCluster, pod_names
from emulator.cluster.kv_publisher import TwinEventPublisher, open_pod_publishers
from emulator.cluster.local_actuator import LocalActuator
from emulator.cluster.paced_clock import PacedClock
from emulator.cluster.pod_metrics import PodIdentity
from emulator.cluster.timeline import Disturbance, Recorder
from emulator.cluster.twin_adapter import TwinPortAdapter
from emulator.demo.accuracy import AccuracyMeter, ErrorSample, report_lines
from emulator.demo.agent_export import parse_agent_export
from emulator.demo.agent_stack import DemoAgent
from emulator.demo.workload import build_workload
from simulator.cluster import ClusterSpec as TwinClusterSpec
from simulator.records import iter_requests
from simulator.twin import Twin

log = logging.getLogger("tierpilot.accuracy")
MODEL = "meta-llama/Llama-3.1-8B-Instruct"
# The demo's TTFT buckets (vLLM `custom_histogram_buckets`): 25 ms steps up to 1.5 s, then coarser.
TTFT_BUCKETS = tuple(round(0.025 * i, 3) for i in range(1, 61)) + (1.75, 2.0, 2.5, 3.0, 4.0, 5.0, 7.5, 10.0,
                                                                   20.0, 40.0, 80.0)
L2_BOUNDS_S = CURVINE_IO_S_BUCKETS  # Curvine FUSE read latency buckets, seconds


@dataclasses.dataclass(frozen=True)
class AccuracySettings:
    seed: int = 11
    pods: int = 4
    wall_s: float = 24.0  # length of the run in wall seconds
    time_scale: float = 30.0  # cluster seconds per wall second
    window_s: float = 60.0  # the agent's window, cluster seconds
    scrape_s: float = 0.25  # the agent's scrape interval, wall seconds
    probe_s: float = 0.25  # how often the probe reads the agent's /metrics, wall seconds
    restart_downtime_s: float = 0.2  # wall seconds a restarting pod is unreachable
    restarts_at: tuple[float, ...] = (0.35, 0.65)  # rolling restarts, as shares of the run
    stall_s: float = 60.0  # wall seconds without a new agent snapshot before the run gives up
    rate_rps: float = 4.0
    # Sized so every tier works: CPU offload larger than the GPU cache (CPU hits), and a shared
    # pool small enough to evict (L2 evictions); the configuration change moves the CPU size.
    knobs: Knobs = dataclasses.field(default_factory=lambda: DEFAULT_KNOBS.replace(cpu_gib=40.0))
    changed_cpu_gib: float = 60.0
    l2_tokens: int = 2_000_000

    @property
    def margin_s(self) -> float:
        """Around a disturbance: the window plus two scrapes and the rollout itself."""
        return (2 * self.scrape_s + self.pods * self.restart_downtime_s) * self.time_scale


@dataclasses.dataclass
class AccuracyResult:
    settings: AccuracySettings
    samples: list[ErrorSample]
    disturbances: list[Disturbance]
    served: int
    wall_s: float
    held_back_s: float = 0.0  # wall seconds the cluster's clock waited for the probe, in total

    def lines(self) -> list[str]:
        s = self.settings
        return report_lines(self.samples, self.disturbances, window_s=s.window_s, margin_s=s.margin_s)


class AccuracyRun:
    def __init__(self, s: AccuracySettings) -> None:
        self.s = s
        span = s.wall_s * s.time_scale
        self.workload = build_workload(span, s.seed, rate_rps=s.rate_rps)
        self.names = pod_names(s.pods)
        self.twin_cluster = TwinClusterSpec(pods=s.pods, pod_names=self.names, l2_tokens=s.l2_tokens)
        caps = self.twin_cluster.capacities(s.knobs)
        identity = PodIdentity(model_name=MODEL, kv_bytes_per_token=caps.kv_bytes_per_token,
                               num_gpu_blocks=caps.gpu_tokens // 16, ttft_buckets=TTFT_BUCKETS)
        self.recorder = Recorder(window_trace_s=s.window_s)
        self.span_s = span
        # the cluster's clock waits for the probe: a busy machine slows the run; the cluster time
        # the agent may miss is one scrape interval, as on a quiet machine, rollouts included (a
        # pod's downtime, waited in the rollout thread, lasts as long on the paced clock)
        self.paced = PacedClock(max_lead_s=s.scrape_s)
        self.cluster = EmulatedCluster(ClusterSpec(pods=s.pods, identity=identity,
                                                   restart_downtime_s=s.restart_downtime_s), sleep=self.paced.wait)
        self.cluster.start()
        self.publishers = open_pod_publishers(self.names, model=MODEL)
        self.kv_sink = TwinEventPublisher(self.publishers, clock_offset=0.0, tokens="empty")
        self.twin = Twin(self.twin_cluster, s.knobs, event_sink=self.kv_sink)
        port = TwinPortAdapter(self.twin, list(iter_requests(self.workload.frame)))
        self.driver = ScaledRealtimeDriver(port, self.cluster, self.recorder, time_scale=s.time_scale,
                                           on_step=self.kv_sink.flush_step, clock=self.paced)
        self.cluster.on_restart(self._on_restart)
        self.actuator = LocalActuator(self.cluster, initial=s.knobs, reconfigure=self._reconfigure)
        targets = [Target(url=t["url"], role=t["role"], pod=t["pod"]) for t in self.cluster.targets()]
        kv = [EndpointSpec(pod=n, model=MODEL, endpoint=p.endpoint, replay_endpoint=p.replay_endpoint,
                           topic=f"kv@{n}@") for n, p in self.publishers.items()]
        self.agent = DemoAgent(targets, clock=self.driver.trace_now, port=0, kv_endpoints=kv,
                               kv_bytes_per_token=caps.kv_bytes_per_token, window_s=s.window_s,
                               scrape_interval_s=s.scrape_s)
        self.meter = AccuracyMeter(s.window_s, self.recorder.recorded_between, self.recorder.evictions_at,
                                   ttft_bounds=TTFT_BUCKETS, l2_bounds_s=L2_BOUNDS_S)
        self.error: BaseException | None = None
        self._last_export_wall = -math.inf  # wall stamp of the newest agent snapshot the probe read

    def _on_restart(self, pod: str) -> None:
        with self.driver.lock:
            self.publishers[pod].restart()
            self.kv_sink.flush_step()
        self.recorder.add_disturbance(Disturbance(self.driver.trace_now(), "restart", pod))

    def _reconfigure(self, knobs: Knobs) -> None:
        self.recorder.add_disturbance(Disturbance(self.driver.trace_now(), "config", ""))
        self.driver.reconfigure(knobs)

    def _rollouts(self, at_trace: Sequence[float], stop: threading.Event) -> None:
        try:
            for i, at in enumerate(at_trace):
                while self.driver.trace_now() < at:  # cluster time: the paced clock may run slow
                    if stop.wait(0.02):
                        return
                if i % 2 == 0:  # a plain rollout (e.g. an image update): every pod, one at a time
                    for name in self.names:
                        self.cluster.restart_pod(name)
                else:  # a configuration change that restarts the engines
                    self.actuator.apply(self.actuator.current().replace(cpu_gib=self.s.changed_cpu_gib))
        except BaseException as exc:  # noqa: BLE001 - reported by run()
            self.error = exc

    def probe(self) -> bool:
        """Read the agent's export and compare it with the truth; True when it was a new snapshot."""
        with urllib.request.urlopen(self.agent.url, timeout=2.0) as resp:
            text = resp.read().decode("utf-8", "replace")
        export = parse_agent_export(text)  # stamped in wall time; the truth is in cluster time
        at = self.agent.cluster_time_of(export.taken_at)
        self.meter.observe(dataclasses.replace(export, taken_at=math.nan if at is None else at))
        if at is None or export.taken_at <= self._last_export_wall:
            return False  # (a snapshot is new by its wall stamp: a waiting cluster clock stands still)
        self._last_export_wall = export.taken_at
        return True

    def run(self) -> AccuracyResult:
        s = self.s
        stop = threading.Event()
        started = time.monotonic()
        try:
            self.agent.start()
            self.driver.start()
            last_new = time.monotonic()
            roll = threading.Thread(target=self._rollouts, args=([r * self.span_s for r in s.restarts_at], stop),
                                    name="accuracy-rollouts", daemon=True)
            roll.start()
            while self.driver.trace_now() < self.span_s and not self.driver.finished:
                if self.driver.error is not None:
                    raise RuntimeError(f"the twin driver failed: {self.driver.error}") from self.driver.error
                try:
                    if self.probe():
                        self.paced.tick()  # cluster time up to here was observed
                        last_new = time.monotonic()
                except OSError:
                    pass  # the agent is busy: the next probe will do (the cluster waits for it)
                if time.monotonic() - last_new > s.stall_s:
                    raise RuntimeError(f"the agent took no new snapshot in {s.stall_s:g} s")
                time.sleep(s.probe_s)
            stop.set()
            roll.join(timeout=30)
            if self.error is not None:
                raise RuntimeError(f"rollout failed: {self.error}") from self.error
        finally:
            stop.set()
            self.close()
        return AccuracyResult(s, list(self.meter.samples), list(self.recorder.disturbances), self.driver.served,
                              time.monotonic() - started, self.paced.held_back_s)

    def close(self) -> None:
        self.driver.stop()
        for fn in (self.agent.stop, self.cluster.stop):
            try:
                fn()
            except Exception:  # best effort on the way out
                log.warning("while stopping the accuracy run", exc_info=True)
        for pub in self.publishers.values():
            pub.close()


def run_accuracy(settings: AccuracySettings | None = None) -> AccuracyResult:
    return AccuracyRun(settings or AccuracySettings()).run()
