"""Hostile KV-event input (issue 18 item 5): a flood from a pod claiming 256 data-parallel ranks,
oversized messages, invented `medium` strings, wrong topics, a sequence jump to 2^64-1, and size
settings that would not fit in memory. Real ZMQ on loopback; memory is checked as index entries
(deterministic), the RSS figure is in bench/hostile_kv.py."""
from __future__ import annotations

import time
from collections.abc import Iterator

import msgspec
import pytest
import zmq
from pydantic import BaseModel

from agent.kvevents import KvEventManager
from agent.kvevents.budget import plan_streams
from agent.kvevents.settings import EndpointSpec, KvEventsSettings, LimitsSpec, SettingsError
from agent.kvevents.signals import EngineId
from agent.settings import AgentSettings
from emulator.cluster.kv_publisher import KvEventPublisher
from tests.support.prometheus import free_port_range


@pytest.fixture
def ctx() -> Iterator[zmq.Context]:
    c = zmq.Context()
    yield c
    c.term()


def _mgr(ctx: zmq.Context, specs: list[EndpointSpec], wait: tuple[KvEventPublisher, ...],
         **kw: object) -> KvEventManager:
    mgr = KvEventManager(KvEventsSettings(endpoints=tuple(specs), **kw), context=ctx)  # type: ignore[arg-type]
    mgr.run_once(10)
    for pub in wait:  # ZMQ's slow joiner: PUB drops what it sends before the subscription arrives
        pub.wait_subscribed()
    mgr.run_once(10)
    return mgr


def _resident(mgr: KvEventManager) -> dict[EngineId, int]:
    return {e.engine: sum(e.resident_blocks.values()) for e in mgr.snapshot().engines}


# -- settings ------------------------------------------------------------------------------------
def _numeric_fields(model: type[BaseModel]) -> list[str]:
    return [n for n, f in model.model_fields.items() if f.annotation in (int, float)]


@pytest.mark.parametrize(("model", "prefix"), [(LimitsSpec, "limits."), (KvEventsSettings, "")])
def test_every_size_setting_has_an_upper_bound(model: type[BaseModel], prefix: str) -> None:
    for name in _numeric_fields(model):
        data = {name: 10**15} if not prefix else {"limits": {name: 10**15}}
        with pytest.raises(SettingsError) as err:
            KvEventsSettings.from_mapping(data)
        assert f"kv_events.{prefix}{name}:" in str(err.value) and "\n" not in str(err.value), name


def test_seen_capacity_1e12_is_refused_naming_the_key() -> None:
    with pytest.raises(SettingsError, match=r"^<settings>: invalid KV-event settings: "
                                            r"kv_events\.limits\.seen_capacity: .*less than or equal"):
        KvEventsSettings.from_mapping({"limits": {"seen_capacity": 1e12}})
    # the agent's own settings file refuses it too (one error naming the key)
    with pytest.raises(ValueError, match=r"kv_events\.limits\.seen_capacity"):
        AgentSettings.model_validate({"kv_events": {"limits": {"seen_capacity": 1e12}}})
    # sketches that fit the bounds one by one but not together
    with pytest.raises(SettingsError, match=r"kv_events\.limits: .*MiB of sketches"):
        KvEventsSettings.from_mapping({"limits": {"seen_capacity": 60_000_000, "seen_generations": 8}})


def test_old_per_engine_keys_read_as_per_pod_budgets() -> None:
    limits = KvEventsSettings.from_mapping({"limits": {"resident_per_engine": 1000}}).limits
    assert limits.resident_per_pod == 1000


def test_budgets_are_per_pod_and_per_fleet_whatever_the_dp_size() -> None:
    lim = LimitsSpec(resident_per_pod=262_144, history_per_pod=262_144, fleet_resident=1_048_576,
                     fleet_history=1_048_576)
    assert lim.engine_caps(1, 1) == (262_144, 262_144)
    assert lim.engine_caps(256, 256) == (1024, 1024)  # 256 ranks share their pod's budget
    assert lim.engine_caps(1, 8) == (131_072, 131_072)  # 8 pods share the fleet's
    for dp, engines in ((1, 1), (16, 16), (256, 256), (256, 4096), (3, 1000)):
        res, hist = lim.engine_caps(dp, engines)
        assert res * dp <= lim.resident_per_pod and res * engines <= max(lim.fleet_resident, 2 * engines)
        assert hist * dp <= lim.history_per_pod


# -- the flood -----------------------------------------------------------------------------------
def test_flood_from_a_many_rank_pod_stays_in_its_budget(ctx: zmq.Context) -> None:
    ranks = 8
    base = free_port_range(ranks)
    pubs = [KvEventPublisher(f"tcp://127.0.0.1:{base}", data_parallel_rank=r, bind=True, context=ctx,
                             hwm=1_000_000) for r in range(ranks)]
    other = KvEventPublisher("tcp://127.0.0.1:0", bind=True, context=ctx)
    limits = {"resident_per_pod": 4096, "history_per_pod": 4096, "fleet_resident": 6000, "fleet_history": 6000}
    specs = [EndpointSpec(pod="flood", model="m", endpoint=f"tcp://127.0.0.1:{base}", dp_size=ranks),
             EndpointSpec(pod="calm", model="m", endpoint=other.endpoint)]
    mgr = _mgr(ctx, specs, (*pubs, other), limits=limits, reorder_hold_s=0.0)
    try:
        f = pubs[0].format
        for step in range(40):  # 8 ranks x 40 batches x 256 new hashes = 81,920 distinct hashes
            for r, p in enumerate(pubs):
                first = (r * 1_000_000 + step * 256) * 0x9E3779B97F4A7C15
                p.publish([f.stored([(first + i) & (2**64 - 1) for i in range(256)], None, 16),
                           f.removed([first & (2**64 - 1)], medium=f"tier-{step}-{r}")], ts=float(step))
        other.publish([f.stored([1, 2, 3], None, 16)], ts=50.0)
        for p in (*pubs, other):
            p.flush()
        mgr.drain(idle_ms=300, max_s=60)
        resident = _resident(mgr)
        flood = {e: n for e, n in resident.items() if e.pod == "flood"}
        assert len(flood) == ranks and sum(flood.values()) <= 4096  # the pod's budget, not 8 x it
        assert sum(resident.values()) <= 6000  # the fleet's
        assert resident[EngineId("calm", "m")] == 3  # the calm pod keeps what it stored
        snap = mgr.snapshot()
        for e in snap.engines:
            assert set(e.removed_blocks) <= {"GPU", "OTHER"}  # 320 invented media, one label value
            assert e.stream.lost_messages == 0 and e.stream.rejected == {}
        assert sum(e.stream.messages for e in snap.engines) == ranks * 40 + 1
    finally:
        mgr.stop()
        for p in (*pubs, other):
            p.close()


def test_oversized_message_is_refused_and_counted_lost(ctx: zmq.Context) -> None:
    with KvEventPublisher("tcp://127.0.0.1:0", replay_endpoint="tcp://127.0.0.1:0", bind=True,
                          context=ctx) as pub:
        spec = EndpointSpec(pod="a", model="m", endpoint=pub.endpoint, replay_endpoint=pub.replay_endpoint)
        mgr = _mgr(ctx, [spec], (pub,), max_message_bytes=64 * 1024, replay_timeout_s=0.5, reorder_hold_s=0.0)
        try:
            f = pub.format
            pub.publish([f.stored([1], None, 16)], ts=1.0)
            pub.publish([f.stored(list(range(10, 20_010)), None, 16)], ts=2.0)  # ~ 2.6 MB of token ids
            pub.flush()
            end = time.monotonic() + 10
            while time.monotonic() < end and next(iter(mgr.snapshot().engines)).stream.reconnects == 0:
                mgr.run_once(50)
            mgr.run_once(10)
            pub.wait_subscribed(2)  # the reopened SUB's own subscription
            pub.publish([f.stored([2], 1, 16)], ts=3.0)
            pub.flush()
            mgr.drain(idle_ms=1000)
            s = next(e for e in mgr.snapshot().engines).stream
            assert s.messages == 2 and (s.gaps, s.lost_messages) == (1, 1)  # the replay hits the cap too
            assert s.reconnects >= 1  # libzmq alone would never reconnect after refusing the frame
        finally:
            mgr.stop()


def test_sequence_jump_to_the_top_does_not_count_billions(ctx: zmq.Context) -> None:
    with KvEventPublisher("tcp://127.0.0.1:0", replay_endpoint="tcp://127.0.0.1:0", bind=True, topic="kv@a@m",
                          context=ctx) as pub:
        spec = EndpointSpec(pod="a", model="m", endpoint=pub.endpoint, replay_endpoint=pub.replay_endpoint,
                            topic="kv@a@m")
        mgr = _mgr(ctx, [spec], (pub,), reorder_hold_s=0.0)
        try:
            f = pub.format
            pub.publish([f.stored([1, 2], None, 16)], ts=1.0)
            pub.flush()
            payload = msgspec.msgpack.encode(f.batch(2.0, [f.stored([3], None, 16)], 0))
            pub.send_raw([b"kv@a@m", (2**64 - 1).to_bytes(8, "big"), payload])
            pub.send_raw([b"kv@b@m", (1).to_bytes(8, "big"), payload])  # someone else's topic
            pub.flush()
            mgr.drain()
            s = next(e for e in mgr.snapshot().engines).stream
            assert s.rejected == {"sequence_jump": 1, "wrong_topic": 1}
            assert (s.gaps, s.missed_messages, s.lost_messages, s.restarts) == (0, 0, 0, 0)
            assert next(e for e in mgr.snapshot().engines).resident_blocks == {"GPU": 1}  # resynced
            pub.publish([f.stored([4], None, 16)], ts=3.0)  # the real engine's seq 1: a restart
            pub.flush()
            mgr.drain()
            s = next(e for e in mgr.snapshot().engines).stream
            assert s.restarts == 1 and s.missed_messages <= 1 and s.lost_messages <= 1
        finally:
            mgr.stop()


def test_plan_keeps_indexed_models_and_skips_the_rest() -> None:
    specs = [EndpointSpec(pod=f"p{i}", model=f"m{i % 6}", endpoint=f"tcp://127.0.0.1:{6000 + i}", dp_size=1 + i % 3)
             for i in range(12)]
    settings = KvEventsSettings(limits={"max_models": 2, "shadow_l2": 1000})  # type: ignore[arg-type]
    plan = plan_streams(specs, settings, indexed_models={"m5"})
    assert plan.models == {"m5", "m0"} and plan.skipped_models == ("m1", "m2", "m3", "m4")
    engines = sum(s.dp_size for s in plan.specs)
    assert len(plan.caps) == engines and plan.shadow_per_model == 500
    assert sum(r for r, _ in plan.caps.values()) <= settings.limits.fleet_resident
    assert plan.pending_bytes * engines <= settings.replay_pending_bytes
