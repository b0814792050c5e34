"""Decode vLLM KV-event messages (pure functions, no I/O).

A message is three ZMQ frames: `[topic, seq (8 bytes, unsigned big-endian), payload]`. The
payload is a msgpack array `[ts, events, data_parallel_rank]`; each event is either a positional
array whose element 0 is the type name (vLLM <= 0.23) or a map with a `"type"` key (vLLM >= 0.24).
See docs/kv-events.md and the reference `kv-events.md` section 1.

Decoding tries the fast typed paths first (whole batch, one C call, token ids never materialised),
then the same with signed or bytes hashes normalised in Python, and falls back to decoding event
by event, so one unknown or malformed event is counted and
skipped while the rest of the batch is kept.
"""
from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Annotated, Any

import msgspec

MASK64 = (1 << 64) - 1
END_SEQ_BYTES = (-1).to_bytes(8, "big", signed=True)  # the replay ROUTER's end marker
U64 = Annotated[int, msgspec.Meta(ge=0)]  # msgspec ints top out at 2**64 - 1
KNOWN_TYPES = ("BlockStored", "BlockRemoved", "AllBlocksCleared")


class FrameError(ValueError):
    """The multipart message does not have the vLLM framing (3 frames, 8-byte sequence)."""


class PayloadError(ValueError):
    """The payload is not a decodable `[ts, events, data_parallel_rank]` batch."""


# -- normalised records handed to the index -----------------------------------------------------
# The map encoding (vLLM >= 0.24) decodes straight into these (one C call per batch, token ids
# skipped, wire names renamed); the other encodings are converted into them. `medium` is
# normalised after decoding (`decode_payload`). gc=False: a record holds a list of ints and a
# string, it cannot be part of a reference cycle.
class Stored(msgspec.Struct, tag="BlockStored", tag_field="type", gc=False):
    hashes: list[U64] = msgspec.field(name="block_hashes")  # uint64, prefix order
    parent: U64 | None = msgspec.field(default=None, name="parent_block_hash")
    block_size: int = 0
    medium: Any = None  # normalised: upper case, None -> "GPU" (a str once decoded)
    group: int | None = msgspec.field(default=None, name="group_idx")


class Removed(msgspec.Struct, tag="BlockRemoved", tag_field="type", gc=False):
    hashes: list[U64] = msgspec.field(name="block_hashes")
    medium: Any = None
    group: int | None = msgspec.field(default=None, name="group_idx")


class Cleared(msgspec.Struct, tag="AllBlocksCleared", tag_field="type", gc=False):
    pass


Event = Stored | Removed | Cleared


@dataclasses.dataclass(slots=True)
class Batch:
    """One decoded message. `rejected` counts events skipped, by reason."""

    topic: bytes
    seq: int
    ts: float
    dp_rank: int | None
    events: list[Event]
    rejected: dict[str, int]


# -- normalisation helpers ---------------------------------------------------------------------
def normalize_hash(value: Any) -> int:
    """vLLM's ExternalBlockHash -> uint64: ints are masked to 64 bits, bytes give their last
    8 bytes big-endian (what vLLM publishes when int hashes are on, and what llm-d does)."""
    if isinstance(value, bool):
        raise TypeError("a block hash cannot be a bool")
    if isinstance(value, int):
        return value & MASK64
    if isinstance(value, (bytes, bytearray, memoryview)):
        raw = bytes(value)
        if not raw:
            raise ValueError("empty block hash")
        return int.from_bytes(raw[-8:], "big")
    raise TypeError(f"a block hash must be int or bytes, got {type(value).__name__}")


KNOWN_MEDIA = frozenset(("GPU", "CPU", "STORAGE"))  # vLLM's MEDIUM_GPU, MEDIUM_CPU, MEDIUM_STORAGE


def normalize_medium(value: Any) -> str:
    """vLLM's `medium` is a free string: upper-case it, treat null as the GPU pool, and count any
    value outside vLLM's three constants as `OTHER` (one label value, however many strings a
    connector invents)."""
    if value is None:
        return "GPU"
    if not isinstance(value, str):
        return "OTHER"  # a list or map must not reach a set lookup (unhashable)
    if value in KNOWN_MEDIA:
        return value
    text = value.strip().upper()
    if not text:
        return "GPU"
    return text if text in KNOWN_MEDIA else "OTHER"


def decode_seq(raw: bytes) -> int:
    if len(raw) != 8:
        raise FrameError(f"sequence frame must be 8 bytes, got {len(raw)}")
    return int.from_bytes(raw, "big", signed=False)


# -- typed structs: fast paths -------------------------------------------------------------------
class _ArrStored(msgspec.Struct, tag="BlockStored", array_like=True):
    block_hashes: list[U64]
    parent_block_hash: U64 | None = None
    token_ids: msgspec.Raw = msgspec.Raw(b"")
    block_size: int = 0
    lora_id: msgspec.Raw = msgspec.Raw(b"")
    medium: Any = None
    lora_name: msgspec.Raw = msgspec.Raw(b"")
    extra_keys: msgspec.Raw = msgspec.Raw(b"")
    group_idx: int | None = None


class _ArrRemoved(msgspec.Struct, tag="BlockRemoved", array_like=True):
    block_hashes: list[U64]
    medium: Any = None
    group_idx: int | None = None


class _ArrCleared(msgspec.Struct, tag="AllBlocksCleared", array_like=True):
    pass


Hash = int | bytes  # signed ints (vLLM <= 0.10.1 `builtin` hash) and digests: normalised after decoding


class _LooseArrStored(msgspec.Struct, tag="BlockStored", array_like=True):
    block_hashes: list[Hash]
    parent_block_hash: Hash | None = None
    token_ids: msgspec.Raw = msgspec.Raw(b"")
    block_size: int = 0
    lora_id: msgspec.Raw = msgspec.Raw(b"")
    medium: Any = None
    lora_name: msgspec.Raw = msgspec.Raw(b"")
    extra_keys: msgspec.Raw = msgspec.Raw(b"")
    group_idx: int | None = None


class _LooseArrRemoved(msgspec.Struct, tag="BlockRemoved", array_like=True):
    block_hashes: list[Hash]
    medium: Any = None
    group_idx: int | None = None


class _LooseMapStored(msgspec.Struct, tag="BlockStored", tag_field="type"):
    block_hashes: list[Hash]
    parent_block_hash: Hash | None = None
    block_size: int = 0
    medium: Any = None
    group_idx: int | None = None


class _LooseMapRemoved(msgspec.Struct, tag="BlockRemoved", tag_field="type"):
    block_hashes: list[Hash]
    medium: Any = None
    group_idx: int | None = None


class _LooseMapBatch(msgspec.Struct, array_like=True):
    ts: float
    events: list[_LooseMapStored | _LooseMapRemoved | Cleared]
    data_parallel_rank: int | None = None


class _LooseArrBatch(msgspec.Struct, array_like=True):
    ts: float
    events: list[_LooseArrStored | _LooseArrRemoved | _ArrCleared]
    data_parallel_rank: int | None = None


class _MapBatch(msgspec.Struct, array_like=True):
    ts: float
    events: list[Stored | Removed | Cleared]
    data_parallel_rank: int | None = None


class _ArrBatch(msgspec.Struct, array_like=True):
    ts: float
    events: list[_ArrStored | _ArrRemoved | _ArrCleared]
    data_parallel_rank: int | None = None


class _RawBatch(msgspec.Struct, array_like=True):
    ts: float
    events: list[msgspec.Raw]
    data_parallel_rank: Any = None


class _RawMapBatch(msgspec.Struct):
    """The batch as a map (one vLLM commit declares `EventBatch` without `array_like`)."""

    ts: float
    events: list[msgspec.Raw]
    data_parallel_rank: Any = None


_MAP_DECODER = msgspec.msgpack.Decoder(_MapBatch)
_ARR_DECODER = msgspec.msgpack.Decoder(_ArrBatch)
_LOOSE_MAP_DECODER = msgspec.msgpack.Decoder(_LooseMapBatch)
_LOOSE_ARR_DECODER = msgspec.msgpack.Decoder(_LooseArrBatch)
_RAW_DECODER = msgspec.msgpack.Decoder(_RawBatch)
_RAW_MAP_DECODER = msgspec.msgpack.Decoder(_RawMapBatch)
_ANY_DECODER = msgspec.msgpack.Decoder()


def _from_array(ev: Any) -> Event:
    if isinstance(ev, _ArrStored):
        return Stored(ev.block_hashes, ev.parent_block_hash, ev.block_size,
                      normalize_medium(ev.medium), ev.group_idx)
    if isinstance(ev, _ArrRemoved):
        return Removed(ev.block_hashes, normalize_medium(ev.medium), ev.group_idx)
    return Cleared()


def _from_array_all(events: list[Any]) -> list[Event]:
    return [_from_array(e) for e in events]


def _normalise_media(events: list[Event]) -> list[Event]:
    """Normalise `medium` in place on records decoded straight from the map encoding."""
    for ev in events:
        if type(ev) is not Cleared:
            m = ev.medium  # type: ignore[union-attr]
            if m is None:  # vLLM's default, the GPU pool: normalize_medium's answer, without the call
                ev.medium = "GPU"  # type: ignore[union-attr]
            elif type(m) is not str or m not in KNOWN_MEDIA:
                ev.medium = normalize_medium(m)  # type: ignore[union-attr]
    return events


def _from_loose(ev: Any) -> Event:
    """Like `_from_array`, normalising signed and bytes hashes (raises ValueError on an empty
    digest, which sends the batch to the event-by-event path)."""
    if isinstance(ev, (_LooseMapStored, _LooseArrStored)):
        parent = ev.parent_block_hash
        return Stored([normalize_hash(h) for h in ev.block_hashes], None if parent is None else normalize_hash(parent),
                      ev.block_size, normalize_medium(ev.medium), ev.group_idx)
    if isinstance(ev, (_LooseMapRemoved, _LooseArrRemoved)):
        return Removed([normalize_hash(h) for h in ev.block_hashes], normalize_medium(ev.medium), ev.group_idx)
    return Cleared()


# -- slow path: one event at a time, tolerant ---------------------------------------------------
def _opt_int(value: Any, name: str) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be an int or null")
    return value


def _hash_list(value: Any) -> list[int]:
    if not isinstance(value, list):
        raise TypeError("block_hashes must be a list")
    return [normalize_hash(h) for h in value]


def _event_from_generic(obj: Any) -> Event:
    """Build an event from a generically decoded map or positional array; raises KeyError for an
    unknown type and ValueError/TypeError for a malformed event."""
    if isinstance(obj, dict):
        kind = obj.get("type")
        get = obj.get
        fields = {
            "BlockStored": lambda: Stored(
                _hash_list(obj["block_hashes"]),
                None if get("parent_block_hash") is None else normalize_hash(get("parent_block_hash")),
                _opt_int(get("block_size"), "block_size") or 0,
                normalize_medium(get("medium")),
                _opt_int(get("group_idx"), "group_idx"),
            ),
            "BlockRemoved": lambda: Removed(
                _hash_list(obj["block_hashes"]), normalize_medium(get("medium")),
                _opt_int(get("group_idx"), "group_idx"),
            ),
            "AllBlocksCleared": Cleared,
        }
    elif isinstance(obj, list) and obj:
        kind = obj[0]
        at = (lambda i: obj[i] if len(obj) > i else None)
        fields = {
            "BlockStored": lambda: Stored(
                _hash_list(obj[1]),
                None if at(2) is None else normalize_hash(at(2)),
                _opt_int(at(4), "block_size") or 0,
                normalize_medium(at(6)),
                _opt_int(at(9), "group_idx"),
            ),
            "BlockRemoved": lambda: Removed(
                _hash_list(obj[1]), normalize_medium(at(2)), _opt_int(at(3), "group_idx"),
            ),
            "AllBlocksCleared": Cleared,
        }
    else:
        raise ValueError("an event must be a map or a non-empty array")
    if not isinstance(kind, str):
        raise TypeError("event type tag missing")
    if kind not in fields:
        raise KeyError(kind)
    try:
        return fields[kind]()
    except (KeyError, IndexError) as exc:
        raise ValueError(f"{kind}: missing field {exc}") from exc


def _decode_slow(payload: bytes, topic: bytes, seq: int) -> Batch:
    try:
        raw = _RAW_DECODER.decode(payload)
    except msgspec.ValidationError as exc:
        try:
            raw = _RAW_MAP_DECODER.decode(payload)
        except (msgspec.DecodeError, msgspec.ValidationError):
            raise PayloadError(str(exc)) from exc
    except msgspec.DecodeError as exc:
        raise PayloadError(str(exc)) from exc
    dp = raw.data_parallel_rank if isinstance(raw.data_parallel_rank, int) else None
    events: list[Event] = []
    rejected: dict[str, int] = {}
    for item in raw.events:
        try:
            events.append(_event_from_generic(_ANY_DECODER.decode(item)))
        except KeyError:
            rejected["unknown_type"] = rejected.get("unknown_type", 0) + 1
        except (ValueError, TypeError, msgspec.DecodeError):
            rejected["malformed_event"] = rejected.get("malformed_event", 0) + 1
    return Batch(topic, seq, raw.ts, dp, events, rejected)


# -- entry points --------------------------------------------------------------------------------
def peek_ts(payload: bytes) -> float:
    """The batch's `ts` without decoding its events (they stay raw slices of `payload`), so a
    queued message costs its wire bytes, not the several times more its decoded hash lists take.
    Raises PayloadError when the payload is not a batch."""
    for decoder in (_RAW_DECODER, _RAW_MAP_DECODER):
        try:
            return float(decoder.decode(payload).ts)
        except msgspec.ValidationError:
            continue
        except msgspec.DecodeError as exc:
            raise PayloadError(str(exc)) from exc
    raise PayloadError("not a [ts, events, data_parallel_rank] batch")


def decode_payload(payload: bytes, topic: bytes = b"", seq: int = 0) -> Batch:
    """Decode one batch payload in either encoding. Raises PayloadError if the batch itself is
    unusable; unknown or malformed events inside a usable batch are counted in `rejected`."""
    for decoder, events in ((_MAP_DECODER, _normalise_media), (_ARR_DECODER, _from_array_all)):
        try:
            b = decoder.decode(payload)
        except msgspec.ValidationError:
            continue
        except msgspec.DecodeError as exc:
            raise PayloadError(str(exc)) from exc
        return Batch(topic, seq, b.ts, b.data_parallel_rank, events(b.events), {})
    for decoder in (_LOOSE_MAP_DECODER, _LOOSE_ARR_DECODER):
        try:
            b = decoder.decode(payload)
            return Batch(topic, seq, b.ts, b.data_parallel_rank, [_from_loose(e) for e in b.events], {})
        except (msgspec.ValidationError, ValueError):
            continue
    return _decode_slow(payload, topic, seq)


def split_replay(frames: Sequence[bytes], topic: bytes = b"") -> tuple[bytes, bytes, bytes] | None:
    """One reply read on a DEALER from vLLM's replay ROUTER -> (topic, seq frame, payload), or None
    when it has neither shape. vLLM >= 0.26 sends `[b"", topic, seq, payload]`; releases up to
    0.25.x send `[b"", seq, payload]` (no topic frame: `topic` is used). The end marker is the
    same in both with seq = -1 (signed) and an empty payload (and an empty topic from 0.26)."""
    if len(frames) == 4 and frames[0] == b"" and len(frames[2]) == 8:
        return bytes(frames[1]), bytes(frames[2]), bytes(frames[3])
    if len(frames) == 3 and frames[0] == b"" and len(frames[1]) == 8:
        return topic, bytes(frames[1]), bytes(frames[2])
    return None


def split_frames(frames: Sequence[bytes]) -> tuple[bytes, int, bytes]:
    """`[topic, seq, payload]` -> (topic, seq, payload); FrameError if the framing is wrong."""
    if len(frames) != 3:
        raise FrameError(f"expected 3 frames [topic, seq, payload], got {len(frames)}")
    topic, seq_raw, payload = (bytes(f) for f in frames)
    return topic, decode_seq(seq_raw), payload


def decode_message(frames: Sequence[bytes]) -> Batch:
    topic, seq, payload = split_frames(frames)
    return decode_payload(payload, topic, seq)
