"""The drift detector's `reuse_ratio` under sharding: two replicas each follow their pods' KV
events (the twin's streams, with the twin's own vLLM counters), and the leader's merged reading
equals the unsharded agent's within the bound the sketches state; one shard's own view is off by
more, so the merge is what makes the signal right. Windows that start mid-run are included: a block
first seen on the other shard before the window must not count as cold."""
from __future__ import annotations

import json

import pytest

from agent.collect.shard import shard_of
from agent.kvevents.fleet import BlockSketches, state_json
from agent.kvevents.fleet_overlap import FleetOverlap, merge_overlap, merge_overlap_bounded, overlap_state
from agent.kvevents.signals import EngineId, KvSignals
from agent.kvevents.wire import Batch, Cleared, Removed, Stored
from agent.kvevents.workload import PodCounters
from contracts import events as ev
from contracts.fleet import PartialFleetError
from contracts.knobs import Knobs
from simulator.cluster import ClusterSpec
from simulator.synthetic import synthetic
from simulator.twin import Twin

LOCAL_COMPUTE = 'vllm:prompt_tokens_by_source_total{source="local_compute"}'
PODS = [f"vllm-{i}" for i in range(6)]


class _Clock:
    now = 0.0

    def __call__(self) -> float:
        return self.now


def _wire(e: object) -> Stored | Removed | Cleared | None:
    if isinstance(e, ev.BlockStored):
        return Stored(list(e.block_hashes), e.parent_block_hash, e.block_size, e.medium, None)
    if isinstance(e, ev.BlockRemoved):
        return Removed(list(e.block_hashes), e.medium, None)
    if isinstance(e, ev.AllBlocksCleared):
        return Cleared()
    return None


def _run(preset: str, cluster: dict) -> tuple[KvSignals, list[KvSignals]]:
    """One unsharded index and two shards' indexes fed the same streams and counters."""
    clock = _Clock()
    whole = KvSignals(clock=clock)
    shards = [KvSignals(clock=clock) for _ in range(2)]
    for s in shards:
        s.blocks = BlockSketches(window_s=300.0, clock=clock)
    seq: dict[str, int] = {}

    def sink(e: object) -> None:
        w = _wire(e)
        if w is None:
            return
        pod = e.pod  # type: ignore[attr-defined]
        seq[pod] = seq.get(pod, -1) + 1
        batch = Batch(b"", seq[pod], e.ts, None, [w], {})  # type: ignore[attr-defined]
        whole.apply(EngineId(pod, "m"), batch)
        shards[shard_of(pod, 2)].apply(EngineId(pod, "m"), batch)

    twin = Twin(ClusterSpec(pods=len(PODS), pod_names=tuple(PODS), **cluster),
                Knobs(router="roundrobin", chunk_tokens=256), event_sink=sink)

    def scrape(ts: float) -> None:
        for p in PODS:
            c = twin.pod_counters(p)
            counters = PodCounters(c["vllm:prompt_tokens_total"], c[LOCAL_COMPUTE],
                                   c.get("vllm:external_prefix_cache_hits_total", 0.0))
            whole.observe_counters(p, "m", counters, ts)
            shards[shard_of(p, 2)].observe_counters(p, "m", counters, ts)

    scrape(0.0)
    rows = list(synthetic(preset, seed=3, duration_s=240).iter_rows(named=True))
    for i, row in enumerate(rows):
        if i % 50 == 0:  # the agent's periodic scrape
            scrape(row["timestamp_ms"] / 1000.0)
        twin.submit(row)
    clock.now = rows[-1]["timestamp_ms"] / 1000.0 + 1.0
    scrape(clock.now)
    return whole, shards


def _state(s: KvSignals, window_s: float) -> dict:
    """What a replica serves on /kv/sketch, through JSON as it travels."""
    assert s.blocks is not None
    return json.loads(state_json({**s.blocks.state(window_s),
                                  "overlap": overlap_state({"m": s.overlap("m", window_s)}, s.blocks)}))


@pytest.mark.parametrize(("preset", "cluster"), [
    ("sessions", {"gpu_tokens": 30_000, "cpu_tokens": 30_000, "l2_tokens": 100_000}),  # shared L2
    ("rag", {"gpu_tokens": 30_000, "cpu_tokens": 30_000, "l2_tokens": 0}),
], ids=["sessions-l2", "rag"])
def test_leader_reuse_ratio_from_two_shards_equals_the_unsharded_one_within_the_bound(preset, cluster):
    whole, shards = _run(preset, cluster)
    assert {shard_of(p, 2) for p in PODS} == {0, 1}
    for window_s in (1_000.0, 120.0, 60.0):  # the whole run, and windows that start mid-run
        want = whole.overlap("m", window_s)
        assert want is not None and 0.3 < want.ratio < 0.9
        got, bound = merge_overlap_bounded([_state(s, window_s) for s in shards])
        assert got is not None and got.prompt_tokens == pytest.approx(want.prompt_tokens)
        assert 0 < bound < 0.02, window_s
        assert abs(got.ratio - want.ratio) <= bound, (window_s, got.ratio, want.ratio, bound)
        assert got.tail_tokens == pytest.approx(want.tail_tokens, rel=1e-9)
        # one shard's own view is not the fleet's
        own = [s.overlap("m", window_s) for s in shards]
        assert max(abs(r.ratio - want.ratio) for r in own if r is not None) > bound, window_s


def test_fleet_overlap_reads_peers_and_refuses_a_partial_fleet():
    _, shards = _run("rag", {"gpu_tokens": 30_000, "cpu_tokens": 30_000, "l2_tokens": 0})
    window_s = 120.0
    served = {"http://shard-1:9400": state_json(_state(shards[1], window_s))}
    calls: list[str] = []

    def fetch(url: str, _timeout: float) -> bytes:
        calls.append(url)
        base = url.split("/kv/")[0]
        if base not in served:
            raise OSError("connection refused")
        return served[base]

    fleet = FleetOverlap(lambda w: _state(shards[0], w), ["http://shard-1:9400/"], fetch)
    got = fleet.current_overlap("m", window_s)
    assert calls == [f"http://shard-1:9400/kv/sketch?window_s={window_s:g}"]
    assert got is not None and got == merge_overlap([_state(s, window_s) for s in shards])
    assert fleet.current_overlap(None, window_s) == got  # the single model
    # a peer that is down, or answers garbage: the read raises, never a partial fleet as whole
    served["http://shard-1:9400"] = b'{"overlap": {"m": {"prompt_tokens": "many"}}}'
    with pytest.raises(PartialFleetError, match="shard http://shard-1:9400 left out.*malformed"):
        fleet.current_overlap("m", window_s)
    del served["http://shard-1:9400"]
    with pytest.raises(PartialFleetError, match="connection refused"):
        fleet.current_overlap("m", window_s)
    assert fleet.peer_errors == {"http://shard-1:9400": 2}
