"""The search space follows the discovered deployment mode: each knob offers only the values the
actuation targets accept (and the twin can evaluate), and coupled knobs are one dimension."""
from __future__ import annotations

import pytest

from agent.runtime.tuning_bridge import restrict_space
from contracts.knobs import Knobs
from tuners.space import TWIN_CPU_EVICTIONS, TWIN_ROUTERS, CandidateError, DeploymentLimits, SearchSpace

MP_EVICTIONS = ("lru", "arc", "isolated_lru", "noop")  # LMCache MP --eviction-policy
VLLM_ROUTER = ("roundrobin", "kvaware", "random", "cache_aware", "power_of_two", "consistent_hash")
ALL = {"chunk_tokens", "cpu_gib", "cpu_eviction", "l2_eviction", "router", "l2_min_prompt_tokens"}


def _values(space: SearchSpace) -> dict:
    return {d.name: getattr(d, "values", None) for d in space.dimensions}


def test_defaults_offer_only_what_the_twin_models():
    assert TWIN_ROUTERS == ("roundrobin", "session", "prefixaware", "kvaware")
    assert TWIN_CPU_EVICTIONS == ("lru", "lfu", "fifo", "arc")
    space = SearchSpace.from_limits(DeploymentLimits(), tune_cpu_eviction=True)
    assert _values(space)["router"] == TWIN_ROUTERS and _values(space)["cpu_eviction"] == TWIN_CPU_EVICTIONS
    with pytest.raises(CandidateError, match="limits.routers"):
        DeploymentLimits(routers=("random",))


def test_lmcache_mp_offers_its_own_policies_and_vllm_router_its_own():
    space = SearchSpace.from_limits(DeploymentLimits(l2_backend="curvine"), tune_cpu_eviction=True)
    mode = restrict_space(space, ALL, Knobs(), accepted={"cpu_eviction": MP_EVICTIONS, "router": VLLM_ROUTER})
    assert _values(mode)["cpu_eviction"] == ("lru", "arc")  # no lfu/fifo in MP; no isolated_lru/noop in the twin
    assert _values(mode)["router"] == ("roundrobin", "kvaware")
    assert all(k.cpu_eviction in ("lru", "arc") for k in mode.iter_grid())


def test_cache_policy_with_an_lmcache_disk_l2_is_one_dimension():
    space = SearchSpace.from_limits(DeploymentLimits(l2_backend="lmcache"), tune_cpu_eviction=True)
    mode = restrict_space(space, ALL, Knobs(), accepted={"cpu_eviction": ("lru", "lfu", "fifo")},
                          coupled={"l2_eviction": "cpu_eviction"})
    names = [d.name for d in mode.dimensions]
    assert "cpu_eviction" in names and "l2_eviction" not in names
    (dim,) = [d for d in mode.dimensions if d.name == "cpu_eviction"]
    assert (dim.values, dim.couples) == (("lru", "lfu", "fifo"), ("l2_eviction",))
    knobs = mode.to_knobs({**mode.to_params(Knobs()), "cpu_eviction": "lfu"})
    assert (knobs.cpu_eviction, knobs.l2_eviction) == ("lfu", "lfu")
    assert {(k.cpu_eviction, k.l2_eviction) for k in mode.iter_grid()} == {("lru", "lru"), ("lfu", "lfu"),
                                                                          ("fifo", "fifo")}
    with pytest.raises(CandidateError, match="l2_eviction='lru' must equal cpu_eviction='lfu'"):
        mode.validate(Knobs(cpu_eviction="lfu", l2_eviction="lru"))
    # the coupled dimension is searched only when the targets own both knobs (here: via the coupling)
    assert "cpu_eviction" not in [d.name for d in restrict_space(space, ALL - {"l2_eviction"}, Knobs(),
                                                                  coupled={"l2_eviction": "cpu_eviction"}).dimensions]


def test_without_tuning_cpu_eviction_the_coupled_l2_dimension_still_moves_both():
    space = SearchSpace.from_limits(DeploymentLimits(l2_backend="lmcache"))
    mode = restrict_space(space, ALL, Knobs(), coupled={"l2_eviction": "cpu_eviction"})
    (dim,) = [d for d in mode.dimensions if d.name == "cpu_eviction"]
    assert dim.couples == ("l2_eviction",)
    assert all(k.cpu_eviction == k.l2_eviction for k in mode.iter_grid())


def test_a_running_value_the_twin_does_not_model_is_kept_when_not_tuned():
    space = SearchSpace.from_limits(DeploymentLimits(l2_backend="curvine"))
    running = Knobs(router="cache_aware")  # vllm-project/router's default policy
    mode = restrict_space(space, ALL - {"router"}, running)
    assert "router" not in _values(mode)
    assert mode.validate(mode.to_knobs(mode.to_params(running))).router == "cache_aware"
    with pytest.raises(CandidateError, match="router='random' not allowed"):
        mode.validate(running.replace(router="random"))


def test_the_targets_acceptance_keeps_a_coupled_dimension_coupled():
    from tuners.space import TargetAcceptance

    space = SearchSpace.from_limits(DeploymentLimits(l2_backend="lmcache"), tune_cpu_eviction=True)
    acc = TargetAcceptance({"cpu_eviction": ("lru", "lfu", "fifo"), "l2_eviction": ("lru", "lfu", "fifo"),
                            "chunk_tokens": None, "cpu_gib": None}, {"router": "roundrobin"}, "targets.yaml")
    mode = restrict_space(space, ALL, Knobs(), coupled={"l2_eviction": "cpu_eviction"}).for_targets(acc)
    (dim,) = [d for d in mode.dimensions if d.name == "cpu_eviction"]
    assert (dim.values, dim.couples) == (("lru", "lfu", "fifo"), ("l2_eviction",))
    knobs = mode.validate(mode.to_knobs({**mode.to_params(Knobs()), "cpu_eviction": "fifo"}))
    assert (knobs.cpu_eviction, knobs.l2_eviction) == ("fifo", "fifo")


def test_the_warm_start_is_skipped_when_the_twin_cannot_replay_what_runs():
    from agent.runtime.assembly import twin_unmodelled

    assert twin_unmodelled(Knobs()) == []
    assert twin_unmodelled(Knobs(router="cache_aware", cpu_eviction="isolated_lru")) == [
        "router=cache_aware", "cpu_eviction=isolated_lru"]
