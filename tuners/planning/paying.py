"""The paying tuner's twin side, assembled by the one tuning stack (agent/runtime/tuning/build.py)
for the production runtime, the demo and the benchmarks: the transition planner over the twin of the recent workload,
the counterfactual twin the controller judges live windows against, and the latency calibration.

`build_paying(...)` takes a `history(now, seconds)` of recent requests (the planning workload:
rebuilt from the KV events, or without them fitted to the observed signals, agent/runtime/workload_fit.py),
the twin cluster (a callable, so production can refit the GPU size and load term per plan), the
running configuration, which changes restart pods, the router choices, an optional twin search for
restart-requiring candidates, and optional live latency points to calibrate the prefill speed from.
"""
from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import polars as pl

from contracts.knobs import ROUTER_KNOBS, Knobs, restarting_knobs
from simulator.cluster import ClusterSpec
from simulator.profile import HardwareProfile
from tuners.calibration import LatencyFit, LatencyPoint, calibrated_profile, fit_prefill_latency
from tuners.logline import log_event
from tuners.planning.planner import CapacitySource, PlanSettings, TransitionPlanner
from tuners.planning.twin_oracle import RecentTwin, WindowTwin
from tuners.planning.warmstart import WarmStart

History = Callable[[float, float], pl.DataFrame]
LatencyPoints = Callable[[float, float], Sequence[LatencyPoint]]


def restarts_serving_pods(before: Knobs, after: Knobs) -> bool:
    """Conservative rule for a fleet whose rollout details the planner does not model: any change
    beyond the router's knobs is priced as a rolling restart of the serving pods (cold GPU and CPU
    caches, a pod's capacity lost at a time). A Curvine-master-only change is priced the same way:
    it over-states that cost, so such a change is only made when it pays even then."""
    return bool(restarting_knobs(before, after))


# knobs the planner prices at every value on every plan: a handful of values, and the twin search's
# short window cannot rank L2 eviction policies (they differ once scans have churned the pool)
EVERY_VALUE_KNOBS = ("l2_eviction",)


def every_value_knobs(space: Any) -> dict[str, tuple[object, ...]]:
    """{knob: the values the search space offers} for `EVERY_VALUE_KNOBS` the space searches."""
    return {name: values for name in EVERY_VALUE_KNOBS if len(values := space.choices(name)) > 1}


@dataclasses.dataclass
class Paying:
    planner: TransitionPlanner
    counterfactual: WindowTwin
    fits: list[tuple[float, LatencyFit]]  # (when, fit) of every calibration of the twin
    state: dict[str, Any]

    def plan_line(self, _current: Knobs, knobs: Knobs) -> dict[str, Any] | None:
        """The latest plan's priced line for a move to `knobs` (tuners/proposals.py)."""
        return self.planner.priced(knobs)

    def profile(self) -> HardwareProfile | None:
        """The latest calibrated profile (None before the first fit): for the twin search too."""
        return self.state["profile"]


def build_paying(*, history: History, twin_cluster: Callable[[], ClusterSpec], current: Callable[[], Knobs],
                 clock: Callable[[], float], restarts: Callable[[Knobs, Knobs], bool], routers: Sequence[str],
                 search: WarmStart | None, recent_s: float, warm_s: float, downtime_s: float,
                 settings: PlanSettings, latency_points: LatencyPoints | None = None,
                 horizon: Callable[[], Any] | None = None, capacity: CapacitySource | None = None,
                 memory_s: Callable[[Knobs], float] | None = None, plan_warm_s: float | None = None,
                 every_value: Mapping[str, Sequence[object]] | None = None,
                 workload: Callable[[], str] | None = None, refill_s: float = 0.0) -> Paying:
    """The planner (calibrating the twin before each plan when `latency_points` is given) and the
    counterfactual twin (carrying the latest calibration). `plan_warm_s` (default `warm_s`) of history before the last
    `recent_s` warms the planning twin's caches, so a capacity change is priced at the occupancy
    the fleet's history gives it (a buffer larger than the GPU pool pays only once the working set
    has outgrown the GPU). `horizon`: the regime horizon from the run (tuners.planning.horizon); `capacity`:
    CPU buffer candidates (the capacity curve); `memory_s`: the objective's memory price;
    `every_value`: knobs whose every value is priced at every plan (`TransitionPlanner`);
    `workload()`: what the history is (rebuilt, fitted), stamped on every plan; `refill_s`: how long
    the planning twin follows a restart's refill (`RecentTwin.refill`, charged by the planner)."""
    counterfactual = WindowTwin(history, twin_cluster(), warm_s=warm_s)
    state: dict[str, Any] = {"profile": None}
    fits: list[tuple[float, LatencyFit]] = []

    def calibrate(now: float, cluster: ClusterSpec) -> None:
        """Refit the twin's prefill speed to the fleet's recent windows (kept as it was without a fit)."""
        if latency_points is None:
            return
        fit = fit_prefill_latency(latency_points(now - recent_s - warm_s, now))
        if fit is not None:
            state["profile"] = counterfactual.profile = calibrated_profile(cluster.hardware, fit)
            fits.append((now, fit))
            log_event("twin_calibrated", overhead_s=fit.overhead_s, prefill_s_per_token=fit.prefill_s_per_token,
                      windows=fit.windows, r2=fit.r2)

    def planning_twin() -> RecentTwin:
        now = clock()
        cluster = counterfactual.cluster = twin_cluster()
        calibrate(now, cluster)
        return RecentTwin(history(now, recent_s + (plan_warm_s or warm_s)), cluster, measure_from_s=now - recent_s,
                          downtime_s=downtime_s, profile=state["profile"], refill_s=refill_s)

    planner = TransitionPlanner(planning_twin, current, restarts=restarts, routers=routers, search=search,
                                settings=settings, horizon=horizon, capacity=capacity,
                                memory_s=memory_s, every_value=every_value, clock=clock, workload=workload)
    return Paying(planner, counterfactual, fits, state)


__all__ = ["EVERY_VALUE_KNOBS", "ROUTER_KNOBS", "History", "Paying", "build_paying", "every_value_knobs",
           "restarts_serving_pods"]
