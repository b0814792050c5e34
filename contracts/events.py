"""Block events the twin emits: the contract between the twin, the emulated pods' KV-event
publishers (vLLM 0.33 wire format) and the agent's KV-event tests.

The twin calls an injected `event_sink(event)` for each change of a pod's private tiers, in
time order. Hashes are the twin's chained chunk hashes (unsigned 64-bit ints), one per full
chunk; `block_size` is the chunk size in tokens. `medium` follows vLLM's values: "GPU" for the
vLLM prefix cache, "CPU" for LMCache's CPU tier. The shared L2 pool emits no events (vLLM's
stream only covers what the engine reports).
"""
from __future__ import annotations

import dataclasses
from collections.abc import Callable


@dataclasses.dataclass(frozen=True, slots=True)
class BlockStored:
    ts: float  # twin time, seconds since the workload start
    pod: str
    block_hashes: tuple[int, ...]  # prefix order; chain continues parent_block_hash
    parent_block_hash: int | None  # None when the run starts at the first chunk of the prompt
    block_size: int  # tokens per block (the chunk size)
    medium: str  # "GPU" or "CPU"


@dataclasses.dataclass(frozen=True, slots=True)
class BlockRemoved:
    ts: float
    pod: str
    block_hashes: tuple[int, ...]  # the GPU pool emits one hash per event; so does the twin
    medium: str


@dataclasses.dataclass(frozen=True, slots=True)
class AllBlocksCleared:
    ts: float
    pod: str  # the pod restarted or reset its prefix cache; everything it held is gone


TwinEvent = BlockStored | BlockRemoved | AllBlocksCleared
EventSink = Callable[[TwinEvent], None]
