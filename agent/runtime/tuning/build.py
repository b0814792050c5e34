"""The one tuning stack: what `tierpilot run`, `tierpilot demo` (both engines) and the
simulated-clock harness (`emulator.demo.sim_run`, `bench/live_tuning.py`) all run.

`build_tuning(settings, io)` assembles, from `AgentSettings` (the `tuner:` sections) and the
injected I/O (`TuningIO`: actuator, search space, window source, planning workload, twin cluster,
clocks, metrics, study storage, restart rule, calibration points, plan executor):

- the guardrails over the actuator, the live evaluator over the window source;
- the drift detector (`tuner.drift`), the regime horizon (`tuner.planner.horizon_from_run`);
- the twin search (`tuner.warm_start`) over the planning workload;
- with `tuner.planner.enabled`, the transition planner with its twin, its calibration, the
  counterfactual twin and CPU buffer candidates from the capacity curve over the planning workload
  (the operator's headroom before the curve has enough requests);
- `new_controller()`: a `TuningController` over all of it (one per leader term).

Nothing here reads the served request stream: the workload is whatever `io.workload` rebuilds or
fits from what the agent collects (agent/runtime/tuning/workload.py).
"""
from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from concurrent.futures import Executor
from typing import Any

import polars as pl

from agent.runtime.tuning.schema import (
    controller_settings,
    drift_settings,
    guardrail_settings,
    horizon_settings,
    live_settings,
    objective_spec,
    plan_settings,
)
from agent.runtime.tuning.workload import WorkloadSource
from agent.settings import AgentSettings
from contracts.actuator import Actuator
from contracts.knobs import Knobs
from simulator.cluster import ClusterSpec
from tuners.controller import TuningController
from tuners.drift import DriftDetector
from tuners.evaluators import TwinEvaluator, WarmReplay
from tuners.guardrails import Guardrails
from tuners.live import LiveEvaluator, WindowSource
from tuners.metrics import TunerMetrics
from tuners.objective import ObjectiveSpec
from tuners.planning.capacity_source import CurveCapacity, FirstOf, HeadroomCapacity
from tuners.planning.horizon import RegimeHorizon
from tuners.planning.paying import Paying, build_paying, every_value_knobs
from tuners.planning.planner import TransitionPlanner
from tuners.planning.warmstart import TwinWarmStart, WarmStart
from tuners.proposals import ProposalBook
from tuners.space import SearchSpace, memory_cost_gib

LatencyPoints = Callable[[float, float], Sequence[tuple[float, float, float]]]


@dataclasses.dataclass
class TuningIO:
    """What the deployment provides. `restarts(before, after)`: whether a change restarts the
    serving pods (the actuator's rollout rule). `latency_points(since, until)`: the calibration
    points the agent measured. `trace`: a frame the twin search replays instead of the workload
    (`tuner.warm_start.workload: trace`). `dry_run`: the actuator's (None: the global setting).
    `apply` / `proposals`: the apply scope in force (None: `tuner.apply`) and where changes outside
    it are recorded (tuners/proposals.py).
    `wrap_evaluator` / `wrap_warm_start`: observers the demo records through."""

    actuator: Actuator
    space: SearchSpace
    window_source: WindowSource
    workload: WorkloadSource
    twin_cluster: Callable[[], ClusterSpec]
    clock: Callable[[], float]
    metrics: TunerMetrics
    storage: Any  # optuna.storages.BaseStorage
    restarts: Callable[[Knobs, Knobs], bool]
    latency_points: LatencyPoints | None = None
    plan_executor: Executor | None = None
    monotonic: Callable[[], float] | None = None
    owner: str = ""
    dry_run: bool | None = None
    apply: str | None = None
    proposals: ProposalBook | None = None
    trace: pl.DataFrame | None = None
    wrap_evaluator: Callable[[Any], Any] | None = None
    wrap_warm_start: Callable[[WarmStart], WarmStart] | None = None


@dataclasses.dataclass
class Tuning:
    """The assembled stack. `paying`: the planner, counterfactual twin and calibrations (None with
    `tuner.planner.enabled: false`); `warm`: what the controller asks for candidates."""

    settings: AgentSettings
    io: TuningIO
    objective: ObjectiveSpec
    guardrails: Guardrails
    drift: DriftDetector | None
    horizon: RegimeHorizon | None
    paying: Paying | None
    warm: WarmStart | None

    @property
    def space(self) -> SearchSpace:
        return self.io.space

    @property
    def planner(self) -> TransitionPlanner | None:
        return self.paying.planner if self.paying is not None else None

    @property
    def latency_fits(self) -> list[Any]:
        return self.paying.fits if self.paying is not None else []

    def new_controller(self) -> TuningController:
        io = self.io
        return TuningController(
            space=io.space, objective=self.objective, storage=io.storage, guardrails=self.guardrails,
            evaluator=LiveEvaluator(self.guardrails, io.window_source, live_settings(self.settings)),
            metrics=io.metrics, warm_start=self.warm, drift=self.drift,
            counterfactual=self.paying.counterfactual if self.paying is not None else None,
            horizon=self.horizon, plan_executor=io.plan_executor,
            settings=controller_settings(self.settings, owner=io.owner))


def restart_space(space: SearchSpace) -> SearchSpace:
    """The planner's twin search: the restart-requiring knobs only (the planner decides the router
    on its own, as a hot reload, and gives every search candidate the router it chose)."""
    return dataclasses.replace(space, dimensions=tuple(d for d in space.dimensions if d.name != "router"))


def _twin_search(settings: AgentSettings, io: TuningIO, objective: ObjectiveSpec,
                 profile: Callable[[], Any]) -> TwinWarmStart:
    """The twin search: with the planner, the restart-requiring knobs on the recent workload replayed
    after `warm_s` of history (warm caches); without it, every knob on `warm_start.duration_s`."""
    t = settings.tuner
    ws, p = t.warm_start, t.planner

    def evaluator() -> Any:
        now = io.clock()
        if io.trace is not None:
            ev = TwinEvaluator(io.trace, io.twin_cluster(), io.space.limits)
        elif p.enabled:
            ev = TwinEvaluator(io.workload.history(now, p.recent_s + p.warm_s), io.twin_cluster(), io.space.limits,
                               profile=profile(), replay_fn=WarmReplay(now - p.recent_s))
        else:
            ev = TwinEvaluator(io.workload.history(now, ws.duration_s), io.twin_cluster(), io.space.limits)
        return io.wrap_evaluator(ev) if io.wrap_evaluator is not None else ev

    space = restart_space(io.space) if p.enabled else io.space
    return TwinWarmStart(evaluator, space, objective, trials=ws.trials, sampler=t.sampler, seed=ws.seed)


@dataclasses.dataclass
class WorkloadCapacity:
    """CPU buffer candidates (and the L2 pool's sizes, reported) from the capacity curves over all
    the planning workload retained; the
    fitted fallback has no reuse beyond the GPU to draw a curve from (its curve says 0 GiB), so
    while the planner runs on it the operator's headroom and half of it are priced instead."""

    workload: WorkloadSource
    curve: CurveCapacity
    headroom: HeadroomCapacity

    def cpu_candidates(self, current: Knobs) -> list[float]:
        if self.workload.kind == "fitted":
            return self.headroom.cpu_candidates(current)
        return FirstOf((self.curve, self.headroom)).cpu_candidates(current)

    def l2_pool(self, current: Knobs) -> dict[str, Any] | None:
        """The L2 curve's sizes over the planning workload (none on the fitted fallback, which has
        no reuse to draw a curve from)."""
        return None if self.workload.kind == "fitted" else self.curve.l2_pool(current)


def _capacity(io: TuningIO, objective: ObjectiveSpec) -> WorkloadCapacity:
    limits = io.space.limits

    def everything() -> pl.DataFrame:
        now = io.clock()
        return io.workload.history(now, max(now, 1.0))

    curve = CurveCapacity(everything, io.twin_cluster(), headroom_gib=limits.cpu_gib_max,
                          memory_ms_per_gib=objective.memory_ms_per_gib, step_gib=limits.cpu_gib_step,
                          metrics=io.metrics)
    return WorkloadCapacity(io.workload, curve, HeadroomCapacity(limits))


def build_tuning(settings: AgentSettings, io: TuningIO) -> Tuning:
    """The tuning stack for `settings` over `io` (see the module docstring)."""
    t = settings.tuner
    p = t.planner
    objective = objective_spec(settings)
    guardrails = Guardrails(io.actuator, io.space, io.metrics,
                            guardrail_settings(settings, dry_run=io.dry_run, apply=io.apply),
                            clock=io.clock, monotonic=io.monotonic, proposals=io.proposals)
    drift = DriftDetector(drift_settings(settings), signals=tuple(t.drift.signals)) if t.drift.enabled else None
    horizon = RegimeHorizon(horizon_settings(settings)) if p.enabled and p.horizon_from_run else None
    state: dict[str, Paying | None] = {"paying": None}

    def profile() -> Any:
        paying = state["paying"]
        return paying.profile() if paying is not None else None

    search = (_twin_search(settings, io, objective, profile) if t.warm_start.trials and t.warm_start.top_k
              else None)
    warm: WarmStart | None = search
    paying = None
    if p.enabled:
        limits = io.space.limits
        paying = state["paying"] = build_paying(
            history=io.workload.history, twin_cluster=io.twin_cluster, current=io.actuator.current, clock=io.clock,
            restarts=io.restarts, routers=io.space.choices("router"), search=search, recent_s=p.recent_s,
            warm_s=p.warm_s, downtime_s=p.restart_downtime_s, settings=plan_settings(settings),
            latency_points=io.latency_points if p.calibrate else None,
            horizon=(lambda: horizon.estimate(io.clock())) if horizon is not None else None,
            capacity=_capacity(io, objective),
            memory_s=lambda k: objective.memory_cost_s(memory_cost_gib(k, limits)),
            plan_warm_s=p.plan_warm_s, every_value=every_value_knobs(io.space), workload=lambda: io.workload.kind,
            refill_s=p.refill_s)
        warm = paying.planner
    if warm is not None and io.wrap_warm_start is not None:
        warm = io.wrap_warm_start(warm)
    return Tuning(settings, io, objective, guardrails, drift, horizon, paying, warm)


__all__ = ["LatencyPoints", "Tuning", "TuningIO", "WorkloadCapacity", "build_tuning", "restart_space"]
