"""Search space as data: bounds from the deployment, validation with clear errors."""
from __future__ import annotations

import pytest

from contracts.knobs import Knobs
from tuners.space import (
    CandidateError,
    Choice,
    DeploymentLimits,
    FloatRange,
    IntRange,
    SearchSpace,
    memory_cost_gib,
)


def test_standard_space_follows_the_limits() -> None:
    limits = DeploymentLimits(pods=4, node_memory_headroom_gib=10.5, cpu_gib_step=2.0, l2_backend="curvine")
    space = SearchSpace.from_limits(limits)
    grid = space.grid()
    assert grid["chunk_tokens"] == (64, 128, 256, 512, 1024, 2048)
    assert grid["cpu_gib"] == (0.0, 2.0, 4.0, 6.0, 8.0, 10.0)  # capped by the 10.5 GiB headroom
    assert grid["l2_eviction"] == ("lru", "lfu")  # what Curvine offers
    assert grid["l2_watermarks"] == ("1/1", "0.9/0.8", "0.8/0.6")
    assert grid["router"] == ("roundrobin", "session", "prefixaware", "kvaware")
    assert grid["l2_min_prompt_tokens"][0] == 0 and grid["l2_min_prompt_tokens"][-1] == 4096
    assert space.grid_size() == 6 * 6 * 2 * 3 * 4 * 17


def test_backend_without_watermarks_has_no_watermark_dimension() -> None:
    space = SearchSpace.from_limits(DeploymentLimits(l2_backend="lmcache"))
    assert "l2_watermarks" not in space.grid()
    assert space.grid()["l2_eviction"] == ("lru", "lfu", "fifo")
    with pytest.raises(CandidateError, match="has no watermarks"):
        space.validate(Knobs(l2_high_watermark=0.9, l2_low_watermark=0.8))


def test_params_round_trip_through_knobs() -> None:
    space = SearchSpace.from_limits(DeploymentLimits())
    params = {"chunk_tokens": 512, "cpu_gib": 7.0, "l2_eviction": "s3fifo", "l2_watermarks": "0.8/0.6",
              "router": "kvaware", "l2_min_prompt_tokens": 1024}
    knobs = space.to_knobs(params)
    assert knobs == Knobs(chunk_tokens=512, cpu_gib=7.0, l2_eviction="s3fifo", l2_high_watermark=0.8,
                          l2_low_watermark=0.6, router="kvaware", l2_min_prompt_tokens=1024)
    assert space.to_params(knobs) == params


def test_validation_lists_every_problem_and_valid_choices() -> None:
    limits = DeploymentLimits(pods=4, node_memory_headroom_gib=8, cpu_budget_gib=16, l2_backend="curvine",
                              routers=("roundrobin", "prefixaware"))
    space = SearchSpace.from_limits(limits)
    bad = Knobs(cpu_gib=12.0, l2_eviction="arc", router="kvaware", l2_min_prompt_tokens=5000)
    with pytest.raises(CandidateError) as err:
        space.validate(bad)
    msg = str(err.value)
    assert "cpu_gib=12 exceeds the node memory headroom (8 GiB)" in msg
    assert "l2_eviction='arc' not offered by the curvine backend; valid: lru, lfu" in msg
    assert "router='kvaware' not allowed; valid: roundrobin, prefixaware" in msg
    assert "l2_min_prompt_tokens=5000 outside 0..4096" in msg
    assert "constraint fleet_cpu_budget_gib violated by 32" in msg  # 12 GiB x 4 pods - 16
    assert space.validate(Knobs(cpu_gib=4.0)) == Knobs(cpu_gib=4.0)


def test_memory_constraints_are_values_not_bounds() -> None:
    limits = DeploymentLimits(pods=3, node_memory_headroom_gib=20, cpu_budget_gib=30)
    space = SearchSpace.from_limits(limits)
    assert space.constraints(Knobs(cpu_gib=10.0)) == {"node_memory_gib": -10.0, "fleet_cpu_budget_gib": 0.0}
    assert space.constraints(Knobs(cpu_gib=12.0))["fleet_cpu_budget_gib"] == 6.0
    assert memory_cost_gib(Knobs(cpu_gib=12.0), limits) == 36.0


def test_bad_limits_and_dimensions_are_clear_errors() -> None:
    with pytest.raises(CandidateError, match="l2_backend: invalid value 'ceph'; valid choices: curvine, lmcache, twin"):
        DeploymentLimits(l2_backend="ceph")
    with pytest.raises(CandidateError, match=r"chunk_choices: invalid value\(s\) \[96\]"):
        DeploymentLimits(chunk_choices=(96, 256))
    with pytest.raises(CandidateError, match="pair"):
        DeploymentLimits(watermarks=((0.6, 0.8),))
    with pytest.raises(CandidateError, match="unknown dimension 'chunk'"):
        SearchSpace((Choice("chunk", (1, 2)),))


def test_dimension_membership_respects_steps() -> None:
    assert IntRange("l2_min_prompt_tokens", 0, 4096, 256).contains(512)
    assert not IntRange("l2_min_prompt_tokens", 0, 4096, 256).contains(500)
    assert FloatRange("cpu_gib", 0, 10, 2.5).contains(7.5)
    assert not FloatRange("cpu_gib", 0, 10, 2.5).contains(7.0)
    assert FloatRange("cpu_gib", 0, 10, 2.5).grid() == (0.0, 2.5, 5.0, 7.5, 10.0)


def test_iter_grid_enumerates_a_small_custom_space() -> None:
    space = SearchSpace((Choice("chunk_tokens", (256, 512)), Choice("router", ("roundrobin", "session"))))
    got = list(space.iter_grid())
    assert len(got) == 4
    assert got[0] == Knobs(chunk_tokens=256, router="roundrobin")
    assert got[-1] == Knobs(chunk_tokens=512, router="session")
