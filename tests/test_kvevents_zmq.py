"""The subscriber against the faithful publisher over real ZMQ sockets on 127.0.0.1."""
from __future__ import annotations

import time
from collections.abc import Iterator

import msgspec
import pytest
import zmq
from prometheus_client import CollectorRegistry

from agent.kvevents import KvEventManager, KvEventsCollector, workload_overlap
from agent.kvevents.settings import EndpointSpec, KvEventsSettings
from agent.kvevents.signals import EngineId
from emulator.cluster.kv_publisher import KvEventPublisher, cleared_event, removed_event, stored_event
from tests.support.prometheus import free_port_range


@pytest.fixture
def ctx() -> Iterator[zmq.Context]:
    c = zmq.Context()
    yield c
    c.term()


def make_pub(ctx: zmq.Context, replay: bool = True, **kw: object) -> KvEventPublisher:
    return KvEventPublisher("tcp://127.0.0.1:0", replay_endpoint="tcp://127.0.0.1:0" if replay else None,
                            bind=True, context=ctx, **kw)  # type: ignore[arg-type]


def make_mgr(ctx: zmq.Context, specs: list[EndpointSpec], wait: tuple[KvEventPublisher, ...],
             **kw: object) -> KvEventManager:
    """A manager subscribed to `specs`, returned once every publisher in `wait` has its subscription
    (ZMQ's slow joiner: a batch published before that is dropped by PUB)."""
    mgr = KvEventManager(KvEventsSettings(endpoints=tuple(specs), **kw), context=ctx)  # type: ignore[arg-type]
    mgr.run_once(10)  # connect
    for pub in wait:
        pub.wait_subscribed()
    mgr.run_once(10)
    return mgr


def spec(pub: KvEventPublisher, pod: str, **kw: object) -> EndpointSpec:
    return EndpointSpec(pod=pod, model="m", endpoint=pub.endpoint, replay_endpoint=pub.replay_endpoint,
                        **kw)  # type: ignore[arg-type]


def engine_snap(mgr: KvEventManager, pod: str, dp: int = 0):
    return next(e for e in mgr.snapshot().engines if e.engine == EngineId(pod, "m", dp))


@pytest.mark.parametrize("encoding", ["map", "array"])
def test_stream_is_decoded_and_attributed(ctx: zmq.Context, encoding: str) -> None:
    with make_pub(ctx, encoding=encoding, topic="kv@a@m") as a, make_pub(ctx, encoding=encoding) as b:
        mgr = make_mgr(ctx, [spec(a, "a", topic="kv@"), spec(b, "b")], wait=(a, b))
        try:
            a.publish([stored_event([1, 2, 3], None, 16, encoding=encoding)], ts=1.0)
            a.flush()
            b.publish([stored_event([1, 2, 9], None, 16, encoding=encoding),
                       removed_event([9], encoding=encoding)], ts=2.0)
            b.flush()
            mgr.drain()
            ea, eb = engine_snap(mgr, "a"), engine_snap(mgr, "b")
            assert ea.miss_tokens == {"cold": 48, "capacity": 0, "routing": 0}
            assert eb.miss_blocks == {"cold": 1, "capacity": 0, "routing": 2}
            assert eb.stream.events == {"BlockStored": 1, "BlockRemoved": 1, "AllBlocksCleared": 0}
            assert mgr.snapshot().models[0].duplicated_blocks == 2
        finally:
            mgr.stop()


def test_topic_filter_drops_other_topics(ctx: zmq.Context) -> None:
    with make_pub(ctx, topic="kv@x@other") as a:
        mgr = make_mgr(ctx, [spec(a, "a", topic="kv@a@")], wait=(a,))
        try:
            a.publish([stored_event([1], None, 16)], ts=1.0)
            a.flush()
            mgr.drain(idle_ms=150)
            assert engine_snap(mgr, "a").stream.messages == 0
            assert engine_snap(mgr, "a").stream.rejected == {"wrong_topic": 1}  # counted, not unseen
        finally:
            mgr.stop()


def test_gap_is_recovered_through_the_dealer_replay(ctx: zmq.Context) -> None:
    with make_pub(ctx) as a:
        mgr = make_mgr(ctx, [spec(a, "a")], wait=(a,))
        try:
            a.publish([stored_event([1], None, 16)], ts=1.0)
            a.drop_next(2)  # buffered for replay but lost on PUB (HWM overflow)
            a.publish([stored_event([2], 1, 16)], ts=2.0)
            a.publish([removed_event([1])], ts=3.0)
            a.publish([stored_event([1], None, 16)], ts=4.0)
            a.flush()
            mgr.drain()
            e = engine_snap(mgr, "a")
            s = e.stream
            assert (s.gaps, s.missed_messages, s.replayed_messages, s.lost_messages) == (1, 2, 2, 0)
            assert s.messages == 4 and s.last_seq == 3
            # the replayed removal makes the last store a capacity miss (not a re-report)
            assert e.miss_blocks == {"cold": 2, "capacity": 1, "routing": 0}
            assert a.replays_served == 1
        finally:
            mgr.stop()


def test_gap_without_replay_or_beyond_the_buffer_is_counted_lost(ctx: zmq.Context) -> None:
    with make_pub(ctx, replay=False) as a, make_pub(ctx, buffer_steps=2) as b:
        mgr = make_mgr(ctx, [spec(a, "a"), spec(b, "b")], wait=(a, b))
        try:
            for pub in (a, b):
                pub.publish([stored_event([1], None, 16)], ts=1.0)
                pub.drop_next(3)
                for i in range(4):
                    pub.publish([stored_event([10 + i], None, 16)], ts=2.0 + i)
                pub.flush()
            mgr.drain()
            sa, sb = engine_snap(mgr, "a").stream, engine_snap(mgr, "b").stream
            assert (sa.gaps, sa.missed_messages, sa.replayed_messages, sa.lost_messages) == (1, 3, 0, 3)
            # b's buffer holds only seq 3 and 4: seq 3 is replayed, 1 and 2 are gone
            assert (sb.gaps, sb.missed_messages, sb.replayed_messages, sb.lost_messages) == (1, 3, 1, 2)
            assert sa.messages == 2 and sb.messages == 3
        finally:
            mgr.stop()


def test_sequence_drop_means_restart_and_clears_the_pod(ctx: zmq.Context) -> None:
    with make_pub(ctx) as a:
        mgr = make_mgr(ctx, [spec(a, "a")], wait=(a,))
        try:
            a.publish([stored_event([1, 2], None, 16)], ts=1.0)
            a.publish([stored_event([3], 2, 16)], ts=2.0)
            a.flush()
            mgr.drain()
            assert engine_snap(mgr, "a").resident_blocks == {"GPU": 3}
            a.restart()
            a.publish([stored_event([1], None, 16)], ts=10.0)
            a.flush()
            mgr.drain()
            e = engine_snap(mgr, "a")
            assert e.stream.restarts == 1 and e.stream.gaps == 0
            assert e.resident_blocks == {"GPU": 1}
            assert e.miss_blocks == {"cold": 3, "capacity": 1, "routing": 0}
            a.publish([cleared_event()], ts=11.0)  # AllBlocksCleared empties it too
            a.flush()
            mgr.drain()
            assert engine_snap(mgr, "a").resident_blocks == {}
        finally:
            mgr.stop()


def test_malformed_input_is_counted_and_skipped(ctx: zmq.Context) -> None:
    with make_pub(ctx) as a:
        mgr = make_mgr(ctx, [spec(a, "a")], wait=(a,))
        try:
            a.send_raw([b"", (0).to_bytes(8, "big")])  # two frames
            a.send_raw([b"", b"\x00\x01", b"x"])  # short sequence frame
            a.send_raw([b"", b"", b"", b""])  # four frames
            a.publish([stored_event([1], None, 16), {"type": "KVCacheResized", "n": 1},
                       ["BlockStored", "not-a-list"]], ts=1.0)
            a.flush()
            mgr.drain()
            a.drop_next(1)  # seq 1 is taken by this batch, and replaced on the wire by garbage
            a.publish([stored_event([7], None, 16)], ts=1.5)
            a.send_raw([b"", (1).to_bytes(8, "big"), msgspec.msgpack.encode({"not": "a batch"})])
            a.publish([stored_event([2], None, 16)], ts=2.0)
            a.flush()
            mgr.drain()
            e = engine_snap(mgr, "a")
            s = e.stream
            assert s.rejected == {"malformed_frame": 3, "unknown_type": 1, "malformed_event": 1,
                                  "malformed_payload": 1}
            # the bad payload still advanced the sequence: no gap, no restart; both good batches applied
            assert (s.gaps, s.restarts, s.messages, s.last_seq) == (0, 0, 2, 2)
            assert e.miss_blocks["cold"] == 2
        finally:
            mgr.stop()


def test_data_parallel_ranks_use_offset_ports(ctx: zmq.Context) -> None:
    port = free_port_range(2)
    pubs = [KvEventPublisher(f"tcp://127.0.0.1:{port}", data_parallel_rank=r, bind=True, context=ctx)
            for r in (0, 1)]
    try:
        assert [p.endpoint for p in pubs] == [f"tcp://127.0.0.1:{port}", f"tcp://127.0.0.1:{port + 1}"]
        mgr = make_mgr(ctx, [EndpointSpec(pod="a", model="m", endpoint=f"tcp://127.0.0.1:{port}", dp_size=2)],
                       wait=tuple(pubs))
        try:
            pubs[0].publish([stored_event([1], None, 16)], ts=1.0)
            pubs[1].publish([stored_event([1], None, 16)], ts=2.0)
            for p in pubs:
                p.flush()
            mgr.drain()
            assert engine_snap(mgr, "a", 0).miss_blocks["cold"] == 1
            assert engine_snap(mgr, "a", 1).miss_blocks["routing"] == 1  # each rank is its own cache
        finally:
            mgr.stop()
    finally:
        for p in pubs:
            p.close()


def test_background_thread_collector_and_overlap(ctx: zmq.Context) -> None:
    with make_pub(ctx) as a:
        mgr = KvEventManager(KvEventsSettings(endpoints=(spec(a, "a"),)), context=ctx)
        registry = CollectorRegistry()
        registry.register(KvEventsCollector(mgr.snapshot))
        mgr.start()
        try:
            a.wait_subscribed()
            mgr.observe_prompt_tokens("a", "m", 0)
            a.publish([stored_event([1, 2], None, 16)], ts=1.0)
            a.publish([removed_event([2])], ts=2.0)
            a.publish([stored_event([2], 1, 16)], ts=5.0)
            a.flush()
            labels = {"pod": "a", "model": "m", "dp_rank": "0"}
            deadline = time.monotonic() + 10
            while registry.get_sample_value("tierpilot_kv_messages_total", labels) != 3:
                assert time.monotonic() < deadline, "events did not arrive"
                time.sleep(0.05)
            mgr.observe_prompt_tokens("a", "m", 128)
            get = registry.get_sample_value
            assert get("tierpilot_kv_misses_total", {**labels, "cause": "cold"}) == 2
            assert get("tierpilot_kv_miss_tokens_total", {**labels, "cause": "capacity"}) == 16
            assert get("tierpilot_kv_resident_blocks", {**labels, "medium": "GPU"}) == 2
            assert get("tierpilot_kv_reuse_distance_seconds_bucket", {**labels, "medium": "GPU", "le": "5.0"}) == 1
            assert get("tierpilot_kv_reuse_distance_seconds_bucket", {**labels, "medium": "GPU", "le": "1.0"}) == 0
            assert get("tierpilot_kv_workload_overlap_ratio", {"model": "m"}) == 0.75
            assert get("tierpilot_kv_duplicated_blocks", {"model": "m"}) == 0
            assert workload_overlap(mgr) == 0.75 and workload_overlap(None) is None
        finally:
            mgr.stop()


def test_replay_on_join_learns_the_buffered_past(ctx: zmq.Context) -> None:
    with make_pub(ctx) as a:
        a.publish([stored_event([1, 2], None, 16)], ts=1.0)  # before the agent connects
        a.flush()
        mgr = make_mgr(ctx, [spec(a, "a")], wait=(a,), replay_on_join=True)
        try:
            a.publish([stored_event([3], 2, 16)], ts=2.0)
            a.flush()
            mgr.drain()
            e = engine_snap(mgr, "a")
            assert e.resident_blocks == {"GPU": 3} and e.stream.messages == 2
            assert (e.stream.gaps, e.stream.lost_messages) == (0, 0)
        finally:
            mgr.stop()


def test_endpoints_follow_discovery(ctx: zmq.Context) -> None:
    with make_pub(ctx) as a, make_pub(ctx) as b:
        mgr = make_mgr(ctx, [spec(a, "a")], wait=(a,))
        try:
            a.publish([stored_event([1], None, 16)], ts=1.0)
            a.flush()
            mgr.drain()
            mgr.set_endpoints([spec(b, "b")])
            mgr.run_once(10)
            b.wait_subscribed()
            b.publish([stored_event([1], None, 16)], ts=2.0)
            b.flush()
            mgr.drain()
            snap = mgr.snapshot()
            assert [e.engine.pod for e in snap.engines] == ["b"]
            assert snap.engines[0].miss_blocks["cold"] == 0  # seen before, pod a is gone
            assert snap.engines[0].miss_blocks["capacity"] == 1
        finally:
            mgr.stop()
