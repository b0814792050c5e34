"""A bounded ring of stored blocks: per block its hash, its engine and its message, in three flat
numpy arrays (20 bytes a block, whatever the messages' sizes: a deque of one small array per
message costs ~110 bytes a block when messages hold a few blocks each, as vLLM's often do).

The ring grows by doubling up to `max_blocks`; beyond it the oldest messages go whole (a
message's blocks are looked up together, so a partial one would skew the curve). Not
thread-safe: its owner (store_curve.StoreStream) holds the lock.
"""
from __future__ import annotations

import numpy as np

INITIAL_BLOCKS = 4096


class BlockRing:
    def __init__(self, max_blocks: int, initial: int = INITIAL_BLOCKS) -> None:
        self.max_blocks = max_blocks
        cap = max(1, min(initial, max_blocks))
        self.hashes = np.empty(cap, dtype=np.uint64)
        self.engines = np.empty(cap, dtype=np.int32)
        self.batches = np.empty(cap, dtype=np.int64)
        self.start = 0
        self.count = 0

    @property
    def capacity(self) -> int:
        return len(self.hashes)

    @property
    def nbytes(self) -> int:
        return self.hashes.nbytes + self.engines.nbytes + self.batches.nbytes

    def _slices(self) -> list[slice]:
        """The kept entries' positions, oldest first: one slice, or two when they wrap."""
        end = self.start + self.count
        if end <= self.capacity:
            return [slice(self.start, end)]
        return [slice(self.start, self.capacity), slice(0, end - self.capacity)]

    def ordered(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Copies of (hashes, engines, batches), oldest first."""
        parts = self._slices()
        return tuple(np.concatenate([a[s] for s in parts]) for a in (self.hashes, self.engines, self.batches))  # type: ignore[return-value]

    def _reset(self, hashes: np.ndarray, engines: np.ndarray, batches: np.ndarray, capacity: int) -> None:
        n = len(hashes)
        self.hashes = np.empty(capacity, dtype=np.uint64)
        self.engines = np.empty(capacity, dtype=np.int32)
        self.batches = np.empty(capacity, dtype=np.int64)
        self.hashes[:n], self.engines[:n], self.batches[:n] = hashes, engines, batches
        self.start, self.count = 0, n

    def _drop_oldest(self, n: int) -> None:
        """Drop the `n` oldest entries, then the rest of the message the last of them belonged to."""
        last = self.batches[(self.start + n - 1) % self.capacity]
        self.start = (self.start + n) % self.capacity
        self.count -= n
        for s in self._slices():  # batch ids are non-decreasing oldest first
            seg = self.batches[s]
            k = int(np.searchsorted(seg, last, side="right"))
            self.start = (self.start + k) % self.capacity
            self.count -= k
            if k < len(seg):
                break
        if self.count == 0:
            self.start = 0

    def push(self, hashes: np.ndarray, engine: int, batch: int) -> None:
        """One message's blocks (at most `max_blocks` of them: the newest are kept)."""
        hashes = hashes[-self.max_blocks:]
        n = len(hashes)
        if self.count + n > self.capacity and self.capacity < self.max_blocks:
            want = min(self.max_blocks, max(self.count + n, 2 * self.capacity))
            self._reset(*self.ordered(), capacity=want)
        over = self.count + n - self.capacity
        if over > 0:
            self._drop_oldest(over)
        at = (self.start + self.count) % self.capacity
        first = min(n, self.capacity - at)
        for lo, hi, dst in ((0, first, at), (first, n, 0)):
            if hi > lo:
                self.hashes[dst:dst + hi - lo] = hashes[lo:hi]
                self.engines[dst:dst + hi - lo] = engine
                self.batches[dst:dst + hi - lo] = batch
        self.count += n

    def drop_engine(self, engine: int) -> None:
        hashes, engines, batches = self.ordered()
        keep = engines != engine
        self._reset(hashes[keep], engines[keep], batches[keep], capacity=self.capacity)
