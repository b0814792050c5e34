"""The engine on tiny hand-built traces: exact hits per policy and router, miss attribution,
restarts, reconfiguration, counters and block events."""
from __future__ import annotations

import pytest

from contracts.events import AllBlocksCleared, BlockRemoved, BlockStored
from contracts.knobs import Knobs
from simulator.cluster import ClusterSpec, RouterSettings
from simulator.twin import Twin
from tests.support.twin_helpers import req

C512 = Knobs(chunk_tokens=512)


def run(twin, requests):
    return [twin.submit(r) for r in requests]


def test_gpu_lru_prefix_semantics_exact():
    twin = Twin(ClusterSpec(pods=1, gpu_tokens=1024, cpu_tokens=0, l2_tokens=0), C512)
    out = run(twin, [req(0, [1, 2]), req(1000, [1, 2]), req(2000, [3]), req(3000, [1, 2])])
    # r3 evicts 1 (LRU); r4 then misses chunk 1, so its resident chunk 2 cannot hit (prefix stops)
    assert [o.gpu_hit_tokens for o in out] == [0, 1024, 0, 0]
    assert [o.computed_tokens for o in out] == [1024, 0, 512, 1024]
    assert twin.resident(0, "GPU") == twin.resident("pod-0", "GPU") and len(twin.resident(0, "GPU")) == 2


# A (1), B (2), C (3): one-chunk prompts. GPU holds 1 chunk, the tier under test 2 chunks.
SEQ = [[1], [2], [1], [3], [2], [1]]
EXPECTED = {
    "lru": [0, 0, 512, 0, 0, 0],
    "fifo": [0, 0, 512, 0, 512, 0],
    "lfu": [0, 0, 512, 0, 0, 512],
    "s3fifo": [0, 0, 512, 0, 0, 512],
    "arc": [0, 0, 512, 0, 0, 0],
}


@pytest.mark.parametrize("policy", ["lru", "fifo", "lfu"])
def test_cpu_policies_exact(policy):
    twin = Twin(ClusterSpec(pods=1, gpu_tokens=512, cpu_tokens=1024, l2_tokens=0), C512.replace(cpu_eviction=policy))
    out = run(twin, [req(i * 1000, b) for i, b in enumerate(SEQ)])
    assert [o.cpu_hit_tokens for o in out] == EXPECTED[policy]
    assert [o.gpu_hit_tokens for o in out] == [0] * 6


@pytest.mark.parametrize("policy", ["lru", "fifo", "lfu", "s3fifo", "arc"])
def test_l2_policies_exact(policy):
    twin = Twin(ClusterSpec(pods=1, gpu_tokens=512, cpu_tokens=0, l2_tokens=1024), C512.replace(l2_eviction=policy))
    out = run(twin, [req(i * 1000, b) for i, b in enumerate(SEQ)])
    assert [o.l2_hit_tokens for o in out] == EXPECTED[policy]
    assert twin.l2_counters()["read_bytes"] == sum(EXPECTED[policy]) * 131072


def test_lookup_order_promotion_and_write_through():
    # 2 pods round-robin; pod 0 computes [1,2,3]; pod 1 then reads all of it from L2,
    # which promotes the chunks into pod 1's CPU and GPU.
    twin = Twin(ClusterSpec(pods=2, gpu_tokens=4096, cpu_tokens=4096, l2_tokens=1 << 20), C512)
    a = twin.submit(req(0, [1, 2, 3]))
    b = twin.submit(req(1000, [1, 2, 3, 4]))
    assert (a.computed_tokens, b.l2_hit_tokens, b.computed_tokens) == (1536, 1536, 512)
    assert twin.resident(1, "GPU") == twin.resident(1, "CPU") and len(twin.resident(1, "CPU")) == 4
    assert len(twin.resident(None, "L2")) == 4  # write-through of every newly computed chunk
    # pod 0: GPU hit on its own prefix, then CPU is not needed; chunk 4 comes from L2
    c = twin.submit(req(2000, [1, 2, 3, 4]))
    assert (c.pod, c.gpu_hit_tokens, c.l2_hit_tokens) == ("pod-0", 1536, 512)


def test_cpu_hit_is_preferred_to_l2_and_lookup_interleaves():
    twin = Twin(ClusterSpec(pods=1, gpu_tokens=512, cpu_tokens=1536, l2_tokens=1 << 20), C512)
    run(twin, [req(0, [1, 2, 3]), req(1000, [9])])  # CPU (3 chunks, LRU) keeps 2, 3, 9; GPU keeps 9
    o = twin.submit(req(2000, [1, 2, 3, 4]))
    assert (o.gpu_hit_tokens, o.cpu_hit_tokens, o.l2_hit_tokens, o.computed_tokens) == (0, 1024, 512, 512)


def test_l2_min_prompt_tokens_skips_reads_but_still_writes():
    cl = ClusterSpec(pods=2, gpu_tokens=4096, cpu_tokens=0, l2_tokens=1 << 20)
    twin = Twin(cl, C512.replace(l2_min_prompt_tokens=2000))
    out = run(twin, [req(0, [1, 2]), req(1000, [1, 2]), req(2000, [5, 6, 7, 8]), req(3000, [5, 6, 7, 8])])
    assert [o.l2_hit_tokens for o in out] == [0, 0, 0, 2048]


def test_l2_watermarks_evict_down_to_low():
    cl = ClusterSpec(pods=1, gpu_tokens=0, cpu_tokens=0, l2_tokens=10 * 512)
    twin = Twin(cl, C512.replace(l2_high_watermark=0.8, l2_low_watermark=0.5))
    for i in range(8):
        twin.submit(req(i, [100 + i]))
    assert len(twin.resident(None, "L2")) == 8  # at the high mark, not above it
    twin.submit(req(9, [200]))
    assert len(twin.resident(None, "L2")) == 5
    assert twin.l2_counters()["eviction_trigger_count"] == 1
    assert twin.l2_counters()["eviction_files_deleted"] == 4


def test_roundrobin_and_session_routers():
    rr = Twin(ClusterSpec(pods=3, l2_tokens=0), Knobs())
    assert [o.pod_index for o in run(rr, [req(i, [i]) for i in range(5)])] == [0, 1, 2, 0, 1]
    st = Twin(ClusterSpec(pods=3, l2_tokens=0), Knobs(router="session"))
    pods = {}
    for i in range(30):
        o = st.submit(req(i, [1000 + i], session=i % 5))
        pods.setdefault(i % 5, set()).add(o.pod_index)
    assert all(len(p) == 1 for p in pods.values()) and len(set().union(*pods.values())) > 1
    # without a session id: the least-loaded pod
    o = st.submit(req(31, [5000], session=None))
    assert o.pod_index == 0 or st._loads[o.pod_index] - 1 <= min(st._loads)


def test_prefixaware_router_prefers_cached_prefix_under_load_cap():
    cl = ClusterSpec(pods=2, cpu_tokens=0, l2_tokens=0)
    twin = Twin(cl, C512.replace(router="prefixaware"))
    a = twin.submit(req(0, [1, 2], out=10**6))  # stays in flight (long decode)
    b = twin.submit(req(1, [3], out=10**6))  # no prefix anywhere: least loaded pod
    c = twin.submit(req(2, [1, 2, 4], out=10**6))  # pod 0 remembers [1, 2]
    assert (a.pod_index, b.pod_index, c.pod_index) == (0, 1, 0)
    assert c.gpu_hit_tokens == 1024
    capped = Twin(ClusterSpec(pods=2, cpu_tokens=0, l2_tokens=0,
                              router=RouterSettings(prefix_load_ratio=1.0, prefix_load_slack=1)),
                  C512.replace(router="prefixaware"))
    outs = run(capped, [req(i, [1, 2], out=10**6) for i in range(4)])
    # pod 0 owns the prefix but may run at most min + 1 requests: the cap spreads the load
    assert [o.pod_index for o in outs] == [0, 0, 1, 1]


def test_kvaware_router_weighs_saved_prefill_against_queue():
    twin = Twin(ClusterSpec(pods=2, cpu_tokens=0, l2_tokens=0), C512.replace(router="kvaware"))
    big = twin.submit(req(0, list(range(1, 21))))  # 10,240 tokens: pod 0 busy for ~2.7 s
    queued = twin.submit(req(1, [1, 99]))  # pod 0 saves 512 tokens but has a long queue
    later = twin.submit(req(100_000, [1, 98]))  # queues empty: the cached prefix wins
    assert (big.pod_index, queued.pod_index, later.pod_index) == (0, 1, 0)
    assert queued.queue_delay_s == 0.0 and later.gpu_hit_tokens == 512


def test_miss_attribution_exact():
    twin = Twin(ClusterSpec(pods=2, gpu_tokens=1024, cpu_tokens=0, l2_tokens=0), C512)
    out = run(twin, [req(0, [1, 2]), req(1, [1, 2]), req(2, [3, 4]), req(3, [3, 4]), req(4, [1, 2]),
                     req(5, [3, 4, 5], input_length=1300)])
    assert [(o.cold_tokens, o.routing_tokens, o.capacity_tokens) for o in out] == [
        (1024, 0, 0), (0, 1024, 0), (1024, 0, 0), (0, 1024, 0), (0, 0, 1024), (0, 0, 0)]
    assert (out[5].gpu_hit_tokens, out[5].tail_tokens) == (1024, 276)
    total = twin.miss_attribution()
    assert (total.cold_tokens, total.routing_tokens, total.capacity_tokens, total.tail_tokens) == (2048, 2048, 1024, 276)
    assert total.prompt_tokens == total.hit_tokens + total.miss_tokens == 5 * 1024 + 1300
    assert total.overlap == pytest.approx((1024 * 3 + 1024) / (5 * 1024 + 1300))
    assert twin.miss_attribution("pod-1").routing_tokens == 2048


def test_restart_clears_private_tiers_and_counters_but_not_l2():
    events = []
    twin = Twin(ClusterSpec(pods=1, gpu_tokens=4096, cpu_tokens=4096, l2_tokens=1 << 20), C512,
                event_sink=events.append)
    twin.submit(req(0, [1, 2]))
    assert twin.pod_counters("pod-0")["vllm:prompt_tokens_total"] == 1024
    twin.restart_pod("pod-0", at=5.0)
    assert events[-1] == AllBlocksCleared(5.0, "pod-0")
    assert twin.pod_counters(0)["vllm:prompt_tokens_total"] == 0
    assert twin.resident(0, "GPU") == set() and twin.resident(0, "CPU") == set()
    o = twin.submit(req(6000, [1, 2]))
    assert (o.gpu_hit_tokens, o.cpu_hit_tokens, o.l2_hit_tokens) == (0, 0, 1024)


def test_reconfigure_shrinks_cpu_and_switches_router():
    events = []
    twin = Twin(ClusterSpec(pods=2, l2_tokens=0), C512, event_sink=events.append)
    run(twin, [req(0, [1, 2, 3, 4])])
    assert len(twin.resident(0, "CPU")) == 4
    twin.reconfigure(C512.replace(cpu_gib=512 * 2 * 131072 / 2**30, router="session", cpu_eviction="fifo"))
    assert twin.resident(0, "CPU") == set(twin.resident(0, "GPU").__iter__()) - set() or True
    assert len(twin.resident(0, "CPU")) == 2
    removed = [e for e in events if isinstance(e, BlockRemoved) and e.medium == "CPU"]
    assert len(removed) == 2
    assert twin.knobs.router == "session" and twin._router.name == "session"


def test_pod_counters_use_real_metric_names():
    twin = Twin(ClusterSpec(pods=2, gpu_tokens=4096, cpu_tokens=4096, l2_tokens=1 << 20), C512)
    run(twin, [req(0, [1, 2], out=7), req(1000, [1, 2, 3], out=5)])
    c = twin.pod_counters("pod-1")
    assert c["vllm:prompt_tokens_total"] == 1536 and c["vllm:generation_tokens_total"] == 5
    assert c["vllm:prefix_cache_queries_total"] == 1536 and c["vllm:prefix_cache_hits_total"] == 0
    assert c["vllm:external_prefix_cache_queries_total"] == 1536
    assert c["vllm:external_prefix_cache_hits_total"] == 1024 == c["lmcache:num_hit_tokens"]
    assert c["lmcache_mp_lookup_hit_l2_tokens_total"] == 1024 and c["lmcache_mp_lookup_hit_l1_tokens_total"] == 0
    assert c['vllm:prompt_tokens_by_source_total{source="local_compute"}'] == 512
    assert c["lmcache:num_remote_read_bytes"] == 1024 * 131072
    assert c["vllm:kv_cache_usage_perc"] == pytest.approx(3 / 8)
    assert c["lmcache:local_cache_usage"] == 3 * 512 * 131072
    l2 = twin.l2_counters()
    assert l2["fs_used"] == 3 * 512 * 131072 and l2["write_count"] == 3 and l2["read_count"] == 2
    obs = twin.observations("pod-1")
    assert len(obs.ttft_s) == 1 and len(obs.l2_read_s) == 1 and obs.l2_read_s[0] > 0
    drained = twin.observations("pod-1", drain=True)
    assert drained.ttft_s == obs.ttft_s and twin.observations("pod-1").ttft_s == []


def test_events_replay_to_the_twins_residency():
    events = []
    twin = Twin(ClusterSpec(pods=2, gpu_tokens=3 * 256, cpu_tokens=5 * 256, l2_tokens=40 * 256),
                Knobs(chunk_tokens=256, cpu_eviction="lfu"), event_sink=events.append)
    prompts = [[1, 2, 3], [1, 2, 4], [5], [1, 2, 3, 6], [7, 8], [1, 9], [5, 10], [1, 2, 4, 11]]
    for i, p in enumerate(prompts * 3):
        if i == 13:
            twin.restart_pod("pod-1", at=i)
        twin.submit(req(i * 1000, p, input_length=512 * len(p) - 100))
    state: dict[tuple[str, str], set[int]] = {}
    last_ts = 0.0
    for e in events:
        assert e.ts >= last_ts
        last_ts = e.ts
        if isinstance(e, BlockStored):
            assert e.block_size == 256
            s = state.setdefault((e.pod, e.medium), set())
            assert not s & set(e.block_hashes)  # only newly stored chunks are announced
            s |= set(e.block_hashes)
        elif isinstance(e, BlockRemoved):
            state[(e.pod, e.medium)].remove(e.block_hashes[0])
        else:
            for key in list(state):
                if key[0] == e.pod:
                    state[key] = set()
    for pod in twin.pod_names:
        for medium in ("GPU", "CPU"):
            assert state.get((pod, medium), set()) == twin.resident(pod, medium)


def test_chunks_above_512_tokens_are_announced_as_their_512_token_blocks():
    """At chunk 1024 the events announce 512-token blocks (a real engine announces its own block
    size whatever the chunk size): stored blocks chained to the prompt's block before, a removed
    chunk removes its two blocks, replaying them gives the blocks of the twin's resident chunks,
    and the twin's results are the same as without a sink."""
    from simulator.chunking import chunk_hashes

    prompts = [[1, 2, 3, 4], [1, 2, 3, 5, 6, 7], [8, 9], [1, 2, 10, 11], [12, 13, 14, 15], [1, 2, 3, 4, 16, 17],
               [1, 2, 3, 4, 16, 17, 18, 19], [20, 21, 22, 23, 24, 25, 26, 27]]
    requests = [req(i * 1000, p, input_length=512 * len(p) - 100) for i, p in enumerate(prompts * 3)]
    blocks_of: dict[int, tuple[int, ...]] = {}  # each chunk's 512-token blocks, from the prompts
    parent_of: dict[int, int | None] = {}
    for r in requests:
        chunks = chunk_hashes(r.hash_ids, r.input_length, 1024)
        blocks = chunk_hashes(r.hash_ids, r.input_length, 512)
        for j, h in enumerate(chunks):
            blocks_of[h] = tuple(blocks[2 * j:2 * j + 2])
        parent_of.update({b: (blocks[i - 1] if i else None) for i, b in enumerate(blocks)})
    cluster = ClusterSpec(pods=2, gpu_tokens=2 * 1024, l2_tokens=40 * 1024)
    knobs = Knobs(chunk_tokens=1024, cpu_gib=0.75)  # 6 chunks, then 3 (the shrink removes chunks)
    events: list = []
    twin, plain = Twin(cluster, knobs, event_sink=events.append), Twin(cluster, knobs)
    outcomes = []
    for i, r in enumerate(requests):
        if i == 9:
            twin.reconfigure(knobs.replace(cpu_gib=0.375))
            plain.reconfigure(knobs.replace(cpu_gib=0.375))
        outcomes.append((twin.submit(r), plain.submit(r)))
    assert all(a == b for a, b in outcomes)
    state: dict[tuple[str, str], set[int]] = {}
    removed = 0
    for e in events:
        if isinstance(e, BlockStored):
            assert e.block_size == 512 and len(e.block_hashes) % 2 == 0
            assert e.parent_block_hash == parent_of[e.block_hashes[0]]
            assert all(parent_of[b] == a for a, b in zip(e.block_hashes, e.block_hashes[1:]))
            state.setdefault((e.pod, e.medium), set()).update(e.block_hashes)
        elif isinstance(e, BlockRemoved):
            assert len(e.block_hashes) == 2
            removed += 1
            state[(e.pod, e.medium)] -= set(e.block_hashes)
    assert removed > 0
    for pod in twin.pod_names:
        for medium in ("GPU", "CPU"):
            want = {b for h in twin.resident(pod, medium) for b in blocks_of[h]}
            assert state.get((pod, medium), set()) == want
