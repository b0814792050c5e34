"""vLLM's KV-event wire format release by release, for the emulated publisher.

Each `WireFormat` says how one vLLM release encodes a batch and its events and how its replay
ROUTER frames its answers. Sources (vLLM `vllm/distributed/kv_events.py`, docs/kv-events.md has
the table with commits and versions):

- 0.9.0: batch `[ts, events]` (no data-parallel rank); events positional arrays, tag first;
  `BlockStored(block_hashes, parent_block_hash, token_ids, block_size, lora_id)`,
  `BlockRemoved(block_hashes)`; hashes are Python ints from the `builtin` hash (signed 64-bit).
- 0.9.1 (vLLM PR #18925): `data_parallel_rank` appended to the batch.
- 0.10.2: `medium` on both events; hashes become `ExternalBlockHash` (int or bytes).
- 0.20.0: `lora_name`, `extra_keys`, `group_idx`; `BlockRemoved.group_idx`.
- 0.22.0 / 0.23.0: `kv_cache_spec_kind`, `kv_cache_spec_sliding_window`; still positional.
- 0.24.0: events become msgpack maps (`"type"` tag; defaulted fields omitted). The batch stays
  an array.
- 0.26.0: the replay answer gains a topic frame: `[id, "", topic, seq, payload]` and the end
  marker `[id, "", "", -1, ""]`; before it, `[id, "", seq, payload]` and `[id, "", -1, ""]`.
- 0.28.0: `locality`; 0.33.0: `ownership` (both events), `session_id`, `lookahead_token_ids`.

Events are built as plain lists and dicts (msgspec encodes them exactly as vLLM's structs: an
array-like struct writes every declared field in order, nulls included; a map struct writes its
tag, its required fields, and the defaulted fields that differ from their default).
"""
from __future__ import annotations

import dataclasses
import hashlib
from collections.abc import Sequence
from typing import Any, Literal

HashKind = Literal["unsigned", "signed", "bytes"]

_STORED_BASE = ("block_hashes", "parent_block_hash", "token_ids", "block_size", "lora_id")
_REQUIRED = {"block_hashes", "parent_block_hash", "token_ids", "block_size", "lora_id", "medium", "lora_name"}


@dataclasses.dataclass(frozen=True)
class WireFormat:
    release: str
    events: Literal["array", "map"]
    stored_fields: tuple[str, ...]
    removed_fields: tuple[str, ...]
    batch_dp_rank: bool = True
    replay_topic: bool = False
    hashes: HashKind = "unsigned"

    # -- hashes ----------------------------------------------------------------------------
    def hash_value(self, h: int | bytes) -> int | bytes:
        """A uint64 block hash as this release publishes it: masked unsigned int, the signed
        int64 of the `builtin` hash, or a 32-byte digest whose last 8 bytes are the uint64."""
        if isinstance(h, bytes):
            return h
        h &= (1 << 64) - 1
        if self.hashes == "signed":
            return h - (1 << 64) if h >= 1 << 63 else h
        if self.hashes == "bytes":
            return hashlib.sha256(h.to_bytes(8, "big")).digest()[:24] + h.to_bytes(8, "big")
        return h

    # -- events ----------------------------------------------------------------------------
    def _event(self, tag: str, fields: tuple[str, ...], values: dict[str, Any]) -> Any:
        if self.events == "array":
            return [tag, *(values.get(f) for f in fields)]
        out: dict[str, Any] = {"type": tag}
        for f in fields:
            v = values.get(f)
            if f in _REQUIRED or f == "block_hashes" or v is not None:
                out[f] = v
        return out

    def stored(self, hashes: Sequence[int | bytes], parent: int | bytes | None, block_size: int,
               medium: str | None = "GPU", *, token_ids: list[int] | None = None,
               group_idx: int | None = 0, spec_kind: str | None = "full_attention") -> Any:
        if token_ids is None:  # synthetic tokens: the twin has hashes, not tokens
            token_ids = [(h if isinstance(h, int) else len(h)) & 0x7FFF for h in hashes for _ in range(block_size)]
        values = {
            "block_hashes": [self.hash_value(h) for h in hashes],
            "parent_block_hash": None if parent is None else self.hash_value(parent),
            "token_ids": token_ids, "block_size": block_size, "lora_id": None, "medium": medium,
            "lora_name": None, "group_idx": group_idx, "kv_cache_spec_kind": spec_kind,
        }
        return self._event("BlockStored", self.stored_fields, values)

    def removed(self, hashes: Sequence[int | bytes], medium: str | None = "GPU", *,
                group_idx: int | None = 0) -> Any:
        values = {"block_hashes": [self.hash_value(h) for h in hashes], "medium": medium, "group_idx": group_idx}
        return self._event("BlockRemoved", self.removed_fields, values)

    def cleared(self) -> Any:
        return ["AllBlocksCleared"] if self.events == "array" else {"type": "AllBlocksCleared"}

    def batch(self, ts: float, events: list[Any], dp_rank: int) -> list[Any]:
        return [ts, events, dp_rank] if self.batch_dp_rank else [ts, events]

    def with_hashes(self, kind: HashKind) -> WireFormat:
        return dataclasses.replace(self, hashes=kind)


_S20 = (*_STORED_BASE, "medium", "lora_name", "extra_keys", "group_idx")
_S23 = (*_S20, "kv_cache_spec_kind", "kv_cache_spec_sliding_window")
_S28 = (*_S23, "locality")
_S33 = (*_S28, "ownership", "session_id", "lookahead_token_ids")

RELEASES: dict[str, WireFormat] = {f.release: f for f in (
    WireFormat("0.9.0", "array", _STORED_BASE, ("block_hashes",), batch_dp_rank=False, hashes="signed"),
    WireFormat("0.10.1", "array", _STORED_BASE, ("block_hashes",), hashes="signed"),
    WireFormat("0.11.0", "array", (*_STORED_BASE, "medium"), ("block_hashes", "medium")),
    WireFormat("0.20.0", "array", _S20, ("block_hashes", "medium", "group_idx")),
    WireFormat("0.23.0", "array", _S23, ("block_hashes", "medium", "group_idx")),
    WireFormat("0.24.0", "map", _S23, ("block_hashes", "medium", "group_idx")),
    WireFormat("0.25.0", "map", _S23, ("block_hashes", "medium", "group_idx")),
    WireFormat("0.26.0", "map", _S23, ("block_hashes", "medium", "group_idx"), replay_topic=True),
    WireFormat("0.28.0", "map", _S28, ("block_hashes", "medium", "group_idx", "locality"), replay_topic=True),
    WireFormat("0.33.0", "map", _S33, ("block_hashes", "medium", "group_idx", "locality", "ownership"),
               replay_topic=True),
)}
LATEST = "0.33.0"


def wire_format(release: str = LATEST, hashes: HashKind | None = None) -> WireFormat:
    """The format of a release (`"0.23.0"`, or just `"0.23"`), optionally with another hash kind."""
    fmt = RELEASES.get(release) or RELEASES.get(f"{release}.0")
    if fmt is None:
        raise ValueError(f"unknown vLLM release {release!r}; known: {', '.join(RELEASES)}")
    return fmt if hashes is None else fmt.with_hashes(hashes)
