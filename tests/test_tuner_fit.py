"""The search fits the deployment (an absent tier has no dimension, coupled knobs stay one), the
regime horizon comes from the run, and the planner prices memory and says why it declines."""
from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest

from agent.runtime.tuning.build import restart_space
from contracts.knobs import DEFAULT_KNOBS
from emulator.demo.ceiling import cpu_levels, dimension_values, search_ceiling
from tests.support.tuner_settings import horizon_settings
from tuners.planning.capacity_source import HeadroomCapacity
from tuners.planning.horizon import RegimeHorizon, estimate_horizon
from tuners.planning.planner import decide, price
from tuners.space import CandidateError, DeploymentLimits, SearchSpace
from tuners.space.modes import follow_deployment


def names(space: SearchSpace) -> list[str]:
    return [d.name for d in space.dimensions]


def test_the_space_per_deployment_mode() -> None:
    curvine = SearchSpace.from_limits(DeploymentLimits(l2_backend="curvine"))
    assert names(curvine) == ["chunk_tokens", "cpu_gib", "l2_eviction", "l2_watermarks", "router",
                              "l2_min_prompt_tokens"]
    lmcache = SearchSpace.from_limits(DeploymentLimits(l2_backend="lmcache"))
    assert "l2_watermarks" not in names(lmcache)
    # no shared L2 (production-stack, CPU offload only): no L2 dimension at all
    none = SearchSpace.from_limits(DeploymentLimits(l2_backend="none", node_memory_headroom_gib=64.0))
    assert names(none) == ["chunk_tokens", "cpu_gib", "router"]
    assert none.dimensions[1].high == 64.0
    with pytest.raises(CandidateError, match="no L2"):
        none.validate(DEFAULT_KNOBS.replace(l2_eviction="lfu"))
    none.validate(DEFAULT_KNOBS.replace(cpu_gib=64.0, chunk_tokens=512))
    # one offered value is no dimension: the knob is fixed at it
    one = SearchSpace.from_limits(DeploymentLimits(l2_backend="none", chunk_choices=(512,), routers=("kvaware",)))
    assert names(one) == ["cpu_gib"] and one.fixed.chunk_tokens == 512 and one.fixed.router == "kvaware"
    # the planner's search leaves the router to the hot decision
    assert "router" not in names(restart_space(curvine))


def test_coupled_knobs_stay_one_dimension() -> None:
    space = SearchSpace.from_limits(DeploymentLimits(l2_backend="lmcache"), tune_cpu_eviction=True)
    fitted = follow_deployment(space, {"cpu_eviction": ("lru", "lfu", "fifo")}, {"l2_eviction": "cpu_eviction"})
    assert "l2_eviction" not in names(fitted)
    [cpu] = [d for d in fitted.dimensions if d.name == "cpu_eviction"]
    assert cpu.couples == ("l2_eviction",)
    k = fitted.to_knobs({"cpu_eviction": "lfu"})
    assert k.cpu_eviction == k.l2_eviction == "lfu"


def test_the_ceiling_searches_the_whole_space_up_to_the_headroom() -> None:
    space = SearchSpace.from_limits(DeploymentLimits(l2_backend="none", node_memory_headroom_gib=64.0))
    values = dimension_values(space)
    assert values["cpu_gib"][0] == 0.0 and values["cpu_gib"][-1] == 64.0
    assert set(values["router"]) == {"roundrobin", "session", "prefixaware", "kvaware"}
    assert cpu_levels(10.0) == (0.0, 2.0, 5.0, 8.0, 10.0)

    # a toy twin: TTFT falls with the buffer, chunk 512 is best, kvaware is best
    def toy(k):
        t = 1.0 / (1.0 + k.cpu_gib / 16) + (0.0 if k.chunk_tokens == 512 else 0.2) + (0 if k.router == "kvaware" else .3)
        return {0: np.full(10, t)}

    free, priced = search_ceiling(toy, [0], space, [DEFAULT_KNOBS], memory_prices=(0.0, 5.0))
    assert free.best[0].cpu_gib == 64.0 and free.best[0].chunk_tokens == 512 and free.best[0].router == "kvaware"
    assert priced.best[0].cpu_gib < 64.0  # 5 ms/GiB x 4 pods: the last GiB do not buy their price
    exhaustive = search_ceiling(toy, [0], space, [DEFAULT_KNOBS], memory_prices=(0.0,), exhaustive=True)[0]
    assert exhaustive.best[0] == free.best[0]


def test_horizon_from_the_run() -> None:
    s = horizon_settings(floor_s=300.0, cap_s=3600.0, replan_growth=1.5)
    assert estimate_horizon(100.0, [], s).horizon_s == 300.0  # young, no history: the floor
    assert estimate_horizon(1000.0, [], s).horizon_s == 1000.0  # it has lasted 1000 s: as long again
    assert estimate_horizon(100.0, [480.0, 500.0], s).horizon_s == 390.0  # typical 490 s minus its age
    assert estimate_horizon(100.0, [4000.0, 9000.0], s).horizon_s == 3600.0  # the cap
    assert estimate_horizon(500.0, [480.0], s).horizon_s == 300.0  # at the typical length: due to end (floor)
    # two past regimes or more: the history stands on its own, the floor no longer lifts it
    assert estimate_horizon(430.0, [480.0, 500.0], s).horizon_s == 60.0  # 60 s left of a typical 490 s
    assert estimate_horizon(500.0, [480.0, 500.0], s).horizon_s == 30.0  # due to end: min_s
    assert estimate_horizon(500.0, [480.0, 500.0], dataclasses.replace(s, trust_after=3)).horizon_s == 300.0
    assert estimate_horizon(2000.0, [480.0], s).horizon_s == 2000.0  # far outlived it: as long again
    h = RegimeHorizon(s)
    h.start(0.0)
    h.planned(100.0)
    assert not h.replan_due(140.0) and h.replan_due(150.0)
    h.start(480.0)
    assert h.past_lengths_s == [480.0] and h.age(500.0) == 20.0 and not h.replan_due(900.0)
    with pytest.raises(ValueError):
        horizon_settings(floor_s=0.0)


class _Twin:
    transition_s = 100.0

    def __init__(self, ttft):
        self.ttft = ttft

    def steady(self, knobs):
        return np.full(100, self.ttft(knobs, False))

    def switch(self, before, after, *, restart):
        return np.full(100, self.ttft(after, restart))


def test_pricing_says_gain_cost_payback_and_why() -> None:
    now = DEFAULT_KNOBS
    big = now.replace(cpu_gib=32.0)
    twin = _Twin(lambda k, restart: 2.0 if restart else (0.8 if k.cpu_gib > 5 else 1.0))
    long = decide(twin, now, [big], restarts=lambda a, b: True, margin=0.03, horizon_s=3600.0, tolerance=0.005)[0]
    short = decide(twin, now, [big], restarts=lambda a, b: True, margin=0.03, horizon_s=300.0, tolerance=0.005)[0]
    # 100 requests / 100 s at 0.2 s saved each: 720 s/h; the transition costs 100 x 1 s: payback 500 s
    assert long.gain_per_hour_s == pytest.approx(720.0) and long.transition_cost_s == pytest.approx(100.0)
    assert long.payback_s == pytest.approx(500.0)
    assert long.accepted and long.verdict == "apply"
    assert not short.accepted and "horizon" in short.reason
    # memory priced: 27 GiB x 4 pods at 2 ms/GiB = 216 ms on a 1 s p95: the move no longer pays on p95
    priced = decide(twin, now, [big], restarts=lambda a, b: True, margin=0.03, horizon_s=3600.0, tolerance=0.005,
                    memory_s=lambda k: 0.002 * k.cpu_gib * 4)[0]
    assert priced.gain_p95 < long.gain_p95 - 0.2 and not priced.accepted
    per_hour, cost, payback = price(np.ones(10), np.ones(10), np.full(10, 2.0), 10.0, 10.0)
    assert per_hour < 0 and cost == 0.0 and math.isinf(payback)
    assert HeadroomCapacity(DeploymentLimits(node_memory_headroom_gib=64.0)).cpu_candidates(now) == [64.0, 32.0]
