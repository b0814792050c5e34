"""A compact, bounded "ever seen" set of 64-bit block hashes: a generational Bloom filter.

Each generation is a Bloom filter sized for `capacity` hashes at false-positive rate `fp_rate`
(bits rounded up to a power of two). When the young generation is full a new one starts and,
beyond `generations`, the oldest is dropped: hashes not stored again within about
`capacity x (generations - 1)` distinct hashes are forgotten (LRU-like ageing). Memory is fixed:
`generations x bits / 8` bytes. Lookups and inserts are vectorised over a whole message.

A false positive makes a never-seen block look seen (a cold miss counted as a non-cold one); at
the default 0.1% it is far below the 2-point tolerance of the overlap signal.
"""
from __future__ import annotations

import math

import numpy as np

_MIX1 = np.uint64(0xBF58476D1CE4E5B9)
_MIX2 = np.uint64(0x94D049BB133111EB)


def _mix(h: np.ndarray) -> np.ndarray:
    """splitmix64 finaliser: spreads non-uniform hashes (e.g. small counters) over 64 bits."""
    h = h ^ (h >> np.uint64(30))
    h = h * _MIX1
    h = h ^ (h >> np.uint64(27))
    h = h * _MIX2
    return h ^ (h >> np.uint64(31))


class SeenSketch:
    def __init__(self, capacity: int = 8_000_000, fp_rate: float = 0.001, generations: int = 2) -> None:
        if capacity < 1:
            raise ValueError(f"capacity must be >= 1, got {capacity}")
        if not 0.0 < fp_rate < 0.5:
            raise ValueError(f"fp_rate must be in (0, 0.5), got {fp_rate}")
        if generations < 1:
            raise ValueError(f"generations must be >= 1, got {generations}")
        want_bits = -capacity * math.log(fp_rate) / (math.log(2) ** 2)
        self.bits = max(64, 1 << math.ceil(math.log2(want_bits)))
        self.k = max(1, round(self.bits / capacity * math.log(2)))
        self.capacity = capacity
        self.generations = generations
        self._mask = np.uint64(self.bits - 1)
        self._offsets = np.arange(self.k, dtype=np.uint64)[None, :]
        self._gens: list[np.ndarray] = [np.zeros(self.bits // 8, dtype=np.uint8)]
        self._young_count = 0
        self.rotations = 0

    @property
    def nbytes(self) -> int:
        return sum(g.nbytes for g in self._gens)

    def _positions(self, hashes: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        h = _mix(hashes)
        h1 = h & np.uint64(0xFFFFFFFF)
        h2 = (h >> np.uint64(32)) | np.uint64(1)
        pos = (h1[:, None] + self._offsets * h2[:, None]) & self._mask  # (n, k) bit positions
        return (pos >> np.uint64(3)).astype(np.intp), (np.uint8(1) << (pos & np.uint64(7)).astype(np.uint8))

    def check_and_add(self, hashes: np.ndarray) -> np.ndarray:
        """For each hash, whether it was (probably) seen before this call; then adds them all to
        the young generation. Duplicates inside one call all report the state before the call."""
        if hashes.size == 0:
            return np.zeros(0, dtype=bool)
        byte_idx, bit = self._positions(hashes.astype(np.uint64, copy=False))
        seen, young_had = self._seen(byte_idx, bit)
        young = self._gens[-1]
        np.bitwise_or.at(young, byte_idx.ravel(), bit.ravel())
        self._young_count += int(hashes.shape[0] - np.count_nonzero(young_had))
        if self._young_count >= self.capacity:
            self._rotate()
        return seen

    def contains(self, hashes: np.ndarray) -> np.ndarray:
        if hashes.size == 0:
            return np.zeros(0, dtype=bool)
        return self._seen(*self._positions(hashes.astype(np.uint64, copy=False)))[0]

    def _seen(self, byte_idx: np.ndarray, bit: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Whether every probe bit of each hash is set in any generation, and in the young one."""
        seen: np.ndarray | None = None
        for gen in self._gens:
            had = ((gen[byte_idx] & bit) != 0).all(axis=1)
            seen = had if seen is None else seen | had
        return seen, had  # type: ignore[return-value]  # there is always one generation at least

    def _rotate(self) -> None:
        self._gens.append(np.zeros(self.bits // 8, dtype=np.uint8))
        if len(self._gens) > self.generations:
            self._gens.pop(0)
        self._young_count = 0
        self.rotations += 1

    def clear(self) -> None:
        self._gens = [np.zeros(self.bits // 8, dtype=np.uint8)]
        self._young_count = 0
