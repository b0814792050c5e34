"""The tuner of the real-engine demo: the emulated demo's controller (guardrails, live windows,
the paying planner on the twin, the counterfactual), on the wall clock of real processes and
bounded by what the real CPU engines can express.

Differences from `emulator.demo.tuning_setup`, all forced by the deployment:
- the search space is the router only (`roundrobin` / `prefixaware`, which the process actuator
  runs as vllm-router's `round_robin` / `cache_aware`): the CPU backend has no LMCache, offload or
  L2, so every other knob keeps the deployment's value (no CPU tier: cpu_gib 0);
- windows are seconds, not minutes (the whole demo must fit in a few minutes): the baseline
  window, then the planner's decision on the twin of the requests sent so far, then one live trial
  judged against the baseline by the guardrails' regression test; the planner looks again as the
  regime ages (every time its age has grown 1.5-fold: a fresh baseline window, then a plan), so a
  move that starts to pay after the workload shifts is found without a drift detector. Plans are
  priced on a thread of their own, beside the control loop;
- no drift detector (the run is too short for its warm-up; the scorecard still splits by phase);
- the twin is the CPU profile calibrated on this engine (`cpu-tiny-llama`, bench/real_engine.py),
  one pod per engine with the engine's own KV capacity.
"""
from __future__ import annotations

import dataclasses
from collections.abc import Callable
from concurrent.futures import Executor

import optuna
import polars as pl

from contracts.actuator import Actuator
from contracts.knobs import DEFAULT_KNOBS, Knobs
from emulator.demo.workload import WarmReplay
from simulator.cluster import ClusterSpec as TwinClusterSpec
from tuners.controller import ControllerSettings, TuningController
from tuners.evaluators import TwinEvaluator
from tuners.guardrails import Guardrails, GuardrailSettings
from tuners.live import LiveEvaluator, LiveSettings, WindowSource
from tuners.metrics import TunerMetrics
from tuners.objective import ObjectiveSpec
from tuners.planning.horizon import HorizonSettings, RegimeHorizon
from tuners.planning.paying import build_paying
from tuners.planning.planner import PlanSettings, TransitionPlanner
from tuners.planning.warmstart import TwinWarmStart
from tuners.space import DeploymentLimits, SearchSpace, TargetAcceptance

ENGINE_ROUTERS = ("roundrobin", "prefixaware")
ENGINE_KNOBS = DEFAULT_KNOBS.replace(cpu_gib=0.0)  # what the real fleet runs by default: no CPU tier

History = Callable[[float, float], pl.DataFrame]


@dataclasses.dataclass(frozen=True)
class EngineTiming:
    """Seconds of wall clock. control_start_s: first controller step (the agent has a window).
    settle_s / window_s: after a change, wait, then measure. recent_s / warm_s: the twin scores
    candidates on the last recent_s of requests, after replaying warm_s before them.
    downtime_s: what a router restart costs (the planner prices it)."""

    control_start_s: float = 10.0
    settle_s: float = 2.0
    window_s: float = 12.0
    recent_s: float = 20.0
    warm_s: float = 20.0
    downtime_s: float = 1.0
    horizon_s: float = 60.0
    horizon_cap_s: float = 300.0
    replan_growth: float = 1.5


DEFAULT_TIMING = EngineTiming()


@dataclasses.dataclass
class EngineTuning:
    controller: TuningController
    guardrails: Guardrails
    space: SearchSpace
    planner: TransitionPlanner  # .history: every plan it priced


def engine_space(pods: int) -> SearchSpace:
    limits = DeploymentLimits(pods=pods, node_memory_headroom_gib=1.0, l2_pool_gib=1.0, routers=ENGINE_ROUTERS)
    acc = TargetAcceptance(accepts={"router": ENGINE_ROUTERS}, fixed=ENGINE_KNOBS.to_dict(),
                           source="the real CPU engines")
    return SearchSpace.from_limits(limits).for_targets(acc)


def build_engine_tuning(*, actuator: Actuator, window_source: WindowSource, clock: Callable[[], float],
                        twin_cluster: TwinClusterSpec, history: History, metrics: TunerMetrics, seed: int,
                        timing: EngineTiming = DEFAULT_TIMING, dry_run: bool = False,
                        plan_executor: Executor | None = None) -> EngineTuning:
    space = engine_space(twin_cluster.pods)
    horizon = RegimeHorizon(HorizonSettings(floor_s=timing.horizon_s, cap_s=timing.horizon_cap_s,
                                            replan_growth=timing.replan_growth))
    objective = ObjectiveSpec(memory_ms_per_gib=0.0)
    guardrails = Guardrails(actuator, space, metrics,
                            GuardrailSettings(cooldown_s=timing.settle_s, max_changes_per_hour=60, dry_run=dry_run,
                                              apply="hot"),  # the real engines' router only: no restarts
                            clock=clock)
    live = LiveEvaluator(guardrails, window_source, LiveSettings(settle_s=timing.settle_s, window_s=timing.window_s,
                                                                 min_requests=15, max_extensions=1))
    paying = build_paying(history=history, twin_cluster=lambda: twin_cluster, current=actuator.current, clock=clock,
                          restarts=lambda a, b: False, routers=ENGINE_ROUTERS, search=None,
                          recent_s=timing.recent_s, warm_s=timing.warm_s, downtime_s=timing.downtime_s,
                          settings=PlanSettings(horizon_s=timing.horizon_s),
                          horizon=lambda: horizon.estimate(clock()))

    def twin_evaluator() -> TwinEvaluator:
        now = clock()
        return TwinEvaluator(history(now, timing.recent_s + timing.warm_s), twin_cluster, space.limits,
                             replay_fn=WarmReplay(now - timing.recent_s))

    paying.planner.search = TwinWarmStart(twin_evaluator, space, objective, trials=2, seed=seed)
    controller = TuningController(
        space=space, objective=objective, storage=optuna.storages.InMemoryStorage(), guardrails=guardrails,
        evaluator=live, metrics=metrics,
        settings=ControllerSettings(study="engine-demo", seed=seed, trials_per_phase=2, warm_start_k=2,
                                    min_improvement=0.02, plan_after_baseline=True, live_search=False,
                                    drift_quiet_s=timing.settle_s),
        warm_start=paying.planner, drift=None, counterfactual=paying.counterfactual, horizon=horizon,
        plan_executor=plan_executor)
    return EngineTuning(controller, guardrails, space, paying.planner)


def knobs_text(knobs: Knobs) -> str:
    return ", ".join(f"{k}={b}" for k, (_a, b) in ENGINE_KNOBS.diff(knobs).items()) or "defaults"


__all__ = ["DEFAULT_TIMING", "ENGINE_KNOBS", "ENGINE_ROUTERS", "EngineTiming", "EngineTuning", "build_engine_tuning", "engine_space",
           "knobs_text"]
