"""Two real vLLM CPU engines (pinned to one core each) behind the real vllm-router (0.1.17), shared
by the module: round_robin and cache_aware route as they say, the agent scrapes the router's own
/metrics, and the kv_aware policy routes by the engines' real KV events.

kv_aware, measured here (docs/real-engines.md):
- it routes a prompt to the engine holding its prefix when the prompt is sent as token ids and
  `--kv-event-block-size` equals the engines' block size (32 on the CPU backend);
- a text prompt is never tokenized by the router for an HTTP worker: its own counters say
  `kv_routing_inputs_total{result="preparation_rejected"}` and the placement lookup is
  `missing_tokens`, so it falls back to load;
- with the router's default block size (16) against 32-token engine blocks every lookup is a
  `miss`: the router chunks prompts into blocks of the size it was given.
The engines' hash algorithm and seed do not enter (the two engines here differ in both): the router
indexes blocks by a hash of their token ids that it computes itself, and uses the engines' block
hashes only to chain and remove. Without `--kv-event-model` the router refuses to start ("static
KV event sources require worker URLs and model identity").
"""
from __future__ import annotations

import random
import time

import pytest

from agent.collect.discovery import StaticTargets
from agent.runtime.app import Agent
from agent.settings import load_settings
from contracts.tier_model import AUTO_ROLE, Target
from tests.support.real_engine import (
    ROUTER_BINARY,
    Router,
    complete,
    engine_counters,
    engine_spec,
    skip_reason,
    start_engines,
    words,
)

pytestmark = [
    pytest.mark.skipif(skip_reason() is not None, reason=skip_reason() or ""),
    pytest.mark.skipif(ROUTER_BINARY is None, reason="vllm-router is not installed (a dev dependency)"),
]


@pytest.fixture(scope="module")
def engines(tmp_path_factory):
    # different block-hash algorithms and seeds: kv_aware must not depend on them
    pair = start_engines([engine_spec(cpu_bind="0"),
                          engine_spec(cpu_bind="1", extra_args=("--prefix-caching-hash-algo", "sha256_cbor"),
                                      extra_env=(("PYTHONHASHSEED", "123"),))],
                         tmp_path_factory.mktemp("engines"))
    yield pair
    for e in pair:
        e.stop()


def _requests(engines) -> list[float]:
    return [engine_counters(e).requests for e in engines]


def _delta(after: list[float], before: list[float]) -> list[float]:
    return [a - b for a, b in zip(after, before, strict=True)]


def _prompt(rng: random.Random, n: int) -> list[int]:
    return [rng.randrange(4, 4096) for _ in range(n)]


def test_round_robin_alternates_and_the_agent_reads_the_router(engines):
    urls = [e.base_url for e in engines]
    rng = random.Random(3)
    with Router(urls, "round_robin") as router:
        before = _requests(engines)
        for _ in range(6):
            assert complete(router.url, _prompt(rng, 40))["usage"]["completion_tokens"] == 1
        assert _delta(_requests(engines), before) == [3, 3]
        targets = [Target(router.metrics_url, AUTO_ROLE, "router-0"),
                   *(Target(e.metrics_url, "vllm", f"engine-{i}") for i, e in enumerate(engines))]
        agent = Agent(load_settings(None, env={}), StaticTargets(targets))
        snap = agent.scrape_now()
        roles = {st.target.pod: (st.up, st.target.role, st.warnings) for st in snap.targets}
        assert roles["router-0"] == (True, "router", ())
        values, _ = agent.store.values(pod="router-0")
        assert values["router_requests"] == 6
        assert values["router_latency_seconds:count"] == 6
        for i, e in enumerate(engines):
            pod_values, _ = agent.store.values(pod=f"engine-{i}")
            assert pod_values["prompt_tokens"] == engine_counters(e).prompt_tokens


def test_cache_aware_keeps_a_shared_prefix_on_one_engine(engines):
    """Text prompts: cache_aware matches on the request text, so every request of a prefix lands
    on the engine that computed it first, and that engine's prefix cache serves the prefix."""
    rng = random.Random(4)
    prefixes = [_prompt(rng, 256), _prompt(rng, 256)]
    with Router([e.base_url for e in engines], "cache_aware") as router:
        for prefix in prefixes:
            before, hits = _requests(engines), [engine_counters(e).prefix_hits for e in engines]
            for _ in range(4):
                complete(router.url, words(prefix + _prompt(rng, 16)))
            got = _delta(_requests(engines), before)
            assert sorted(got) == [0, 4], got
            holder = got.index(4)
            # the first request computed the 8 prefix blocks; the next three hit them
            assert engine_counters(engines[holder]).prefix_hits - hits[holder] >= 3 * 256


def _kv_router(engines, block_size: int) -> Router:
    sources = [f"--kv-event-source={e.base_url}={e.kv_events_url}" for e in engines]
    replays = [f"--kv-event-replay-source={e.base_url}={e.replay_url}" for e in engines]
    return Router([e.base_url for e in engines], "kv_aware", *sources, *replays,
                  "--kv-event-block-size", str(block_size), "--kv-event-model", "tiny-llama")


def _warm(engines, rng: random.Random) -> list[list[int]]:
    """One 256-token prefix computed directly on each engine (not through the router)."""
    prefixes = [_prompt(rng, 256) for _ in engines]
    for e, p in zip(engines, prefixes, strict=True):
        complete(e.base_url, p + [7])
    time.sleep(0.5)  # the router's subscribers have the BlockStored events
    return prefixes


def _lookups(router: Router) -> dict[str, float]:
    return {dict(k)["result"]: v for k, v in router.samples("vllm_router_kv_placement_lookups_total").items()}


def test_kv_aware_routes_token_id_prompts_to_the_engine_holding_the_prefix(engines):
    assert [engine_counters(e).cache_config["prefix_caching_hash_algo"] for e in engines] == ["sha256", "sha256_cbor"]
    rng = random.Random(5)
    with _kv_router(engines, block_size=32) as router:
        time.sleep(0.5)
        prefixes = _warm(engines, rng)
        for i, prefix in enumerate(prefixes):
            before = _requests(engines)
            for j in range(3):
                complete(router.url, prefix + [100 + j] * 8)
            expect = [0, 0]
            expect[i] = 3
            assert _delta(_requests(engines), before) == expect, f"prefix held by engine {i}"
        assert _lookups(router).get("hit") == 6


def test_kv_aware_cannot_route_text_prompts_over_http(engines):
    """The evidence for text prompts: the router prepares no token ids for an HTTP worker."""
    rng = random.Random(6)
    with _kv_router(engines, block_size=32) as router:
        time.sleep(0.5)
        prefixes = _warm(engines, rng)
        for prefix in prefixes:
            complete(router.url, words(prefix + [9] * 8))
        assert _lookups(router) == {"missing_tokens": 2}
        inputs = {dict(k)["result"]: v for k, v in router.samples("vllm_router_kv_routing_inputs_total").items()}
        assert inputs.get("preparation_rejected", 0) > 0 and "token_ids" not in inputs


def test_kv_aware_misses_everything_with_a_block_size_other_than_the_engines(engines):
    """The evidence for the block size: the router's default (16) against the engines' 32."""
    rng = random.Random(7)
    with _kv_router(engines, block_size=16) as router:
        time.sleep(0.5)
        prefixes = _warm(engines, rng)
        for prefix in prefixes:
            for j in range(2):
                complete(router.url, prefix + [200 + j] * 8)
        assert _lookups(router) == {"miss": 4}
