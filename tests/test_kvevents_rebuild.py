"""The planning workload rebuilt from the KV-event block stream (agent/kvevents/rebuild/).

The twin serves a workload and its pods publish vLLM 0.33 event streams over real ZMQ
(emulator/cluster/kv_publisher.py); the agent's subscriber records them, and the rebuilt requests
must be exactly the ones the twin stored: each one's chain of chunk hashes equal to the chain the
twin derived from the sent prompt, on the pod that served it, through a pod restart. With the
pods' request counters, the fully cached requests are counted too.
"""
from __future__ import annotations

import collections
import time

import numpy as np
import polars as pl
import pytest
import zmq

from agent.kvevents import KvEventManager
from agent.kvevents.rebuild import BlockRecorder, PodRequests, RebuiltHistory
from agent.kvevents.rebuild.chains import rebuild
from agent.kvevents.rebuild.layout import block_ids, to_frame
from agent.kvevents.settings import EndpointSpec, KvEventsSettings, RebuildSpec
from contracts.knobs import Knobs
from emulator.cluster.kv_publisher import TwinEventPublisher, open_pod_publishers
from simulator.chunking import BLOCK_TOKENS, chunk_hashes
from simulator.cluster import ClusterSpec
from simulator.records import PLACEMENT_COLUMN, WORKLOAD_SCHEMA, check_workload
from simulator.synthetic import synthetic
from simulator.twin import Twin

PODS = tuple(f"pod-{i}" for i in range(4))
SUCCESS = 'vllm:request_success_total{finished_reason="length"}'
OFFSET = 1_700_000_000.0


def _served(preset: str, chunk: int, *, restart: bool, sink=None, cluster: dict | None = None):
    twin = Twin(ClusterSpec(pods=4, pod_names=PODS, **(cluster or {"gpu_tokens": 30_000, "cpu_tokens": 30_000,
                                                                    "l2_tokens": 100_000})),
                Knobs(router="roundrobin", chunk_tokens=chunk), event_sink=sink)
    rows = list(synthetic(preset, seed=3, duration_s=150).iter_rows(named=True))
    sent = []
    for i, row in enumerate(rows):
        if restart and i == len(rows) // 2:
            twin.restart_pod("pod-1", row["timestamp_ms"] / 1000.0)
        sent.append((row, twin.submit(row)))
    return twin, sent


def served_counted(cluster: dict) -> tuple[list, list, dict]:
    """The RAG workload served at chunk 256: its block events, the sent requests, and each pod's
    request, prompt-token and GPU-hit counters."""
    events: list = []
    twin, sent = _served("rag", 256, restart=False, sink=events.append, cluster=cluster)
    counts = {}
    for p in PODS:
        c = twin.pod_counters(p)
        counts[p] = PodRequests(c['vllm:request_success_total{finished_reason="length"}'],
                                c["vllm:prompt_tokens_total"], c["vllm:prefix_cache_hits_total"])
    return events, sent, counts



def _announced(chunk: int) -> int:
    """The block size the twin announces: its chunk, or 512-token blocks for chunks above 512."""
    return min(chunk, BLOCK_TOKENS)


def _expected(sent, chunk: int) -> collections.Counter:
    """(pod, chain of announced blocks) of every request that stored at least one chunk on its GPU."""
    out: collections.Counter = collections.Counter()
    for row, outcome in sent:
        n = row["input_length"] // chunk
        if outcome.gpu_hit_tokens < n * chunk:
            out[(outcome.pod, tuple(chunk_hashes(row["hash_ids"], n * chunk, _announced(chunk))))] += 1
    return out


def _got(r) -> collections.Counter:
    return collections.Counter((r.engines[r.eng[i]], tuple(int(x) for x in r.chain(i))) for i in range(r.requests))


def test_rebuilt_chains_equal_the_sent_ones_over_zmq() -> None:
    ctx = zmq.Context()
    publishers = open_pod_publishers(PODS, context=ctx)
    specs = tuple(EndpointSpec(pod=p, model="m", endpoint=pub.endpoint, replay_endpoint=pub.replay_endpoint)
                  for p, pub in publishers.items())
    settings = KvEventsSettings(endpoints=specs, reorder_hold_s=1.0)
    mgr = KvEventManager(settings, context=ctx)
    recorder = BlockRecorder.from_settings(settings.rebuild, clock=lambda: OFFSET)
    mgr.enable_block_recorder(recorder)
    try:
        mgr.start()
        for pub in publishers.values():  # every pod's subscription in before the first batch
            pub.wait_subscribed()
        sink = TwinEventPublisher(publishers, clock_offset=OFFSET)
        twin, sent = _served("sessions", 256, restart=True, sink=sink)
        sink.flush()
        total = sum(pub.published for pub in publishers.values())
        deadline = time.monotonic() + 60
        while mgr.applied_batches < total:
            assert time.monotonic() < deadline, f"applied {mgr.applied_batches} of {total} batches"
            time.sleep(0.05)
    finally:
        mgr.stop()
        for pub in publishers.values():
            pub.close()
        ctx.term()
    arr = recorder.arrays("m")
    assert arr is not None
    r = rebuild(arr, OFFSET - 1, OFFSET + 1e4, join_s=settings.rebuild.join_s)
    want = _expected(sent, 256)
    assert r.requests == sum(want.values()) > 100
    assert _got(r) == want
    assert recorder.engine_stats("m")["pod-1"].clears >= 1  # the restart's AllBlocksCleared
    # every request is counted: the stored ones rebuilt, the fully cached ones from the counters
    counts = {p: PodRequests(twin.pod_counters(p)[SUCCESS], twin.pod_counters(p)["vllm:prompt_tokens_total"])
              for p in PODS}
    history = RebuiltHistory.from_settings(recorder, lambda since, until: counts, lambda: OFFSET + 1e4,
                                           settings.rebuild)
    frame = history(OFFSET + 1e4, 1e4 + 1)
    assert check_workload(frame).height == len(sent)
    assert history.kind == "rebuilt"


def _feed(recorder: BlockRecorder, twin_events, model: str = "m", offset: float = 0.0) -> None:
    """Twin events fed to the recorder one step (pod, ts) at a time, as the manager applies them."""
    from agent.kvevents.wire import Batch, Cleared, Removed, Stored
    from contracts import events as ce

    steps: dict = collections.defaultdict(list)
    for ev in twin_events:
        steps[(ev.ts, ev.pod)].append(ev)
    for (ts, pod), evs in steps.items():
        out = []
        for e in evs:
            if isinstance(e, ce.BlockStored):
                out.append(Stored(list(e.block_hashes), e.parent_block_hash, e.block_size, e.medium, None))
            elif isinstance(e, ce.BlockRemoved):
                out.append(Removed(list(e.block_hashes), e.medium, None))
            else:
                out.append(Cleared())
        recorder.record(model, pod, Batch(b"", 0, offset + ts, 0, out, {}))


@pytest.mark.parametrize("chunk", [256, 1024])
def test_rebuilt_frame_replays_the_same_chunks(chunk: int) -> None:
    """Through the 512-token ids, the twin derives chunks that share exactly where the sent ones do."""
    events: list = []
    _, sent = _served("rag", chunk, restart=False, sink=events.append,
                      cluster={"gpu_tokens": 60_000, "cpu_tokens": 60_000, "l2_tokens": 0})
    recorder = BlockRecorder.from_settings(RebuildSpec(), clock=lambda: 0.0)
    _feed(recorder, events)
    r = rebuild(recorder.arrays("m"), -1.0, 1e6, join_s=1.0)
    assert _got(r) == _expected(sent, chunk)
    frame = to_frame(r, output_tokens=200)
    assert frame.schema == pl.Schema({**WORKLOAD_SCHEMA, PLACEMENT_COLUMN: pl.Int32()})
    # each request keeps the engine that served it, numbered densely (one number per engine)
    order = np.argsort(r.ts, kind="stable")
    served = dict(zip(frame[PLACEMENT_COLUMN].to_list(), (r.engines[r.eng[i]] for i in order), strict=False))
    assert sorted(served) == list(range(len(PODS)))
    assert [served[q] for q in frame[PLACEMENT_COLUMN].to_list()] == [r.engines[r.eng[i]] for i in order]
    _ids, _offsets, tokens = block_ids(r, 16)
    assert (tokens == r.lengths * _announced(chunk)).all()
    # the rebuilt prompt's chunks are a renaming of the engine's blocks: equal exactly where they are equal
    rebuilt = [tuple(chunk_hashes(list(h), n, _announced(chunk))) for h, n in zip(frame["hash_ids"].to_list(),
                                                                       frame["input_length"].to_list(), strict=True)]
    originals = [tuple(int(x) for x in r.chain(i)) for i in np.argsort(r.ts, kind="stable")]
    rename: dict[int, int] = {}
    for a, b in zip(rebuilt, originals, strict=True):
        assert len(a) == len(b)
        for x, y in zip(a, b, strict=True):
            assert rename.setdefault(x, y) == y
    assert len(set(rename.values())) == len(rename)


def test_a_rebuilt_prompt_s_partial_last_block_gets_ids_of_its_own() -> None:
    """to_frame: a prompt whose estimated tail reaches past its stored blocks gets 512-token ids of
    its own for it (shared with nothing, not even an identical prompt); stored ids are untouched."""
    from agent.kvevents.rebuild.chains import Rebuilt
    from agent.kvevents.rebuild.layout import TAIL_HASH_BASE

    chains = [[1, 2, 3, 4], [5, 6], [1, 2, 3, 4]]
    lengths = np.array([len(c) for c in chains])
    offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
    r = Rebuilt(np.array([0.0, 0.001, 0.002]), np.zeros(3, dtype=np.int32), np.full(3, 512, dtype=np.int32),
                lengths.astype(np.int64), np.array([h for c in chains for h in c], dtype=np.uint64), offsets, ("pod-0",))
    frame = to_frame(r, output_tokens=9, tails=np.array([230, 0, 52]))
    got = frame["hash_ids"].to_list()
    assert frame["input_length"].to_list() == [2278, 1024, 2100]
    assert got[1] == [5, 6] and got[0][:4] == [1, 2, 3, 4] == got[2][:4]  # stored blocks untouched
    assert len(got[0]) == len(got[2]) == 5 and got[0][4] != got[2][4] >= TAIL_HASH_BASE  # shared with nothing
    assert to_frame(r, output_tokens=9)["hash_ids"].to_list() == chains  # no tail: nothing added


def test_native_tiering_cpu_and_storage_events_are_recorded_apart() -> None:
    """vLLM's native offloading publishes `medium "CPU"` / `"STORAGE"` stores and removals of its
    own offload blocks (another block size, other hashes) in the same batches: they are counted per
    medium and leave the requests, which only GPU stores make, unchanged."""
    from contracts import events as ce

    events: list = []
    _served("rag", 256, restart=False, sink=events.append,
            cluster={"gpu_tokens": 60_000, "cpu_tokens": 0, "l2_tokens": 0})
    mixed: list = []
    offloaded = {"CPU": 0, "STORAGE": 0}
    for ev in events:
        mixed.append(ev)
        if isinstance(ev, ce.BlockStored) and ev.medium == "GPU":
            pairs = tuple((h * 31 + 7) & ((1 << 64) - 1) for h in ev.block_hashes[::2])
            for medium in ("CPU", "STORAGE"):
                mixed.append(ce.BlockStored(ev.ts, ev.pod, pairs, None, 512, medium))
                mixed.append(ce.BlockRemoved(ev.ts, ev.pod, pairs[:1], medium))
                offloaded[medium] += len(pairs)
    plain, native = (BlockRecorder.from_settings(RebuildSpec(), clock=lambda: 0.0) for _ in range(2))
    _feed(plain, events)
    _feed(native, mixed)
    want = rebuild(plain.arrays("m"), -1.0, 1e6, join_s=1.0)
    got = rebuild(native.arrays("m"), -1.0, 1e6, join_s=1.0)
    assert _got(got) == _got(want) and got.requests > 100
    stats = native.engine_stats("m")
    for medium, n in offloaded.items():
        assert sum(s.by_medium.get(medium, 0) for s in stats.values()) == n > 0


def test_a_plan_replays_at_most_its_caps_the_same_requests_every_time(caplog) -> None:
    """max_requests / max_block_refs cut the plan workload by request hash (a subset that does
    not change from one plan to the next), and say so."""
    import logging

    events: list = []
    _served("rag", 256, restart=False, sink=events.append, cluster={"gpu_tokens": 60_000, "cpu_tokens": 0,
                                                                     "l2_tokens": 0})
    recorder = BlockRecorder.from_settings(RebuildSpec(), clock=lambda: 0.0)
    _feed(recorder, events)
    whole = RebuiltHistory.from_settings(recorder, None, lambda: 200.0, RebuildSpec())(200.0, 201.0)
    capped = RebuiltHistory.from_settings(recorder, None, lambda: 200.0, RebuildSpec(), max_requests=200,
                                          max_block_refs=whole["hash_ids"].list.len().sum() // 3)
    with caplog.at_level(logging.WARNING, logger="agent.kvevents.rebuild.history"):
        a, b = capped(200.0, 201.0), capped(200.0, 201.0)
    assert a.equals(b) and 0 < a.height <= 200 and a["hash_ids"].list.len().sum() <= capped.max_block_refs
    assert capped.capped_level >= 1 and any("plan workload capped" in r.getMessage() for r in caplog.records)
    assert set(a["timestamp_ms"].to_list()) <= set(whole["timestamp_ms"].to_list())
