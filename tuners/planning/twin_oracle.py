"""The twin as the tuner's oracle over the recent workload.

- `RecentTwin`: a `tuners.planning.planner.PlanningTwin` over a frame of recent requests. Everything
  before `measure_from_s` warms the caches; TTFT is read from the requests after it (the
  evaluation window). `steady` replays with one configuration all along; `switch` changes the
  configuration at `measure_from_s` the way a rollout does (`simulator.transition`). `refill`
  follows a restart's refill for longer than the evaluation window: it switches `refill_s` before
  the end of the history (at most half of it, the first half warming the caches) and returns, for
  each request after the switch, the TTFT the switch added over the candidate held all along (a
  chunk-size change leaves the L2 unreadable and a restart empties the CPU tier; they refill only as
  fast as the workload revisits its working set, often well past the evaluation window).
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


def _served(workload: pl.DataFrame, cluster: ClusterSpec, knobs: Knobs,
            profile: HardwareProfile | None) -> tuple[np.ndarray, np.ndarray]:
    """(arrival time (s), TTFT (s)) of every request of a replay, in the workload's order."""
    req = replay(workload, cluster, knobs, profile=profile).requests
    return req["time_s"].to_numpy(), req["ttft_s"].to_numpy()


def _after(workload: pl.DataFrame, cluster: ClusterSpec, knobs: Knobs, since: float, until: float,
           profile: HardwareProfile | None) -> np.ndarray:
    t, ttft = _served(workload, cluster, knobs, profile)
    return ttft[(t >= since) & (t < until)]


class RecentTwin:
    """Steady and switched replays of `workload`, scored from `measure_from_s` on (cached)."""

    def __init__(self, workload: pl.DataFrame, cluster: ClusterSpec, *, measure_from_s: float,
                 downtime_s: float = 0.0, profile: HardwareProfile | None = None, refill_s: float = 0.0) -> None:
        if workload.height and int(workload["timestamp_ms"].min()) < 0:
            # a replay's pods are free from time 0: a history reaching before it is moved to start there
            shift_ms = -int(workload["timestamp_ms"].min())
            workload = workload.with_columns(pl.col("timestamp_ms") + shift_ms)
            measure_from_s += shift_ms / 1000.0
        self.workload = workload
        self.cluster = cluster
        self.measure_from_s = measure_from_s
        self.downtime_s = downtime_s
        self.profile = profile
        start, end = ((float(workload["timestamp_ms"].min()) / 1000.0, float(workload["timestamp_ms"].max()) / 1000.0)
                      if workload.height else (measure_from_s, measure_from_s))
        self.transition_s = max(end - measure_from_s, 0.0)
        # the refill is followed from here (None: no longer than the evaluation window)
        refill_from = max(end - refill_s, (start + end) / 2.0)
        self.refill_from_s: float | None = refill_from if refill_from < measure_from_s else None
        self._served: dict[Knobs, tuple[np.ndarray, np.ndarray]] = {}
        self.replays = 0

    def _steady_all(self, knobs: Knobs) -> tuple[np.ndarray, np.ndarray]:
        if knobs not in self._served:
            self.replays += 1
            self._served[knobs] = _served(self.workload, self.cluster, knobs, self.profile)
        return self._served[knobs]

    def steady(self, knobs: Knobs) -> np.ndarray:
        t, ttft = self._steady_all(knobs)
        return ttft[t >= self.measure_from_s]

    def refill(self, before: Knobs, after: Knobs, *, restart: bool) -> tuple[np.ndarray, np.ndarray] | None:
        """(seconds since the switch, TTFT the switch added over `after` held all along) of every
        request from `refill_from_s` on, or None when the history is too short to follow the refill
        past the evaluation window."""
        if self.refill_from_s is None:
            return None
        t, held = self._steady_all(after)
        self.replays += 1
        switched = switch_replay(self.workload, self.cluster, before, after, switch_at_s=self.refill_from_s,
                                 restart_pods=restart, downtime_s=self.downtime_s, profile=self.profile)
        mask = t >= self.refill_from_s
        if switched.size != int(mask.sum()):
            return None
        return t[mask] - self.refill_from_s, switched - held[mask]

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
