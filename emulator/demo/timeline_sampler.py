"""The demo's timeline sampler, on its own thread (so a blocking controller step, a rollout or the
twin warm start, leaves no hole in the charts): every `VIEW_TICK_S` the truth over the recorder's
window beside what the agent exports (its view, and its per-pod mean against the same truth over
the agent's window, fed to the accuracy meter); every `CURVE_TICK_S` the capacity curves
republished. One `TimelinePoint` per sample."""
from __future__ import annotations

import dataclasses
import logging
import math
import threading
from collections.abc import Callable

from emulator.cluster.timeline import Recorder, TimelinePoint
from emulator.demo.accuracy import AccuracyMeter, pod_mean_truth
from emulator.demo.agent_export import parse_agent_export
from emulator.demo.agent_stack import DemoAgent
from emulator.demo.probe import fetch_agent_text, parse_agent_view
from emulator.demo.workload import DemoWorkload

log = logging.getLogger("tierpilot.demo")

VIEW_TICK_S = 0.25
CURVE_TICK_S = 15.0  # wall seconds between rebuilds of the capacity curves (a replay of the history)


class TimelineSampler:
    """Samples into `recorder` from `start()` until `stop()`; `wall() - t0` stamps each point."""

    def __init__(self, *, recorder: Recorder, workload: DemoWorkload, agent: DemoAgent, accuracy: AccuracyMeter,
                 window_s: float, trace_now: Callable[[], float], wall: Callable[[], float], t0: float,
                 publish_curves: Callable[[float], object]) -> None:
        self.recorder = recorder
        self.workload = workload
        self.agent = agent
        self.accuracy = accuracy
        self.window_s = window_s  # the agent's window
        self.trace_now = trace_now
        self.wall = wall
        self.t0 = t0
        self.publish_curves = publish_curves
        self._stop = threading.Event()
        self._curves_at = -math.inf  # wall time of the last capacity-curve rebuild
        self._thread = threading.Thread(target=self._run, name="demo-sampler", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self, timeout_s: float = 5) -> None:
        self._stop.set()
        self._thread.join(timeout=timeout_s)

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self.sample()
            except Exception:
                log.exception("timeline sample failed")
            self._stop.wait(VIEW_TICK_S)

    def sample(self) -> None:
        now = self.trace_now()
        stats = self.recorder.window(now)
        text = fetch_agent_text(self.agent.url, timeout_s=1.0)
        view = parse_agent_view(text) if text is not None else None
        like: dict[str, float] = {}
        if text is not None:
            export = parse_agent_export(text)
            # the export is stamped in wall time; the truth it is compared with is in cluster time
            at = self.agent.cluster_time_of(export.taken_at)
            export = dataclasses.replace(export, taken_at=math.nan if at is None else at)
            self.accuracy.observe(export)
            if export.taken_at == export.taken_at:  # the agent's per-pod mean, over the agent's window
                like = pod_mean_truth(self.recorder.recorded_between(export.taken_at - self.window_s,
                                                                   export.taken_at))
        if self.wall() - self._curves_at >= CURVE_TICK_S:
            self._curves_at = self.wall()
            self.publish_curves(now)
        phase = sum(1 for p in self.workload.phase_starts_s[1:] if now >= p)
        self.recorder.add_point(TimelinePoint(self.wall() - self.t0, now, phase, stats,
                                              view.ttft_p95_s if view else None,
                                              view.cumulative_hit_ratio if view else None,
                                              dict(view.tier_hit_ratios) if view else {}, like))
