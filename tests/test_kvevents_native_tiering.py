"""KV events of vLLM's native tiering, from the real 0.32 capture: the CPU tier (`medium` "CPU")
is resident per engine, the fs tier ("STORAGE") is the fleet's shared L2, and a GPU store of a block
read from the shared L2 is an L2 hit, not a miss."""
from __future__ import annotations

import dataclasses
import json

import msgspec
import pytest

from agent.kvevents.collector import build_families
from agent.kvevents.index import CPU, GPU
from agent.kvevents.signals import EngineId, KvSignals
from agent.kvevents.wire import Batch, Removed, Stored, decode_payload
from agent.kvevents.workload import EventTotals, _Sample, estimate

CAPTURE = "vllm_0_32_native_tiering_kv_events.jsonl"
MODEL = "tiny-llama"
BLOCK = 32  # the capture's GPU events: "block_size": 32


@pytest.fixture(scope="module")
def batches(samples_dir) -> list[Batch]:
    """The capture's batches through the wire decoder (msgpack, as the engine sends them). Its last
    line is cut short (a BlockRemoved batch): the capture ends there."""
    lines = (samples_dir / CAPTURE).read_text().splitlines()
    out = []
    for n, line in enumerate(lines):
        try:
            rec = json.loads(line)
        except json.JSONDecodeError:
            assert n == len(lines) - 1, "only the last line may be cut short"
            continue
        out.append(decode_payload(msgspec.msgpack.encode(rec["payload"]), b"", rec["seq"]))
    assert len(out) == 9
    return out


def _hashes(batch: Batch) -> list[int]:
    return [h for ev in batch.events for h in ev.hashes]


def test_the_capture_decodes_with_its_media_and_offload_event_shape(batches):
    media = [{ev.medium for ev in b.events} for b in batches]
    assert media == [{"GPU"}, {"CPU"}, {"STORAGE"}, {"GPU"}, {"CPU"}, {"GPU"}, {"CPU"}, {"STORAGE"}, {"STORAGE"}]
    offload = batches[1].events  # one hash per event, no parent, block size 0 (not self-describing)
    assert len(offload) == 62 and all(len(ev.hashes) == 1 and ev.parent is None and ev.block_size == 0
                                      for ev in offload)
    assert batches[0].events[0].block_size == BLOCK
    assert sorted(_hashes(batches[1])) == sorted(_hashes(batches[0]))  # the engine's own block hashes


def test_cpu_is_per_engine_and_storage_is_the_fleets_shared_l2(batches):
    sig = KvSignals(clock=lambda: 0.0)
    a = EngineId("vllm-0", MODEL)
    for b in batches:
        sig.apply(a, b)
    idx = sig.index(MODEL)
    st = idx.engine(a.key).stats
    # three prompts of 62 blocks: each computed (cold), offloaded to the CPU tier, written to fs
    assert st.stored_blocks == {"GPU": 186, "CPU": 186, "STORAGE": 186}
    assert st.miss_blocks == {"cold": 186, "capacity": 0, "routing": 0} and st.external_hit_blocks == 0
    assert st.resident == {GPU: 186, CPU: 186}  # no STORAGE residency per engine
    assert len(idx.storage) == 186 and idx.resident_blocks() == 186 and idx.duplicated == 0
    # another engine gets the three prompts and reads every block from the shared L2: each is
    # promoted into its CPU tier (one CPU store per hash, as the capture's), then loaded onto its GPU.
    # None is a routing miss although vllm-0 still holds them.
    b_id = EngineId("vllm-1", MODEL)
    for seq, gpu in enumerate((batches[0], batches[3], batches[5])):
        promoted = [Stored([h], None, 0, "CPU", 0) for h in _hashes(gpu)]
        sig.apply(b_id, Batch(b"", 2 * seq, 30.0 + seq, 0, promoted, {}))
        sig.apply(b_id, dataclasses.replace(gpu, seq=2 * seq + 1))
    sb = idx.engine(b_id.key).stats
    assert (sb.l2_hit_blocks, sb.external_hit_blocks, sb.l2_hit_tokens) == (186, 186, 186 * BLOCK)
    assert sb.miss_blocks == {"cold": 0, "capacity": 0, "routing": 0}
    # a third engine computes the first prompt (no promotion: no read from the fs tier): routing
    # misses, vllm-0 held it
    sig.apply(EngineId("vllm-2", MODEL), batches[0])
    s2 = idx.engine(EngineId("vllm-2", MODEL).key).stats
    assert s2.l2_hit_blocks == 0 and s2.miss_blocks["routing"] == 62
    snap = sig.snapshot()
    fams = {f.name: f for f in build_families(snap)}
    l2 = {s.labels["pod"]: s.value for s in fams["tierpilot_kv_l2_hits"].samples if s.name.endswith("_total")}
    assert l2 == {"vllm-0": 0, "vllm-1": 186, "vllm-2": 0}
    (shared,) = fams["tierpilot_kv_shared_l2_blocks"].samples
    assert shared.value == 186


def test_a_block_promoted_from_the_fs_tier_is_an_l2_hit_and_a_cpu_copy_an_l1_hit(batches):
    sig = KvSignals(clock=lambda: 0.0)
    a, c = EngineId("vllm-0", MODEL), EngineId("vllm-2", MODEL)
    for b in batches:
        sig.apply(a, b)
    p1 = _hashes(batches[0])
    # vllm-2 reads prompt 1 back from the fs tier: promotion into its CPU tier, then onto its GPU
    sig.apply(c, Batch(b"", 0, 20.0, 0, [Stored([h], None, 0, "CPU", 0) for h in p1], {}))
    sig.apply(c, Batch(b"", 1, 20.1, 0, [Stored(p1, None, BLOCK, "GPU", 0)], {}))
    sc = sig.index(MODEL).engine(c.key).stats
    assert (sc.l2_hit_blocks, sc.external_hit_blocks) == (62, 62)
    # vllm-0 evicts prompt 1 from its GPU and sends it again: its own CPU copy (an offload, not a
    # promotion) serves it: an L1 hit
    sig.apply(a, Batch(b"", 9, 21.0, 0, [Removed(p1, "GPU", 0)], {}))
    sig.apply(a, Batch(b"", 10, 21.1, 0, [Stored(p1, None, BLOCK, "GPU", 0)], {}))
    sa = sig.index(MODEL).engine(a.key).stats
    assert (sa.l2_hit_blocks, sa.external_hit_blocks) == (0, 62)
    totals = sig.event_totals(MODEL)
    assert (totals.l1_hits, totals.l2_hits) == (62 * BLOCK, 62 * BLOCK)
    # a block removed from the fs tier is no longer in the shared L2: a CPU store of it is not a read
    # from there
    sig.apply(a, Batch(b"", 11, 22.0, 0, [Removed(p1[:2], "STORAGE", 0)], {}))
    d = EngineId("vllm-3", MODEL)
    sig.apply(d, Batch(b"", 0, 22.1, 0, [Stored([h], None, 0, "CPU", 0) for h in p1[:3]], {}))
    sig.apply(d, Batch(b"", 1, 22.2, 0, [Stored(p1[:3], None, BLOCK, "GPU", 0)], {}))
    sd = sig.index(MODEL).engine(d.key).stats
    assert (sd.l2_hit_blocks, sd.external_hit_blocks) == (1, 3)  # two copies from elsewhere: L1 hits
    assert sig.index(MODEL).storage.get(p1[0]) is None and len(sig.index(MODEL).storage) == 184


def test_l2_hits_seen_in_events_are_not_inferred_again():
    # 10 blocks of 32 seen as L2 hits, 20 capacity-miss tokens... the connector supplied 640 tokens:
    # 320 seen (L2), 64 L1, so 256 more L2 tokens are inferred from the capacity misses
    e0 = EventTotals()
    e1 = EventTotals(cold=100.0, capacity=300.0, routing=0.0, l1_hits=64.0, l2_hits=320.0)
    reading = estimate(MODEL, _Sample(0.0, 0.0, float("nan"), 0.0, e0), _Sample(10.0, 2000.0, float("nan"), 640.0, e1))
    assert reading is not None
    assert reading.l2_hit_tokens == 320.0 + 256.0
    assert reading.capacity_tokens == pytest.approx(300.0 - 256.0)
    only_events = estimate(MODEL, _Sample(0.0, 0.0, float("nan"), float("nan"), e0),
                           _Sample(10.0, 2000.0, float("nan"), float("nan"), e1))
    assert only_events is not None and only_events.l2_hit_tokens == 320.0 and only_events.capacity_tokens == 300.0
