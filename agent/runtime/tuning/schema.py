"""The tuner's settings, from the one schema (`agent.settings.tuner`, the `tuner:` sections) to the
`tuners` dataclasses, which carry no defaults of their own.

Each converter takes the whole `AgentSettings` (plus what the deployment decides at run time,
such as the actuator's dry-run or the fleet's pod count), so a value has one home: the pydantic
field. `SOURCES` lists every tuner settings dataclass with its converter; `defaults(cls)` is the
dataclass as the schema's defaults make it (what tests build on).
"""
from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any, TypeVar

from agent.settings import AgentSettings, TunerSection
from tuners.controller import ControllerSettings
from tuners.drift import CONFIG_DEPENDENT, DriftSettings
from tuners.guardrails import GuardrailSettings
from tuners.live import LiveSettings
from tuners.objective import ObjectiveSpec
from tuners.planning.horizon import HorizonSettings
from tuners.planning.planner import PlanSettings
from tuners.space import DeploymentLimits
from tuners.stats import RegressionSettings

T = TypeVar("T")
# drift signals that move with the configuration, re-learned after each change the planner makes:
# the hit ratio, and the KV-event reuse ratio (its blocks are chunk-sized)
PLANNER_CONFIG_DEPENDENT = ("hit_ratio", "reuse_ratio")


def drift_settings(s: AgentSettings) -> DriftSettings:
    d = s.tuner.drift
    return DriftSettings(method=d.method, warmup=d.warmup, delta=d.delta, threshold=d.threshold,
                         min_rel_sigma=d.min_rel_sigma, track=d.track, refractory=d.refractory,
                         min_rel_shift=d.min_rel_shift, confirm=d.confirm)


def regression_settings(s: AgentSettings) -> RegressionSettings:
    r = s.tuner.guardrails.regression
    return RegressionSettings(method=r.method, alpha=r.alpha, min_rel_effect=r.min_rel_effect,
                              quantile=0.95 if s.tuner.objective == "ttft_p95" else 0.5,
                              min_samples=r.min_samples, n_boot=r.n_boot)


def guardrail_settings(s: AgentSettings, *, dry_run: bool | None = None, apply: str | None = None) -> GuardrailSettings:
    """`dry_run`: the actuator's (targets file or global); default the global `dry_run`. `apply`:
    the scope in force (shadow mode: none); default `tuner.apply`."""
    g = s.tuner.guardrails
    return GuardrailSettings(cooldown_s=g.cooldown_s, max_changes_per_hour=g.max_changes_per_hour,
                             dry_run=s.dry_run if dry_run is None else dry_run,
                             apply=s.tuner.apply if apply is None else apply,  # type: ignore[arg-type]
                             regression=regression_settings(s))


def live_settings(s: AgentSettings) -> LiveSettings:
    v = s.tuner.live
    return LiveSettings(settle_s=v.settle_s, window_s=v.window_s, min_requests=v.min_requests,
                        max_extensions=v.max_extensions)


def plan_settings(s: AgentSettings) -> PlanSettings:
    p = s.tuner.planner
    return PlanSettings(horizon_s=p.horizon_s, margin=p.margin, hot_margin=p.hot_margin, tolerance=p.tolerance,
                        search_k=p.search_k)


def horizon_settings(s: AgentSettings) -> HorizonSettings:
    p = s.tuner.planner
    return HorizonSettings(floor_s=p.horizon_floor_s, cap_s=max(p.horizon_cap_s, p.horizon_floor_s),
                           replan_growth=p.replan_growth, trust_after=p.horizon_trust_after, min_s=p.horizon_min_s)


def drift_quiet_s(t: TunerSection) -> float:
    """How long drift signals are ignored after each change: a rolling restart's length plus 10 s."""
    return t.drift.quiet_s if t.drift.quiet_s is not None else t.planner.restart_downtime_s * t.limits.pods + 10.0


def controller_settings(s: AgentSettings, *, owner: str = "") -> ControllerSettings:
    """The planner on: plan after each baseline, only the planner's candidates live; off: live search
    (the twin search at the phase's start, or after its baseline with `warm_start.after_baseline`).
    `owner`: who runs the trials (the Lease identity; default the study name)."""
    t = s.tuner
    planner = t.planner.enabled
    return ControllerSettings(study=t.study, sampler=t.sampler, seed=t.seed, owner=owner or t.study,
                              trials_per_phase=t.trials_per_phase, warm_start_k=t.warm_start.top_k,
                              min_improvement=t.min_improvement, max_apply_retries=t.max_apply_retries,
                              plan_after_baseline=planner or t.warm_start.after_baseline, live_search=not planner,
                              drift_quiet_s=drift_quiet_s(t) if planner else 0.0,
                              config_dependent=PLANNER_CONFIG_DEPENDENT if planner else CONFIG_DEPENDENT)


def deployment_limits(s: AgentSettings, **extra: Any) -> DeploymentLimits:
    """`tuner.limits`; `extra`: what the deployment restricts beyond them (e.g. `routers`)."""
    return DeploymentLimits(**s.tuner.limits.model_dump(), **extra)


def objective_spec(s: AgentSettings) -> ObjectiveSpec:
    return ObjectiveSpec(metric=s.tuner.objective, memory_ms_per_gib=s.tuner.memory_ms_per_gib)


# every tuner settings dataclass and where its values come from (tests/test_tuner_defaults.py
# fails on a dataclass named *Settings in tuners/ that is missing here or carries a default)
SOURCES: dict[type, Callable[[AgentSettings], Any]] = {
    DriftSettings: drift_settings,
    RegressionSettings: regression_settings,
    GuardrailSettings: guardrail_settings,
    LiveSettings: live_settings,
    PlanSettings: plan_settings,
    HorizonSettings: horizon_settings,
    ControllerSettings: controller_settings,
}


def defaults(cls: type[T], settings: AgentSettings | None = None, **changes: Any) -> T:
    """`cls` as `settings` (default: the schema's defaults) make it, with `changes` on top."""
    made = SOURCES[cls](settings if settings is not None else AgentSettings())
    return dataclasses.replace(made, **changes)


__all__ = ["PLANNER_CONFIG_DEPENDENT", "SOURCES", "controller_settings", "defaults", "deployment_limits",
           "drift_quiet_s", "drift_settings", "guardrail_settings", "horizon_settings", "live_settings",
           "objective_spec", "plan_settings", "regression_settings"]
