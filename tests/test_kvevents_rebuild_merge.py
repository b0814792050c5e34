"""Bounded memory and sharded agents for the rebuilt workload: hash sampling keeps exactly the
requests whose key (first stored block) falls in the sampled range, with their whole chains,
whatever replica recorded them, and the leader's merge of its replicas' windows equals one
agent's rebuild of the whole fleet."""
from __future__ import annotations

import collections

import msgspec
import pytest

from agent.kvevents.rebuild import BlockRecorder, RebuiltHistory
from agent.kvevents.rebuild.chains import rebuild
from agent.kvevents.rebuild.log import sampled
from agent.kvevents.rebuild.merge import MergedHistory, StateError, decode_state, encode_state, window_state
from agent.kvevents.settings import RebuildSpec
from tests.test_kvevents_rebuild import PODS, _feed, _got, served_counted

CLUSTER = {"gpu_tokens": 60_000, "cpu_tokens": 60_000, "l2_tokens": 100_000}
SPEC = RebuildSpec()


@pytest.fixture(scope="module")
def served():
    events, _sent, counts = served_counted(CLUSTER)
    return events, counts


def _recorder(events, pods=PODS, max_refs: int = 10**9) -> BlockRecorder:
    rec = BlockRecorder(retain_s=3600.0, max_refs=max_refs, engine_refs_per_s=1e9, clock=lambda: 0.0)
    _feed(rec, [e for e in events if e.pod in pods])
    rec.flush()
    return rec


def _at_level(r, level: int) -> collections.Counter:
    """(pod, chain) of the requests of `r` whose key (first stored block) is kept at `level`."""
    return _got(r.take(sampled(r.keys, level)))


def test_sampling_keeps_exactly_the_requests_keyed_in_range(served) -> None:
    events, _ = served
    full = _recorder(events)
    total = full.refs()
    small = _recorder(events, max_refs=total // 3)
    assert small.level >= 1 and small.refs() <= total // 3
    want = _at_level(rebuild(full.arrays("m"), -1.0, 1e6, join_s=1.0), small.level)
    got = _got(rebuild(small.arrays("m"), -1.0, 1e6, join_s=1.0))
    assert got == want and sum(got.values()) > 20


def _history(rec: BlockRecorder, counts) -> RebuiltHistory:
    return RebuiltHistory.from_settings(rec, lambda since, until: counts, lambda: 200.0, SPEC)


def test_the_leaders_merge_equals_one_agent_over_the_fleet(served) -> None:
    events, counts = served
    whole = _history(_recorder(events), counts)
    shards = [(PODS[:2]), (PODS[2:])]
    local, peer = (_history(_recorder(events, pods), {p: counts[p] for p in pods}) for pods in shards)
    merged = MergedHistory(local, lambda now, s: [encode_state(window_state(peer, now, s))])
    assert merged(200.0, 201.0).equals(whole(200.0, 201.0))
    assert merged.kind == whole.kind == "rebuilt"


def test_replicas_sampling_at_different_levels_merge_at_the_highest(served) -> None:
    events, counts = served
    whole = _recorder(events)
    sampled_rec = _recorder(events, PODS[:2], max_refs=whole.refs() // 8)
    plain = _recorder(events, PODS[2:])
    assert sampled_rec.level > plain.level == 0
    local = _history(sampled_rec, {p: counts[p] for p in PODS[:2]})
    peer = _history(plain, {p: counts[p] for p in PODS[2:]})
    merged = MergedHistory(local, lambda now, s: [encode_state(window_state(peer, now, s))])
    w = merged.window(200.0, 201.0)
    assert w.sample_level == sampled_rec.level
    stored = w.requests.take(w.requests.own > 0)
    want = _at_level(rebuild(whole.arrays("m"), -1.0, 1e6, join_s=1.0), sampled_rec.level)
    assert _got(stored) == want


def test_a_malformed_state_is_refused_with_its_reason(served) -> None:
    events, counts = served
    state = window_state(_history(_recorder(events, PODS[:1]), counts), 200.0, 201.0)
    decode_state(encode_state(state))  # the good one
    for bad, why in [
        ({**state, "offsets": state["offsets"][:-8]}, "different lengths"),
        ({**state, "flat": state["flat"][:-8]}, "offsets"),
        ({**state, "engines": []}, "engine id"),
        ({**state, "level": 99}, "level"),
        ({**state, "ts": "x"}, "bytes"),
    ]:
        with pytest.raises(StateError, match=why):
            decode_state(encode_state(bad))
    with pytest.raises(StateError, match="msgpack"):
        decode_state(b"\xc1")
    with pytest.raises(StateError, match="version"):
        decode_state(msgspec.msgpack.encode([1, 2]))


def test_the_sharded_runtime_serves_its_window_and_plans_on_the_merge() -> None:
    """`tierpilot run` with KV events: the rebuilt history is on the runtime; sharded, each replica
    serves its window on /kv/rebuilt and the history merges the peers' (refused without them)."""
    from agent.collect.discovery import StaticTargets
    from agent.runtime.assembly import build_runtime
    from agent.settings import load_settings
    from contracts.fleet import PartialFleetError

    endpoints = [{"pod": f"vllm-{i}", "model": "m", "endpoint": f"tcp://127.0.0.1:{5600 + i}"} for i in range(4)]
    kv = {"enabled": True, "discovery": False, "endpoints": endpoints}
    plain = build_runtime(load_settings(env={}, kv_events=kv), targets=StaticTargets(()))
    assert isinstance(plain.rebuilt_history, RebuiltHistory) and plain.rebuilt_history.kind == "rebuilt"
    assert "tierpilot_kv_rebuild_block_refs 0.0" in plain.agent.metrics_text()
    rt = build_runtime(load_settings(env={}, kv_events=kv, shard={"count": 2, "index": 1, "peers": ["http://127.0.0.1:9/"],
                                                                "allow_unauthenticated": True}),
                       targets=StaticTargets(()))
    assert isinstance(rt.rebuilt_history, MergedHistory) and rt.rebuilt_history.kind == "rebuilt"
    body, ctype = rt.agent.routes["/kv/rebuilt"]({"since": "0", "until": "60"})
    r, _counts, level = decode_state(body)
    assert ctype == "application/x-msgpack" and r.requests == 0 and level == 0
    with pytest.raises(ValueError, match="since and until"):
        rt.agent.routes["/kv/rebuilt"]({"since": "soon"})
    with pytest.raises(PartialFleetError, match="shard http://127.0.0.1:9 left out"):
        rt.rebuilt_history(60.0, 60.0)
