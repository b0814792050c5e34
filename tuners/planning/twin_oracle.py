"""The twin as the tuner's oracle over the recent workload.

- `RecentTwin`: a `tuners.planning.planner.PlanningTwin` over a frame of recent requests. Everything
  before `measure_from_s` warms the caches; TTFT is read from the requests after it (the
  evaluation window). `steady` replays with one configuration all along; `switch` changes the
  configuration at `measure_from_s` the way a rollout does (`simulator.transition`).
- `WindowTwin.predict(knobs, since, until)`: the twin's TTFT over one live window, warm, with a
  given configuration: the counterfactual a live change is judged against (the last good
  configuration over the very window the candidate was measured in), and the prediction for the
  running configuration whose error against the live measurement is exported.

Both can carry a latency calibration (`simulator.profile.HardwareProfile`, see
`calibrated_profile`) fitted to what the fleet really served.
"""
from __future__ import annotations

from collections.abc import Callable

import numpy as np
import polars as pl

from contracts.knobs import Knobs
from simulator.cluster import ClusterSpec
from simulator.profile import HardwareProfile
from simulator.replay import replay
from simulator.transition import switch_replay
from tuners.payoff import TtftSummary

History = Callable[[float, float], pl.DataFrame]  # (now, seconds back) -> requests arrived in it


def _after(workload: pl.DataFrame, cluster: ClusterSpec, knobs: Knobs, since: float, until: float,
           profile: HardwareProfile | None) -> np.ndarray:
    req = replay(workload, cluster, knobs, profile=profile).requests
    return req.filter((pl.col("time_s") >= since) & (pl.col("time_s") < until))["ttft_s"].to_numpy()


class RecentTwin:
    """Steady and switched replays of `workload`, scored from `measure_from_s` on (cached)."""

    def __init__(self, workload: pl.DataFrame, cluster: ClusterSpec, *, measure_from_s: float,
                 downtime_s: float = 0.0, profile: HardwareProfile | None = None) -> None:
        self.workload = workload
        self.cluster = cluster
        self.measure_from_s = measure_from_s
        self.downtime_s = downtime_s
        self.profile = profile
        end = float(workload["timestamp_ms"].max()) / 1000.0 if workload.height else measure_from_s
        self.transition_s = max(end - measure_from_s, 0.0)
        self._steady: dict[Knobs, np.ndarray] = {}
        self.replays = 0

    def steady(self, knobs: Knobs) -> np.ndarray:
        if knobs not in self._steady:
            self.replays += 1
            self._steady[knobs] = _after(self.workload, self.cluster, knobs, self.measure_from_s, np.inf,
                                         self.profile)
        return self._steady[knobs]

    def switch(self, before: Knobs, after: Knobs, *, restart: bool) -> np.ndarray:
        self.replays += 1
        return switch_replay(self.workload, self.cluster, before, after, switch_at_s=self.measure_from_s,
                             restart_pods=restart, downtime_s=self.downtime_s, profile=self.profile)


class WindowTwin:
    """The twin's TTFT for one live window [since, until), warmed by `warm_s` of history."""

    def __init__(self, history: History, cluster: ClusterSpec, *, warm_s: float = 300.0,
                 profile: HardwareProfile | None = None) -> None:
        self.history = history
        self.cluster = cluster
        self.warm_s = warm_s
        self.profile = profile

    def predict(self, knobs: Knobs, since: float, until: float) -> TtftSummary | None:
        frame = self.history(until, until - since + self.warm_s)
        frame = frame.filter(pl.col("timestamp_ms") < int(until * 1000))
        if frame.height == 0:
            return None
        x = _after(frame, self.cluster, knobs, since, until, self.profile)
        return TtftSummary.of(x) if x.size else None


__all__ = ["History", "RecentTwin", "WindowTwin"]
