"""Batch replay: the pure mode equals an independent LRU replay on the real traces, invariants on
random small workloads (hypothesis), determinism and the summary contract."""
from __future__ import annotations

from collections import OrderedDict

import polars as pl
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from contracts.knobs import (
    CHUNK_TOKEN_CHOICES,
    L2_EVICTION_CHOICES,
    Knobs,
)
from simulator.cluster import ClusterSpec
from simulator.replay import replay
from simulator.streams import StreamCache
from simulator.twin import Twin
from simulator.workload import iter_requests, load_trace, synthetic
from tests.support.twin_helpers import PrefixIds, frame, req
from tuners.space import TWIN_CPU_EVICTIONS, TWIN_ROUTERS  # every router and CPU policy the twin models


def reference_prefix_lru(df: pl.DataFrame, capacity_blocks: int) -> list[int]:
    """Textbook LRU prefix cache over full 512-token blocks: hit tokens per request."""
    cache: OrderedDict[int, None] = OrderedDict()
    hits = []
    for ids, n in zip(df["hash_ids"].to_list(), df["input_length"].to_list(), strict=True):
        blocks = ids[: n // 512]
        h = 0
        while h < len(blocks) and blocks[h] in cache:
            h += 1
        for b in blocks:
            if b in cache:
                cache.move_to_end(b)
            else:
                cache[b] = None
                if len(cache) > capacity_blocks:
                    cache.popitem(last=False)
        hits.append(h * 512)
    return hits


@pytest.mark.parametrize("trace", ["mooncake_fast25_conversation_trace.jsonl", "mooncake_fast25_synthetic_trace.jsonl"])
@pytest.mark.parametrize("capacity_blocks", [64, 512])
def test_pure_replay_equals_independent_lru(traces_dir, trace, capacity_blocks):
    df = load_trace(traces_dir / trace)
    cluster = ClusterSpec(pods=1, gpu_tokens=capacity_blocks * 512, cpu_tokens=0, l2_tokens=0)
    result = replay(df, cluster, Knobs(chunk_tokens=512))
    expected = reference_prefix_lru(df, capacity_blocks)
    assert result.requests["gpu_hit_tokens"].to_list() == expected
    s = result.summary()
    assert s["hit_ratio"] == pytest.approx(sum(expected) / df["input_length"].sum())
    assert s["tiers"]["cpu"]["hit_tokens"] == s["tiers"]["l2"]["hit_tokens"] == 0


def test_infinite_cache_hit_ratio_is_the_workload_overlap(traces_dir):
    df = load_trace(traces_dir / "mooncake_fast25_synthetic_trace.jsonl")
    r = replay(df, ClusterSpec(pods=1, gpu_tokens=0, cpu_tokens=0, l2_tokens=50_000 * 512), Knobs(chunk_tokens=512))
    s = r.summary()
    assert s["hit_ratio"] == pytest.approx(s["overlap"])
    # README: 0.6512 of tokens hit with an infinite cache (it also counts partial last blocks)
    assert 0.62 < s["overlap"] < 0.6512


def test_summary_contract_and_determinism():
    df = synthetic("shift", seed=5, duration_s=120)
    cl = ClusterSpec(pods=3)
    k = Knobs(router="prefixaware", l2_eviction="s3fifo")
    a, b = replay(df, cl, k), replay(df, cl, k)
    assert a.requests.equals(b.requests)
    s = a.summary()
    for key in ("hit_ratio", "ttft_p50_s", "ttft_p95_s", "ttft_p99_s", "l2_bytes_read", "requests", "miss", "overlap"):
        assert key in s
    for tier in ("gpu", "cpu", "l2"):
        assert set(s["tiers"][tier]) >= {"lookup_tokens", "hit_tokens", "evictions"}
    assert s["requests"] == df.height
    assert s["l2_bytes_read"] == a.requests["l2_hit_tokens"].sum() * 131072
    cols = set(a.requests.columns)
    assert {"pod", "prompt_tokens", "gpu_hit_tokens", "cpu_hit_tokens", "l2_hit_tokens", "computed_tokens",
            "queue_delay_s", "ttft_s", "cold_tokens", "capacity_tokens", "routing_tokens", "phase",
            "session_id", "timestamp_ms"} <= cols
    tl = a.timeline(buckets=10)
    assert tl.height <= 11 and tl["hit_ratio"].drop_nulls().is_between(0, 1).all()


def test_stream_cache_replays_equal_fresh_replays():
    """Trials sharing one StreamCache (as a search's evaluator does) give every fresh replay's
    result, whichever chunk size, router and path (compiled kernel, general engine) comes first."""
    df = synthetic("rag", seed=3, duration_s=60)
    cl = ClusterSpec(pods=3, cpu_tokens=8192, l2_tokens=400_000)
    streams = StreamCache()
    trials = [Knobs(chunk_tokens=256), Knobs(chunk_tokens=128, router="roundrobin"),
              Knobs(chunk_tokens=256, router="kvaware", cpu_eviction="lfu"), Knobs(chunk_tokens=128)]
    for k in trials:
        shared, fresh = replay(df, cl, k, streams=streams), replay(df, cl, k)
        assert shared.requests.equals(fresh.requests), k
        assert (shared.evictions, shared.l2_counters, shared.truth) == (fresh.evictions, fresh.l2_counters, fresh.truth)
    assert (streams.misses, streams.hits) == (2, 2)  # chunk hashes once per chunk size
    other = df.head(df.height // 2)  # another frame starts afresh
    assert replay(other, cl, trials[0], streams=streams).requests.equals(replay(other, cl, trials[0]).requests)
    assert (streams.misses, streams.hits) == (3, 2)


def test_replay_matches_incremental_submit():
    df = synthetic("rag", seed=9, duration_s=60)
    cl, k = ClusterSpec(pods=2, cpu_tokens=8192, l2_tokens=200_000), Knobs(router="kvaware", cpu_eviction="lfu")
    batch = replay(df, cl, k)
    twin = Twin(cl, k)
    outs = [twin.submit(r) for r in iter_requests(df)]
    assert batch.requests["ttft_s"].to_list() == [o.ttft_s for o in outs]
    assert batch.requests["capacity_tokens"].to_list() == [o.capacity_tokens for o in outs]
    assert batch.requests["cold_tokens"].to_list() == [o.cold_tokens for o in outs]


@st.composite
def workloads(draw):
    ids = PrefixIds()
    prompts: list[tuple] = []
    reqs = []
    for i in range(draw(st.integers(1, 25))):
        if prompts and draw(st.booleans()):
            base = draw(st.sampled_from(prompts))
            base = base[: draw(st.integers(0, len(base)))]
        else:
            base = ()
        symbols = base + tuple(draw(st.lists(st.integers(0, 3), min_size=0 if base else 1, max_size=4)))
        if not symbols:
            symbols = (0,)
        prompts.append(symbols)
        n = 512 * len(symbols) - draw(st.integers(0, 511))
        reqs.append(req(i * 700, ids.blocks(symbols), input_length=n,
                        session=draw(st.none() | st.integers(0, 3))))
    return reqs


caps = st.sampled_from([0, 256, 1024, 2048, 4096])


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(reqs=workloads(), pods=st.integers(1, 3), gpu=caps, cpu=caps, l2=caps,
       chunk=st.sampled_from([c for c in CHUNK_TOKEN_CHOICES if c <= 1024]),
       cpu_ev=st.sampled_from(TWIN_CPU_EVICTIONS), l2_ev=st.sampled_from(L2_EVICTION_CHOICES),
       router=st.sampled_from(TWIN_ROUTERS), low=st.sampled_from([0.5, 1.0]))
def test_invariants(reqs, pods, gpu, cpu, l2, chunk, cpu_ev, l2_ev, router, low):
    cl = ClusterSpec(pods=pods, gpu_tokens=gpu, cpu_tokens=cpu, l2_tokens=l2)
    k = Knobs(chunk_tokens=chunk, cpu_eviction=cpu_ev, l2_eviction=l2_ev, router=router, l2_low_watermark=low)
    twin = Twin(cl, k)
    for r in reqs:
        o = twin.submit(r)
        hit = o.gpu_hit_tokens + o.cpu_hit_tokens + o.l2_hit_tokens
        assert o.computed_tokens + hit == o.prompt_tokens
        assert hit + o.cold_tokens + o.capacity_tokens + o.routing_tokens + o.tail_tokens == o.prompt_tokens
        assert hit <= o.prompt_tokens - o.tail_tokens
        assert o.ttft_s > 0 and o.queue_delay_s >= 0
        for p in range(pods):
            assert len(twin.resident(p, "GPU")) <= gpu // chunk
            assert len(twin.resident(p, "CPU")) <= cpu // chunk
        assert len(twin.resident(None, "L2")) <= l2 // chunk
    result = replay(frame(reqs), cl, k)
    s = result.summary()
    for tier in ("gpu", "cpu", "l2"):
        assert 0 <= s["tiers"][tier]["hit_tokens"] <= s["tiers"][tier]["lookup_tokens"]
    again = replay(frame(reqs), cl, k)
    assert result.requests.equals(again.requests)
