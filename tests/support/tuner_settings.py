"""The tuner dataclasses as the settings schema's defaults make them (agent/runtime/tuning/schema.py),
with a test's own values on top: the dataclasses carry no defaults of their own."""
from __future__ import annotations

from typing import Any

from agent.runtime.tuning.schema import defaults
from agent.settings import AgentSettings
from tuners.controller import ControllerSettings
from tuners.drift import DriftSettings
from tuners.guardrails import GuardrailSettings
from tuners.live import LiveSettings
from tuners.planning.horizon import HorizonSettings
from tuners.planning.planner import PlanSettings
from tuners.stats import RegressionSettings

# a bare detector (a fixed level, no refractory period, no minimum shift): what the detector tests
# exercise unless they name one of these
BARE_DRIFT = {"track": 0.0, "refractory": 0, "min_rel_shift": 0.0}
LIVE_SEARCH = AgentSettings(tuner={"planner": {"enabled": False}})  # the controller's live search


def drift_settings(**kw: Any) -> DriftSettings:
    return defaults(DriftSettings, **{**BARE_DRIFT, **kw})


def guardrail_settings(**kw: Any) -> GuardrailSettings:
    return defaults(GuardrailSettings, **kw)


def regression_settings(**kw: Any) -> RegressionSettings:
    return defaults(RegressionSettings, **kw)


def live_settings(**kw: Any) -> LiveSettings:
    return defaults(LiveSettings, **kw)


def controller_settings(**kw: Any) -> ControllerSettings:
    return defaults(ControllerSettings, LIVE_SEARCH, **kw)


def plan_settings(**kw: Any) -> PlanSettings:
    return defaults(PlanSettings, **kw)


def horizon_settings(**kw: Any) -> HorizonSettings:
    return defaults(HorizonSettings, **kw)
