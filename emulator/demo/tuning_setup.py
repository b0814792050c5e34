"""How the demo wires the tuner, shared by the live demo (`emulator.demo.loop`) and the
simulated-clock run (`emulator.demo.sim_run`, `bench/live_tuning.py`), so the benchmark measures
exactly the tuner the demo runs.

`build_tuning(...)` returns the controller with its guardrails, live evaluator, drift detector and
the twin warm start over the recent requests (`history(now, seconds)`).
"""
from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Sequence
from concurrent.futures import Executor
from typing import Any

import optuna
import polars as pl

from contracts.actuator import Actuator
from contracts.knobs import DEFAULT_KNOBS, Knobs
from emulator.cluster.local_actuator import POD_RESTART_KNOBS
from emulator.demo.workload import WarmReplay
from simulator.cluster import ClusterSpec as TwinClusterSpec
from tuners.calibration import LatencyFit, LatencyPoint
from tuners.controller import ControllerSettings, TuningController
from tuners.drift import DriftDetector, DriftSettings
from tuners.evaluators import TwinEvaluator
from tuners.guardrails import Guardrails, GuardrailSettings
from tuners.live import LiveEvaluator, LiveSettings, WindowSource
from tuners.metrics import TunerMetrics
from tuners.objective import DEFAULT_MEMORY_MS_PER_GIB, ObjectiveSpec
from tuners.planning.capacity_source import CurveCapacity
from tuners.planning.horizon import HorizonSettings, RegimeHorizon
from tuners.planning.paying import build_paying, every_value_knobs
from tuners.planning.planner import CapacitySource, PlanSettings, TransitionPlanner
from tuners.planning.warmstart import TwinWarmStart, WarmStart
from tuners.space import DeploymentLimits, SearchSpace, memory_cost_gib

CONTROL_START_S = 60.0  # trace seconds before the controller's first step (the agent has a window)
RECENT_WORKLOAD_S = 150.0  # trace seconds the twin warm start scores candidates on
WARM_HISTORY_S = 300.0  # replayed before that, to warm the twin's caches
WARM_START_TRIALS = 24  # twin trials searching restart-requiring knobs (the router is decided on its own)
PLAN_WARM_S = 1200.0  # history replayed before the recent window when pricing a move (capacity needs it)
HOT_MARGIN = 0.03  # a router switch must buy 3%: regimes flip, and a marginal switch costs the next one
HORIZON = HorizonSettings(floor_s=300.0, cap_s=3600.0, replan_growth=1.25)
# the demo and the bench measure restart scenarios (chunk size, CPU buffer, L2 eviction), so restarts
# are allowed: tuner.apply all (a live install's default is hot: restart-requiring moves are proposals)
APPLY = "all"
SETTLE_S = 90.0  # trace seconds after a rollout before measuring: restarted pods start cold
WINDOW_S = 90.0
DRIFT_SIGNALS_WINDOW_S = 60.0
# The drift detector watches workload signals only (never the config-dependent hit ratio). Left
# out: the long-prompt fraction (multi-turn sessions ramp it up turn after turn) and the arrival
# rate (a rolling restart makes the agent's request rate dip and recover).
DRIFT_SIGNALS = ("reuse_ratio", "prompt_tokens_mean")
# Page-Hinkley over 10-second ticks of 60-second windows. The level follows slow trends (a RAG
# corpus getting cached raises the reuse ratio for many minutes); after an alarm the detector waits
# 18 ticks (the new regime settles: sessions ramp up) before learning it; an alarm needs the signal
# to have moved by a quarter of its level. Chosen on bench/live_tuning.py's held runs.
DRIFT = DriftSettings(warmup=20, threshold=15.0, track=0.1, refractory=18, min_rel_shift=0.25)

History = Callable[[float, float], pl.DataFrame]


@dataclasses.dataclass
class Tuning:
    controller: TuningController
    guardrails: Guardrails
    space: SearchSpace
    limits: DeploymentLimits
    latency_fits: list[tuple[float, LatencyFit]]  # (when, fit) of every calibration of the twin
    planner: TransitionPlanner | None = None  # its `history` of priced plans, for the report


def restarts_pods(before: Knobs, after: Knobs) -> bool:
    """Whether going from `before` to `after` is a rolling restart of the vLLM pods."""
    return bool(set(before.diff(after)) & POD_RESTART_KNOBS)


def demo_limits(pods: int) -> DeploymentLimits:
    return DeploymentLimits(pods=pods, node_memory_headroom_gib=32.0, l2_pool_gib=2048.0, l2_backend="curvine")


def restart_space(space: SearchSpace) -> SearchSpace:
    """The twin search's space: the restart-requiring knobs only (the planner decides the router on
    its own, as a hot reload, and gives every search candidate the router it chose)."""
    return dataclasses.replace(space, dimensions=tuple(d for d in space.dimensions if d.name != "router"))


@dataclasses.dataclass(frozen=True)
class HeadroomCapacity:
    """CPU buffer candidates while no capacity curve is wired in: the operator's headroom and half
    of it, when larger than the running buffer (the curve's knee and marginal-price point replace
    these)."""

    limits: DeploymentLimits

    def cpu_candidates(self, current: Knobs) -> list[float]:
        top = self.limits.cpu_gib_max
        return [g for g in dict.fromkeys((top, math.floor(top / 2))) if g > current.cpu_gib]


@dataclasses.dataclass
class FirstOf:
    """The first source with candidates: the capacity curve, then (too little history) the headroom."""

    sources: tuple[CapacitySource, ...]

    def cpu_candidates(self, current: Knobs) -> list[float]:
        for src in self.sources:
            sizes = list(src.cpu_candidates(current))
            if sizes:
                return sizes
        return []


def demo_capacity(history: History, clock: Callable[[], float], cluster: TwinClusterSpec, limits: DeploymentLimits,
                  objective: ObjectiveSpec, metrics: TunerMetrics | None = None) -> CapacitySource:
    """CPU buffer candidates from the capacity curve over the whole history served so far (its
    knee, the size where the next GiB buys less than the memory price, the size where every reuse
    hits), falling back to `HeadroomCapacity` before the curve has enough requests."""
    curve = CurveCapacity(lambda: history(clock(), max(clock(), 1.0)), cluster,
                          headroom_gib=limits.cpu_gib_max, memory_ms_per_gib=objective.memory_ms_per_gib,
                          step_gib=limits.cpu_gib_step, metrics=metrics)
    return FirstOf((curve, HeadroomCapacity(limits)))


@dataclasses.dataclass(frozen=True)
class Deployment:
    """What the operator runs and allows: the limits the search space comes from, the
    configuration the fleet starts on (held, for the reference run), and the memory price of the
    tuner's objective (ms of TTFT p95 per GiB of host memory pinned across the fleet)."""

    limits: DeploymentLimits
    start: Knobs = DEFAULT_KNOBS
    memory_ms_per_gib: float = DEFAULT_MEMORY_MS_PER_GIB

    @property
    def objective(self) -> ObjectiveSpec:
        return ObjectiveSpec(memory_ms_per_gib=self.memory_ms_per_gib)

    def space(self) -> SearchSpace:
        return SearchSpace.from_limits(self.limits)


def demo_deployment(pods: int) -> Deployment:
    return Deployment(demo_limits(pods))


def build_tuning(*, actuator: Actuator, window_source: WindowSource, clock: Callable[[], float],
                 twin_cluster: TwinClusterSpec, history: History, metrics: TunerMetrics, seed: int,
                 dry_run: bool = False, restart_downtime_s: float = 6.0,
                 latency_points: Callable[[float, float], Sequence[LatencyPoint]] | None = None, wrap_evaluator: Callable[[Any], Any] | None = None,
                 wrap_warm_start: Callable[[WarmStart], WarmStart] | None = None,
                 deployment: Deployment | None = None, capacity: CapacitySource | None = None,
                 plan_executor: Executor | None = None) -> Tuning:
    """`plan_executor`: where plans run (a thread in the live demo, so a tick never waits on the
    twin; inline on the simulated clock, where a plan costs no cluster time)."""
    deployment = deployment or demo_deployment(twin_cluster.pods)
    limits = deployment.limits
    space = deployment.space()
    objective = deployment.objective
    guardrails = Guardrails(actuator, space, metrics,
                            GuardrailSettings(cooldown_s=30.0, max_changes_per_hour=60, dry_run=dry_run,
                                              apply=APPLY),
                            clock=clock)
    live = LiveEvaluator(guardrails, window_source,
                         LiveSettings(settle_s=SETTLE_S, window_s=WINDOW_S, min_requests=30, max_extensions=2))

    horizon = RegimeHorizon(HORIZON)
    paying = build_paying(history=history, twin_cluster=lambda: twin_cluster, current=actuator.current,
                          clock=clock, restarts=restarts_pods, routers=limits.routers, search=None,
                          recent_s=RECENT_WORKLOAD_S, warm_s=WARM_HISTORY_S, downtime_s=restart_downtime_s,
                          latency_points=latency_points, settings=PlanSettings(hot_margin=HOT_MARGIN),
                          horizon=lambda: horizon.estimate(clock()), capacity=capacity or demo_capacity(history, clock, twin_cluster, limits, objective, metrics),
                          memory_s=lambda k: objective.memory_cost_s(memory_cost_gib(k, limits)),
                          plan_warm_s=PLAN_WARM_S, every_value=every_value_knobs(space))

    def twin_evaluator() -> Any:
        now = clock()
        ev = TwinEvaluator(history(now, RECENT_WORKLOAD_S + WARM_HISTORY_S), twin_cluster, limits,
                           profile=paying.profile(), replay_fn=WarmReplay(now - RECENT_WORKLOAD_S))
        return wrap_evaluator(ev) if wrap_evaluator else ev

    paying.planner.search = TwinWarmStart(twin_evaluator, restart_space(space), objective, trials=WARM_START_TRIALS,
                                          seed=seed)
    warm: WarmStart = paying.planner
    if wrap_warm_start is not None:
        warm = wrap_warm_start(warm)
    controller = TuningController(
        space=space, objective=objective, storage=optuna.storages.InMemoryStorage(),
        guardrails=guardrails, evaluator=live, metrics=metrics,
        settings=ControllerSettings(study="demo", seed=seed, trials_per_phase=6, warm_start_k=3,
                                    min_improvement=0.02, plan_after_baseline=True, live_search=False,
                                    drift_quiet_s=restart_downtime_s * twin_cluster.pods + 10.0,
                                    config_dependent=("hit_ratio", "reuse_ratio")),
        warm_start=warm, drift=DriftDetector(DRIFT, signals=DRIFT_SIGNALS),
        counterfactual=paying.counterfactual, horizon=horizon, plan_executor=plan_executor)
    return Tuning(controller, guardrails, space, limits, paying.fits, paying.planner)


__all__ = ["CONTROL_START_S", "DRIFT_SIGNALS", "DRIFT_SIGNALS_WINDOW_S", "SETTLE_S", "Deployment", "Tuning",
           "build_tuning", "demo_deployment", "demo_limits"]


