"""The real-engine demo's tuner wiring (no engine): router-only space, replans as the regime ages."""
from __future__ import annotations

import polars as pl

from emulator.demo.engine_tuning import ENGINE_KNOBS, ENGINE_ROUTERS, build_engine_tuning, engine_settings
from simulator.cluster import ClusterSpec
from tests.support.tuner_fakes import FakeActuator, FakeClock
from tuners.metrics import TunerMetrics
from tuners.planning.plan_runner import InlineExecutor


class _NoWindows:
    def window(self, since: float, until: float):  # never enough requests: the controller keeps measuring
        return None


class _Empty:
    kind = "served"

    def history(self, now: float, seconds: float) -> pl.DataFrame:
        return pl.DataFrame()


def test_engine_tuner_searches_the_router_only_and_plans_again_as_the_regime_ages() -> None:
    clock = FakeClock(0.0)
    tuning = build_engine_tuning(actuator=FakeActuator(clock, ENGINE_KNOBS), window_source=_NoWindows(), clock=clock,
                                 twin_cluster=ClusterSpec(pods=2, gpu_tokens=6144, cpu_tokens=0, l2_tokens=0,
                                                          profile="cpu-tiny-llama"),
                                 workload=_Empty(), metrics=TunerMetrics(target="t"), seed=7,
                                 plan_executor=InlineExecutor())
    [dim] = tuning.space.dimensions
    assert dim.name == "router" and tuple(dim.values) == ENGINE_ROUTERS
    controller = tuning.new_controller()
    horizon = controller.horizon
    assert horizon is not None and horizon.settings.replan_growth == engine_settings(2, 7).tuner.planner.replan_growth
    assert horizon.settings.replan_growth == 1.5  # the engine file's override
    horizon.start(10.0)
    horizon.planned(38.0)  # the first plan at a regime age of 28 s
    assert not horizon.replan_due(50.0) and horizon.replan_due(52.0)  # 28 x 1.5 = 42 s of age
    assert tuning.planner is not None and tuning.planner.history == []
    assert controller.drift is None  # the run is too short for the detector's warm-up
