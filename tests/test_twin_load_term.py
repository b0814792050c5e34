"""The twin's load term (`ClusterSpec.load_delay_s`, set by the agent from vLLM's
num_requests_waiting by Little's law): every request's queue delay and TTFT rise by exactly the
offset, in both replay loops, and the pods' schedule (routing, caching) is unchanged."""
from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from contracts.knobs import Knobs
from simulator.cluster import ClusterError, ClusterSpec
from simulator.replay import replay
from simulator.synthetic import Phase, generate

WORKLOAD = generate((Phase(duration_s=60.0, rate_rps=6.0, system_prompts=8, system_prompt_tokens=(1024, 2048),
                           system_share=1.0, user_tokens=(200, 800), output_tokens=(50, 200), turns=(1, 1)),),
                    seed=3)


@pytest.mark.parametrize("router", ["roundrobin", "prefixaware", "kvaware"])
def test_the_load_delay_adds_to_every_ttft_and_queue_delay(router):
    knobs = Knobs(router=router)
    idle = replay(WORKLOAD, ClusterSpec(pods=2), knobs).requests
    loaded = replay(WORKLOAD, ClusterSpec(pods=2, load_delay_s=0.75), knobs).requests
    assert np.allclose(loaded["ttft_s"].to_numpy() - idle["ttft_s"].to_numpy(), 0.75)
    assert np.allclose(loaded["queue_delay_s"].to_numpy() - idle["queue_delay_s"].to_numpy(), 0.75)
    assert loaded["pod"].to_list() == idle["pod"].to_list()  # same routing
    assert loaded["gpu_hit_tokens"].to_list() == idle["gpu_hit_tokens"].to_list()


def test_the_slow_loop_agrees_with_the_fast_one(monkeypatch):
    from simulator import fastloop

    cluster = ClusterSpec(pods=2, load_delay_s=0.4)
    fast = replay(WORKLOAD, cluster, Knobs()).requests
    monkeypatch.setattr(fastloop, "supports", lambda twin: False)
    slow = replay(WORKLOAD, cluster, Knobs()).requests
    assert np.allclose(fast["ttft_s"].to_numpy(), slow["ttft_s"].to_numpy())


@pytest.mark.parametrize("bad", [-0.1, float("inf"), float("nan"), True, "1"])
def test_a_bad_load_delay_is_refused_naming_the_field(bad):
    with pytest.raises(ClusterError, match="load_delay_s"):
        ClusterSpec(load_delay_s=bad)
    assert dataclasses.replace(ClusterSpec(), load_delay_s=0.0).load_delay_s == 0.0
