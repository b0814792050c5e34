"""The tuner of the real-engine demo: the agent's tuning stack (`agent.runtime.tuning`) with the
settings file `emulator/demo/engine_tuner.yaml`, on the wall clock of real processes and bounded by
what the real CPU engines can express.

What the file changes, and why, is written in it; what the deployment forces is here:
- the search space is the router only (`roundrobin` / `prefixaware`, which the process actuator
  runs as vllm-router's `round_robin` / `cache_aware`): the CPU backend has no LMCache, offload or
  L2, so every other knob keeps the deployment's value (no CPU tier: cpu_gib 0);
- the twin is the CPU profile calibrated on this engine (`cpu-tiny-llama`, bench/real_engine.py),
  one pod per engine with the engine's own KV capacity.
"""
from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import Executor
from pathlib import Path

import optuna
import yaml

from agent.runtime.tuning.build import Tuning, TuningIO, build_tuning
from agent.runtime.tuning.schema import deployment_limits
from agent.runtime.tuning.workload import WorkloadSource
from agent.settings import AgentSettings, load_settings
from contracts.actuator import Actuator
from contracts.knobs import DEFAULT_KNOBS, Knobs
from simulator.cluster import ClusterSpec as TwinClusterSpec
from tuners.live import WindowSource
from tuners.metrics import TunerMetrics
from tuners.planning.paying import restarts_serving_pods
from tuners.space import SearchSpace, TargetAcceptance

ENGINE_ROUTERS = ("roundrobin", "prefixaware")
ENGINE_KNOBS = DEFAULT_KNOBS.replace(cpu_gib=0.0)  # what the real fleet runs by default: no CPU tier
ENGINE_TUNER_FILE = Path(__file__).with_name("engine_tuner.yaml")


def engine_settings(pods: int, seed: int) -> AgentSettings:
    data = yaml.safe_load(ENGINE_TUNER_FILE.read_text()) or {}
    tuner = data.setdefault("tuner", {})
    tuner.setdefault("limits", {})["pods"] = pods
    tuner["seed"] = seed
    tuner.setdefault("warm_start", {})["seed"] = seed
    return load_settings(env={}, **data)


def engine_space(settings: AgentSettings) -> SearchSpace:
    limits = deployment_limits(settings, routers=ENGINE_ROUTERS)
    acc = TargetAcceptance(accepts={"router": ENGINE_ROUTERS}, fixed=ENGINE_KNOBS.to_dict(),
                           source="the real CPU engines")
    return SearchSpace.from_limits(limits).for_targets(acc)


def build_engine_tuning(*, actuator: Actuator, window_source: WindowSource, clock: Callable[[], float],
                        twin_cluster: TwinClusterSpec, workload: WorkloadSource, metrics: TunerMetrics, seed: int,
                        dry_run: bool = False, plan_executor: Executor | None = None) -> Tuning:
    settings = engine_settings(twin_cluster.pods, seed)
    return build_tuning(settings, TuningIO(
        actuator=actuator, space=engine_space(settings), window_source=window_source, workload=workload,
        twin_cluster=lambda: twin_cluster, clock=clock, metrics=metrics, storage=optuna.storages.InMemoryStorage(),
        restarts=restarts_serving_pods, plan_executor=plan_executor, dry_run=dry_run))


def knobs_text(knobs: Knobs) -> str:
    return ", ".join(f"{k}={b}" for k, (_a, b) in ENGINE_KNOBS.diff(knobs).items()) or "defaults"


__all__ = ["ENGINE_KNOBS", "ENGINE_ROUTERS", "ENGINE_TUNER_FILE", "build_engine_tuning", "engine_settings",
           "engine_space", "knobs_text"]
