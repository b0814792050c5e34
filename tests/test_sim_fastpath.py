"""The twin's fast paths give exactly the results of the plain ones.

- LRU/FIFO (a set plus a recency log with stale entries) against a textbook OrderedDict
  implementation, on random scripts of inserts (with repeated keys), bulk inserts of fresh
  keys, hits and shrinks: same victims in the same order, same resident order.
- Batch `replay` (dense chunk ids, fresh-suffix bulk stores, bounded router search, and the
  written-out loop of `simulator.fastloop` where it applies) against request-by-request
  `Twin.submit` (real hashes, no workload knowledge), for every CPU/L2 policy and router: same
  per-request rows and the same fleet counters.
- The compiled kernel (`simulator.kernel`) and `simulator.fastloop` against the general engine
  on the same dense ids, for disabled tiers, one pod, watermarks and the L2 prompt threshold;
  the kernel leaves the twin's state as the general engine does.
"""
from __future__ import annotations

from collections import OrderedDict

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from contracts.knobs import Knobs
from simulator import fastloop, kernel
from simulator.cluster import ClusterSpec
from simulator.policies import FIFO, LRU
from simulator.replay import RESULT_SCHEMA, replay, workload_chunks
from simulator.twin import Twin
from simulator.workload import iter_requests, synthetic


class ReferenceLRU:
    """One key at a time on an OrderedDict (the bulk all-new insert keeps dict.update's order)."""

    def __init__(self, capacity: int, fifo: bool) -> None:
        self.d: OrderedDict[int, None] = OrderedDict()
        self.cap, self.fifo = capacity, fifo

    def touch(self, keys: list[int]) -> None:
        if not self.fifo:
            for k in keys:
                self.d.move_to_end(k)

    def insert(self, keys: list[int]) -> list[int]:
        d = self.d
        if d.keys().isdisjoint(keys):
            d.update(dict.fromkeys(keys))
            victims = []
            while len(d) > self.cap:
                victims.append(d.popitem(last=False)[0])
            return victims
        victims = []
        for k in keys:
            if k in d:
                if not self.fifo:
                    d.move_to_end(k)
            else:
                if len(d) >= self.cap:
                    victims.append(d.popitem(last=False)[0])
                d[k] = None
        return victims

    def shrink(self, n: int) -> list[int]:
        victims = []
        while len(self.d) > n:
            victims.append(self.d.popitem(last=False)[0])
        return victims


steps = st.lists(
    st.tuples(
        st.sampled_from(["insert", "fresh", "touch", "shrink"]),
        st.lists(st.integers(0, 12), max_size=7),  # repeats allowed: a key may appear twice in a batch
        st.integers(1, 6),
    ),
    max_size=80,
)


@pytest.mark.parametrize("cls", [LRU, FIFO])
@settings(max_examples=60, deadline=None)
@given(capacity=st.integers(1, 6), script=steps)
def test_lru_and_fifo_match_an_ordereddict(cls, capacity, script):
    p, ref = cls(capacity), ReferenceLRU(capacity, fifo=cls is FIFO)
    next_fresh = 1000
    for op, keys, n in script:
        if op == "insert":
            assert p.insert_many(keys) == ref.insert(keys)
        elif op == "fresh":  # old keys (may be resident) then n never-seen keys, counted only
            new = list(range(next_fresh, next_fresh + n))
            next_fresh += n
            assert p.insert_count(keys + new, n) == len(ref.insert(keys)) + len(ref.insert(new))
        elif op == "touch":
            hits = [k for k in keys if k in ref.d]
            p.touch_many(hits)
            ref.touch(hits)
        else:
            assert p.shrink_to(n) == ref.shrink(n)
        assert p.keys_in_order() == list(ref.d)
        assert len(p) == len(ref.d) and all(k in p for k in ref.d)


big_steps = st.lists(  # larger tiers, few hits: LRU drops windows holding a few stale keys in bulk
    st.tuples(
        st.sampled_from(["fresh", "fresh", "fresh", "touch", "insert"]),
        st.lists(st.integers(0, 60), max_size=5),
        st.integers(1, 30),
    ),
    max_size=60,
)


@settings(max_examples=60, deadline=None)
@given(capacity=st.integers(8, 48), script=big_steps)
def test_lru_bulk_drop_with_stale_entries_matches_an_ordereddict(capacity, script):
    p, ref = LRU(capacity), ReferenceLRU(capacity, fifo=False)
    p.insert_many(list(range(capacity)))  # full from the start: every later store evicts
    ref.insert(list(range(capacity)))
    next_fresh = 1000
    for op, keys, n in script:
        if op == "fresh":
            new = list(range(next_fresh, next_fresh + n))
            next_fresh += n
            assert p.insert_count(new, n) == len(ref.insert(new))
        elif op == "touch":
            hits = [k for k in ref.d if k in set(keys) or k % 7 == n % 7][:3]
            p.touch_many(hits)
            ref.touch(hits)
        else:
            assert p.insert_many(keys) == ref.insert(keys)
        assert p.keys_in_order() == list(ref.d)
        assert len(p) == len(ref.d) and all(k in p for k in ref.d)


def _incremental(df, cluster, knobs):
    twin = Twin(cluster, knobs)
    rows = [twin.submit(r) for r in iter_requests(df)]
    return twin, [(o.pod_index, o.time_s, o.prompt_tokens, o.gpu_hit_tokens, o.cpu_hit_tokens, o.l2_hit_tokens,
                   o.computed_tokens, o.queue_delay_s, o.ttft_s, o.l2_read_s, o.l2_write_s, o.cold_tokens,
                   o.capacity_tokens, o.routing_tokens, o.tail_tokens) for o in rows]


COMBOS = [  # every router and every CPU / L2 policy at least once
    ("prefixaware", "lru", "lru"),
    ("prefixaware", "fifo", "s3fifo"),
    ("kvaware", "lfu", "arc"),
    ("kvaware", "lru", "fifo"),
    ("session", "lru", "lfu"),
    ("roundrobin", "fifo", "lru"),
    ("session", "fifo", "fifo"),
    ("roundrobin", "lru", "fifo"),
    ("prefixaware", "fifo", "fifo"),
]


@pytest.mark.parametrize(("router", "cpu_ev", "l2_ev"), COMBOS)
def test_batch_replay_equals_incremental_submit(router, cpu_ev, l2_ev):
    df = synthetic("shift", seed=4, duration_s=90, rate_rps=4.0)
    cluster = ClusterSpec(pods=3, gpu_tokens=24 * 512, cpu_tokens=16 * 512, l2_tokens=120 * 512)
    knobs = Knobs(chunk_tokens=256, router=router, cpu_eviction=cpu_ev, l2_eviction=l2_ev,
                  l2_high_watermark=0.9, l2_low_watermark=0.7, l2_min_prompt_tokens=1024)
    batch = replay(df, cluster, knobs)
    twin, rows = _incremental(df, cluster, knobs)
    assert batch.requests.select(list(RESULT_SCHEMA)).rows() == rows
    assert batch.evictions == twin.evictions()
    assert batch.l2_counters == twin.l2_counters()
    assert batch.truth == twin.miss_attribution()
    ev = batch.evictions  # the workload exercises every tier
    assert ev["gpu"] > 0 and ev["cpu"] > 0 and ev["l2"] > 0


def _outputs(res):
    return res.requests.rows(), res.evictions, res.l2_counters, res.truth, res.summary()["tiers"]


FAST_SHAPES = [  # (pods, capacities, knob changes): every one runs through fastloop.run
    (3, {}, {}),
    (1, {}, {"chunk_tokens": 512}),
    (3, {"cpu_tokens": 0}, {"router": "roundrobin"}),
    (3, {"l2_tokens": 0}, {"cpu_eviction": "fifo"}),
    (2, {"gpu_tokens": 0}, {"router": "session"}),
    (3, {"gpu_tokens": 0, "cpu_tokens": 0}, {"l2_eviction": "fifo"}),
    (3, {"l2_tokens": 30 * 512}, {"l2_high_watermark": 0.8, "l2_low_watermark": 0.5, "chunk_tokens": 128}),
    (4, {}, {"l2_min_prompt_tokens": 3000, "chunk_tokens": 1024}),
]


@pytest.mark.parametrize(("pods", "caps", "changes"), FAST_SHAPES)
def test_fast_loops_equal_general_engine(pods, caps, changes, monkeypatch):
    """The compiled kernel, the written-out Python loop and `Twin._process` give the same results."""
    df = synthetic("shift", seed=7, duration_s=60, rate_rps=5.0)
    cluster = ClusterSpec(pods=pods, **{"gpu_tokens": 24 * 512, "cpu_tokens": 16 * 512, "l2_tokens": 120 * 512,
                                        **caps})
    knobs = Knobs(chunk_tokens=256, router="prefixaware").replace(**changes)
    calls = []
    real_kernel, real_loop = kernel.run, fastloop.run
    monkeypatch.setattr(kernel, "run", lambda *a, **kw: calls.append("kernel") or real_kernel(*a, **kw))
    monkeypatch.setattr(fastloop, "run", lambda *a, **kw: calls.append("loop") or real_loop(*a, **kw))
    compiled = replay(df, cluster, knobs)
    assert calls == ["kernel"]
    monkeypatch.setattr(kernel, "supports", lambda twin: False)
    loop = replay(df, cluster, knobs)
    assert calls == ["kernel", "loop"]
    monkeypatch.setattr(fastloop, "supports", lambda twin: False)
    general = replay(df, cluster, knobs)
    assert calls == ["kernel", "loop"]
    assert _outputs(compiled) == _outputs(general)
    assert _outputs(loop) == _outputs(general)


def test_kernel_leaves_the_twin_as_the_general_engine_does():
    """After a batch replay the compiled kernel's twin holds what `Twin._process` leaves: tiers in
    recency order, router memory, requests in flight, pod queues (progress reported as before)."""
    df = synthetic("shift", seed=3, duration_s=60, rate_rps=5.0)
    cluster = ClusterSpec(pods=3, gpu_tokens=24 * 512, cpu_tokens=16 * 512, l2_tokens=120 * 512)
    knobs = Knobs(chunk_tokens=256, router="prefixaware")
    frame = df.sort("timestamp_ms")
    flat, offsets, cold, fresh = workload_chunks(frame, 256, dense=True)
    args = ([ms / 1000.0 for ms in frame["timestamp_ms"].to_list()], frame["input_length"].to_list(),
            frame["output_length"].to_list())
    compiled, general = Twin(cluster, knobs), Twin(cluster, knobs)
    assert kernel.supports(compiled)
    seen: list[tuple[int, int]] = []
    kernel.run(compiled, *args, flat, offsets, cold, fresh, frame["session_id"].to_list(),
               lambda i, n: seen.append((i, n)))
    for i in range(frame.height):
        general._process(args[0][i], args[1][i], args[2][i], flat[offsets[i]:offsets[i + 1]].tolist(), None,
                         int(cold[i]), int(fresh[i]))
    step = max(frame.height // 200, 1)
    assert seen == [(i, frame.height) for i in range(0, frame.height, step)]
    assert not kernel.supports(compiled)  # it has served: the compiled loop starts only from scratch
    for p, q in zip(compiled._pods, general._pods, strict=True):
        assert p.gpu.keys_in_order() == q.gpu.keys_in_order() and p.cpu.keys_in_order() == q.cpu.keys_in_order()
        assert p.free_at == q.free_at
    assert compiled._l2.keys_in_order() == general._l2.keys_in_order()
    assert compiled._router._seen == general._router._seen and compiled._router._last == general._router._last
    assert sorted(compiled._heap) == sorted(general._heap) and compiled._loads == general._loads
    assert compiled._now == general._now and compiled.evictions() == general.evictions()
    assert compiled.l2_counters() == general.l2_counters()


def test_fast_loop_declines_what_it_does_not_model():
    cluster = ClusterSpec(pods=2, gpu_tokens=4096, cpu_tokens=4096, l2_tokens=8192)
    assert fastloop.supports(Twin(cluster, Knobs(router="prefixaware")))
    for knobs in (Knobs(router="kvaware"), Knobs(cpu_eviction="lfu"), Knobs(l2_eviction="s3fifo"),
                  Knobs(l2_eviction="arc"), Knobs(l2_eviction="lfu")):
        assert not fastloop.supports(Twin(cluster, knobs))
    assert not fastloop.supports(Twin(cluster, Knobs(), event_sink=lambda event: None))
