"""The capacity curve's store stream keeps the last `max_blocks` stored blocks per model in flat
arrays: the same blocks, engines and messages as a list of whole messages would keep (the oldest
messages go whole), at 20 bytes a block however small the messages are."""
from __future__ import annotations

import tracemalloc

import numpy as np
import pytest

from agent.kvevents.store_curve import StoreStream
from agent.kvevents.store_ring import BlockRing


def _reference(messages: list[tuple[int, int, list[int]]], cap: int) -> tuple[list[int], list[int], list[int]]:
    """Whole messages, oldest dropped first until the rest fits (the stream's definition)."""
    kept: list[tuple[int, int, list[int]]] = []
    for eid, seq, hashes in messages:
        if eid < 0:  # an engine restart: its blocks go
            kept = [m for m in kept if m[0] != -eid - 1]
            continue
        kept.append((eid, seq, hashes[-cap:]))
        while sum(len(m[2]) for m in kept) > cap:
            kept.pop(0)
    return ([h for m in kept for h in m[2]], [m[0] for m in kept for _ in m[2]],
            [m[1] for m in kept for _ in m[2]])


@pytest.mark.parametrize("seed", range(8))
def test_the_ring_keeps_what_whole_messages_would(seed: int) -> None:
    rng = np.random.default_rng(seed)
    cap = int(rng.integers(5, 300))
    ring = BlockRing(cap, initial=int(rng.integers(1, 8)))
    messages: list[tuple[int, int, list[int]]] = []
    for seq in range(400):
        if rng.random() < 0.03:
            eid = int(rng.integers(0, 3))
            messages.append((-eid - 1, seq, []))
            ring.drop_engine(eid)
        else:
            eid = int(rng.integers(0, 3))
            hashes = rng.integers(0, 2**63, int(rng.integers(1, cap // 2 + 3))).tolist()
            messages.append((eid, seq, hashes))
            ring.push(np.array(hashes, dtype=np.uint64), eid, seq)
        got = ring.ordered()
        want = _reference(messages, cap)
        assert [got[0].tolist(), got[1].tolist(), got[2].tolist()] == [want[0], want[1], want[2]], seq
        assert ring.count == len(want[0]) <= cap and ring.capacity <= cap


def test_a_million_blocks_in_small_messages_hold_20_bytes_each() -> None:
    rng = np.random.default_rng(0)
    sizes = rng.integers(1, 7, 400_000)
    hashes = rng.integers(0, 2**63, int(sizes.sum()), dtype=np.uint64)
    stream = StoreStream(max_blocks=1_000_000)
    tracemalloc.start()
    try:
        at = 0
        for i, n in enumerate(sizes.tolist()):
            stream.add("m", f"pod-{i % 4}", hashes[at:at + n].tolist(), 16)
            at += n
        held, _peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert stream.blocks("m") > 990_000
    assert stream.nbytes() == 20 * 1_000_000
    assert held < 30e6, f"{held / 1e6:.0f} MB held for {stream.blocks('m'):,} blocks"
