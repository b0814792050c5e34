"""Wire format: the publisher's bytes match the reference, and the decoder reads both encodings,
older and newer field sets, bytes hashes, odd media, and skips bad events without losing others."""
from __future__ import annotations

import msgspec
import pytest

from agent.kvevents.wire import (
    Cleared,
    FrameError,
    PayloadError,
    Removed,
    Stored,
    decode_message,
    decode_payload,
    normalize_hash,
    normalize_medium,
)
from emulator.cluster.kv_publisher import (
    cleared_event,
    offset_endpoint,
    removed_event,
    stored_event,
    vllm_binds,
)

enc = msgspec.msgpack.encode
raw = msgspec.msgpack.decode


class KVEventBatch(msgspec.Struct, array_like=True, omit_defaults=True, gc=False):
    """vLLM's batch struct (`vllm/distributed/kv_events.py`, 0.9.1 to 0.33.0)."""

    ts: float
    events: list
    data_parallel_rank: int | None = None


def test_map_encoding_matches_vllm_033_shape() -> None:
    batch = KVEventBatch(12.5, [stored_event([7, 8], None, 2), removed_event([7]), cleared_event()], 3)
    ts, events, dp = raw(enc(batch))
    assert (ts, dp) == (12.5, 3)
    # required fields present even when null; defaulted fields omitted unless set
    assert events[0] == {"type": "BlockStored", "block_hashes": [7, 8], "parent_block_hash": None,
                         "token_ids": [7, 7, 8, 8], "block_size": 2, "lora_id": None, "medium": "GPU",
                         "lora_name": None, "group_idx": 0, "kv_cache_spec_kind": "full_attention"}
    assert events[1] == {"type": "BlockRemoved", "block_hashes": [7], "medium": "GPU", "group_idx": 0}
    assert events[2] == {"type": "AllBlocksCleared"}


def test_array_encoding_matches_vllm_023_shape() -> None:
    batch = KVEventBatch(1.0, [stored_event([5], 4, 1, "CPU", encoding="array", group_idx=None,
                                            spec_kind=None),
                               removed_event([5], "CPU", encoding="array", group_idx=None),
                               cleared_event("array")], 0)
    _, events, _ = raw(enc(batch))
    # every declared 0.23 field is written (1 tag + 11 fields), nulls included
    assert events[0] == ["BlockStored", [5], 4, [5], 1, None, "CPU", None, None, None, None, None]
    assert events[1] == ["BlockRemoved", [5], "CPU", None]
    assert events[2] == ["AllBlocksCleared"]


@pytest.mark.parametrize("encoding", ["map", "array"])
def test_decoder_reads_both_encodings(encoding: str) -> None:
    batch = KVEventBatch(2.0, [stored_event([1, 2**64 - 1], 9, 16, encoding=encoding),
                               removed_event([2], "cpu", encoding=encoding), cleared_event(encoding)], 1)
    b = decode_payload(enc(batch), b"kv@p@m", 42)
    assert (b.topic, b.seq, b.ts, b.dp_rank, b.rejected) == (b"kv@p@m", 42, 2.0, 1, {})
    assert b.events == [Stored([1, 2**64 - 1], 9, 16, "GPU", 0), Removed([2], "CPU", 0), Cleared()]


def test_old_short_arrays_and_newer_long_maps() -> None:
    # vLLM 0.10.1.1: BlockStored(block_hashes, parent, token_ids, block_size, lora_id), no medium
    old = enc([3.0, [["BlockStored", [11, 12], None, [0] * 8, 4, None], ["BlockRemoved", [11]]], None])
    b = decode_payload(old)
    assert b.events == [Stored([11, 12], None, 4, "GPU", None), Removed([11], "GPU", None)]
    assert b.dp_rank is None
    # a future vLLM with extra trailing fields / unknown keys still decodes
    longer = enc([3.0, [["BlockStored", [1], None, [0], 1, None, "GPU", None, None, 0, "x", None, "LOCAL", "o"]],
                        0])
    assert decode_payload(longer).events == [Stored([1], None, 1, "GPU", 0)]
    newer = enc([3.0, [{"type": "BlockRemoved", "block_hashes": [1], "medium": "GPU", "ownership": "x",
                        "brand_new_field": [1, 2]}], 0])
    assert decode_payload(newer).events == [Removed([1], "GPU", None)]


def test_bytes_hashes_are_reduced_to_their_last_eight_bytes() -> None:
    digest = bytes(range(32))
    payload = enc([1.0, [{"type": "BlockStored", "block_hashes": [digest, 5], "parent_block_hash": digest[:16],
                          "token_ids": [], "block_size": 16, "lora_id": None, "medium": None,
                          "lora_name": None}], 0])
    ev = decode_payload(payload).events[0]
    assert ev.hashes == [int.from_bytes(digest[-8:], "big"), 5]
    assert ev.parent == int.from_bytes(digest[8:16], "big")
    assert ev.medium == "GPU"


def test_normalisers() -> None:
    assert normalize_hash(-1) == 2**64 - 1
    assert normalize_hash(b"\x01" * 8) == 0x0101010101010101
    with pytest.raises(TypeError):
        normalize_hash(1.5)
    assert [normalize_medium(m) for m in (None, "cpu", " storage ", "cuda:0", "")] == \
        ["GPU", "CPU", "STORAGE", "OTHER", "GPU"]
    assert normalize_medium(b"GPU") == "OTHER" and normalize_medium("Memory-Tier-7") == "OTHER"
    assert normalize_medium(["GPU"]) == "OTHER"


def test_unknown_and_malformed_events_are_counted_and_the_rest_kept() -> None:
    payload = enc([5.0, [
        {"type": "BlockStored", "block_hashes": [1], "parent_block_hash": None, "token_ids": [1],
         "block_size": 1, "lora_id": None, "medium": "GPU", "lora_name": None},
        {"type": "KVCacheResized", "blocks": 10},  # unknown type
        ["BlockEvicted", [1]],  # unknown positional type
        {"type": "BlockRemoved"},  # missing block_hashes
        {"type": "BlockRemoved", "block_hashes": "nope", "medium": "GPU"},
        42,
        [],
        {"type": "BlockRemoved", "block_hashes": [1], "medium": "GPU"},
    ], 0])
    b = decode_payload(payload)
    assert b.events == [Stored([1], None, 1, "GPU", None), Removed([1], "GPU", None)]
    assert b.rejected == {"unknown_type": 2, "malformed_event": 4}


@pytest.mark.parametrize("payload", [b"", b"\xc1", enc({"ts": 1}), enc([1.0]), enc(["x", [], 0]), enc([1.0, 5, 0])])
def test_unusable_payloads_raise_payload_error(payload: bytes) -> None:
    with pytest.raises(PayloadError):
        decode_payload(payload)


def test_frames() -> None:
    good = [b"t", (7).to_bytes(8, "big"), enc([1.0, [], 0])]
    assert decode_message(good).seq == 7
    with pytest.raises(FrameError):
        decode_message(good[:2])
    with pytest.raises(FrameError):
        decode_message([b"t", b"\x00" * 7, good[2]])


def test_endpoint_rules_follow_vllm() -> None:
    assert vllm_binds("tcp://*:5557") and vllm_binds("ipc:///tmp/x") and vllm_binds("tcp://[::]:5557")
    assert not vllm_binds("tcp://indexer:5557")
    assert offset_endpoint("tcp://*:5557", 2) == "tcp://*:5559"
    assert offset_endpoint("tcp://*:0", 2) == "tcp://*:0"
    assert offset_endpoint("inproc://ev", 1) == "inproc://ev_dp1"
