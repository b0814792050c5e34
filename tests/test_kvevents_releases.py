"""Contract: the subscriber against every vLLM release's wire format (0.9.0 to 0.33.0: positional
and map events, with and without `medium` and the data-parallel rank, both replay framings,
signed, unsigned and bytes hashes), with a late join, a gap, a restart, over real ZMQ on loopback;
and the emulator's encoding against structs declared as vLLM declares them."""
from __future__ import annotations

from collections.abc import Iterator

import msgspec
import pytest
import zmq

from agent.kvevents import KvEventManager
from agent.kvevents.replay import ReplayState
from agent.kvevents.settings import EndpointSpec, KvEventsSettings
from agent.kvevents.signals import EngineId
from agent.kvevents.wire import END_SEQ_BYTES, decode_payload, split_replay
from emulator.cluster.kv_publisher import KvEventPublisher
from emulator.cluster.kv_wire_formats import RELEASES, wire_format

CASES = [(r, f.hashes) for r, f in RELEASES.items()] + [
    ("0.11.0", "bytes"), ("0.23.0", "bytes"), ("0.25.0", "bytes"), ("0.33.0", "bytes"), ("0.23.0", "signed")]


@pytest.fixture
def ctx() -> Iterator[zmq.Context]:
    c = zmq.Context()
    yield c
    c.term()


# -- vLLM's own struct declarations (vllm/distributed/kv_events.py), to check the emulator's output
class Batch(msgspec.Struct, array_like=True, omit_defaults=True, gc=False):
    ts: float
    events: list
    data_parallel_rank: int | None = None


class Batch090(msgspec.Struct, array_like=True, omit_defaults=True, gc=False):
    ts: float
    events: list


class Ev033(msgspec.Struct, omit_defaults=True, gc=False, tag=True):
    pass


class Stored033(Ev033, tag="BlockStored"):
    block_hashes: list
    parent_block_hash: int | bytes | None
    token_ids: list
    block_size: int
    lora_id: int | None
    medium: str | None
    lora_name: str | None
    extra_keys: list | None = None
    group_idx: int | None = None
    kv_cache_spec_kind: str | None = None
    kv_cache_spec_sliding_window: int | None = None
    locality: str | None = None
    ownership: str | None = None
    session_id: str | None = None
    lookahead_token_ids: list | None = None


class Ev090(msgspec.Struct, array_like=True, omit_defaults=True, gc=False, tag=True):
    pass


class Stored090(Ev090, tag="BlockStored"):
    block_hashes: list
    parent_block_hash: int | None
    token_ids: list
    block_size: int
    lora_id: int | None


class Removed090(Ev090, tag="BlockRemoved"):
    block_hashes: list


def test_emulator_encodes_as_vllm_structs() -> None:
    f33 = wire_format("0.33.0")
    mine = msgspec.msgpack.encode(f33.batch(1.5, [f33.stored([5, 6], 4, 1, token_ids=[1, 2])], 2))
    theirs = msgspec.msgpack.encode(Batch(1.5, [Stored033([5, 6], 4, [1, 2], 1, None, "GPU", None, group_idx=0,
                                                          kv_cache_spec_kind="full_attention")], 2))
    # same keys, order and values (msgspec writes a struct's map header as map16, a dict's as fixmap)
    dec = msgspec.msgpack.decode
    assert [list(e.items()) for e in dec(mine)[1]] == [list(e.items()) for e in dec(theirs)[1]]
    assert dec(mine) == dec(theirs)
    f09 = wire_format("0.9.0")
    mine = msgspec.msgpack.encode(f09.batch(2.0, [f09.stored([2**64 - 1], None, 1, token_ids=[3]),
                                                  f09.removed([2**64 - 1])], 0))
    theirs = msgspec.msgpack.encode(Batch090(2.0, [Stored090([-1], None, [3], 1, None), Removed090([-1])]))
    assert mine == theirs  # the builtin hash is signed: uint64 2**64-1 is published as -1


def test_a_map_shaped_batch_is_read_too() -> None:
    # vllm-project/vllm commit 0181ea3 declares EventBatch without array_like
    payload = msgspec.msgpack.encode({"ts": 4.0, "events": [wire_format("0.25.0").stored([3], None, 16)],
                                      "data_parallel_rank": 2})
    b = decode_payload(payload)
    assert (b.ts, b.dp_rank, b.rejected, b.events[0].hashes) == (4.0, 2, {}, [3])


def test_replay_framing_of_both_eras() -> None:
    seq = (7).to_bytes(8, "big")
    assert split_replay([b"", b"kv@p@m", seq, b"x"]) == (b"kv@p@m", seq, b"x")  # 0.26+
    assert split_replay([b"", seq, b"x"], b"kv@p@m") == (b"kv@p@m", seq, b"x")  # up to 0.25.x
    assert split_replay([b"", b"", END_SEQ_BYTES, b""]) == (b"", END_SEQ_BYTES, b"")
    assert split_replay([b"", END_SEQ_BYTES, b""]) == (b"", END_SEQ_BYTES, b"")
    assert split_replay([b"", b"short", b"x"]) is None and split_replay([b"x", seq, b""]) is None


@pytest.mark.parametrize("release", sorted(RELEASES))
def test_every_release_decodes_on_the_fast_or_tolerant_path(release: str) -> None:
    f = RELEASES[release]
    payload = msgspec.msgpack.encode(f.batch(3.0, [f.stored([2**63 + 5, 9], 2**64 - 2, 16), f.removed([9]),
                                                   f.cleared()], 1))
    b = decode_payload(payload)
    assert b.rejected == {}
    assert [type(e).__name__ for e in b.events] == ["Stored", "Removed", "Cleared"]
    assert b.events[0].hashes == [2**63 + 5, 9] and b.events[0].parent == 2**64 - 2
    assert b.dp_rank == (1 if f.batch_dp_rank else None)


@pytest.mark.parametrize(("release", "hashes"), CASES, ids=[f"{r}-{h}" for r, h in CASES])
def test_subscriber_contract(ctx: zmq.Context, release: str, hashes: str) -> None:
    """Late join (2 batches before the agent), live batches, a gap of 2 recovered by replay, then a
    restart: nothing lost, nothing rejected, the index exactly what the engine holds."""
    with KvEventPublisher("tcp://127.0.0.1:0", replay_endpoint="tcp://127.0.0.1:0", bind=True, context=ctx,
                          topic="kv@a@m", release=release, hashes=hashes, data_parallel_rank=0) as pub:  # type: ignore[arg-type]
        f = pub.format
        big = 2**64 - 3  # top bit set: negative when signed, long when bytes
        pub.publish([f.stored([1, 2], None, 16)], ts=1.0)
        pub.publish([f.stored([3], 2, 16)], ts=2.0)
        pub.flush()
        spec = EndpointSpec(pod="a", model="m", endpoint=pub.endpoint, replay_endpoint=pub.replay_endpoint,
                            topic="kv@a@m")
        mgr = KvEventManager(KvEventsSettings(endpoints=(spec,), replay_on_join=True), context=ctx)
        try:
            mgr.run_once(10)
            pub.wait_subscribed()
            pub.publish([f.stored([big], 3, 16)], ts=3.0)  # seq 2: the join replays 0 and 1
            pub.drop_next(2)
            pub.publish([f.stored([5], big, 16)], ts=4.0)  # seq 3, 4 lost on PUB, kept for replay
            pub.publish([f.removed([1])], ts=5.0)
            pub.publish([f.stored([6], 5, 16)], ts=6.0)  # seq 5 reveals the gap
            pub.flush()
            mgr.drain()
            e = next(x for x in mgr.snapshot().engines if x.engine == EngineId("a", "m"))
            s = e.stream
            assert s.rejected == {}
            assert (s.messages, s.gaps, s.replayed_messages, s.lost_messages, s.unbuffered_messages) == (6, 1, 4, 0, 0)
            assert e.resident_blocks == {"GPU": 5} and e.stored_blocks == {"GPU": 6}
            assert e.removed_blocks == {"GPU": 1} and e.unknown_removed_blocks == 0
            assert e.miss_blocks["cold"] == 6
            pub.restart()
            pub.publish([f.stored([7, 8], None, 16)], ts=7.0)
            pub.flush()
            mgr.drain()
            e = next(x for x in mgr.snapshot().engines if x.engine == EngineId("a", "m"))
            assert e.stream.restarts == 1 and e.resident_blocks == {"GPU": 2}
            assert (e.stream.messages, e.stream.lost_messages, e.stream.rejected) == (7, 0, {})
        finally:
            mgr.stop()


def test_ipv6_loopback(ctx: zmq.Context) -> None:
    with KvEventPublisher("tcp://[::1]:0", replay_endpoint="tcp://[::1]:0", bind=True, context=ctx) as pub:
        assert pub.endpoint.startswith("tcp://[::1]:")
        spec = EndpointSpec(pod="v6", model="m", endpoint=pub.endpoint, replay_endpoint=pub.replay_endpoint)
        mgr = KvEventManager(KvEventsSettings(endpoints=(spec,)), context=ctx)
        try:
            mgr.run_once(10)
            pub.wait_subscribed()
            f = pub.format
            pub.publish([f.stored([1], None, 16)], ts=1.0)
            pub.drop_next(1)  # the replay DEALER needs IPv6 as well
            pub.publish([f.stored([2], 1, 16)], ts=2.0)
            pub.publish([f.stored([3], 2, 16)], ts=3.0)
            pub.flush()
            mgr.drain()
            s = mgr.snapshot().engines[0].stream
            assert (s.messages, s.replayed_messages, s.lost_messages) == (3, 1, 0)
        finally:
            mgr.stop()


def test_replay_outcomes_are_counted_as_replayed_lost_or_unbuffered() -> None:
    join = ReplayState(0, 10, 0.0, count_lost=False, pending=[])
    assert [join.accept(s) for s in (6, 6, 7, 12)] == [True, False, True, False]
    assert join.outcome(timed_out=False) == (2, 2, 6)  # 0-5 before the engine's buffer; 8, 9 lost
    assert join.outcome(timed_out=True) == (2, 8, 0)  # a join whose replay failed lost it all
    gap = ReplayState(5, 8, 0.0, count_lost=True, pending=[])
    assert gap.accept(6) and gap.outcome(timed_out=False) == (1, 2, 0)
    assert gap.queue((b"", 9, b"x" * 10), max_bytes=10) and not gap.queue((b"", 10, b"y"), max_bytes=10)
