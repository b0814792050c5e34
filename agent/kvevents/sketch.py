"""A compact, bounded "ever seen" set of 64-bit block hashes: a generational Bloom filter.

Each generation is a Bloom filter sized for `capacity` hashes at false-positive rate `fp_rate`
(bits rounded up to a power of two). When the young generation is full a new one starts and,
beyond `generations`, the oldest is dropped: hashes not stored again within about
`capacity x (generations - 1)` distinct hashes are forgotten (LRU-like ageing). Memory is fixed:
`generations x bits / 8` bytes. A whole message is probed and inserted in one compiled call
(numba; the first call in a process compiles it or loads it from numba's cache).

A false positive makes a never-seen block look seen (a cold miss counted as a non-cold one); at
the default 0.1% it is far below the 2-point tolerance of the overlap signal.
"""
from __future__ import annotations

import math

import numba as nb
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


_JIT = {"cache": True, "nogil": True}
_LOW32, _ONE, _THREE, _SEVEN, _S30, _S27, _S31, _S32 = (np.uint64(v) for v in (0xFFFFFFFF, 1, 3, 7, 30, 27, 31, 32))


@nb.njit(**_JIT)
def _probes(h: np.uint64) -> tuple[np.uint64, np.uint64]:
    """Double hashing of `_mix(h)`: probe j is at bit (h1 + j * h2) mod 2**64, masked."""
    h = h ^ (h >> _S30)
    h = h * _MIX1
    h = h ^ (h >> _S27)
    h = h * _MIX2
    h = h ^ (h >> _S31)
    return h & _LOW32, (h >> _S32) | _ONE


@nb.njit(**_JIT)
def _has(gen: np.ndarray, h: np.uint64, mask: np.uint64, k: int) -> bool:
    """Every probe bit of `h` is set in `gen` (bit p: bit p % 8 of byte p // 8)."""
    h1, h2 = _probes(h)
    for j in range(k):
        pos = (h1 + np.uint64(j) * h2) & mask
        if not (gen[pos >> _THREE] >> (pos & _SEVEN)) & _ONE:
            return False
    return True


@nb.njit(**_JIT)
def _add(gen: np.ndarray, hashes: np.ndarray, mask: np.uint64, k: int) -> None:
    for i in range(hashes.shape[0]):
        h1, h2 = _probes(hashes[i])
        for j in range(k):
            pos = (h1 + np.uint64(j) * h2) & mask
            gen[pos >> _THREE] |= np.uint8(_ONE << (pos & _SEVEN))


@nb.njit(**_JIT)
def _check_add(gen: np.ndarray, hashes: np.ndarray, mask: np.uint64, k: int, seen: np.ndarray) -> int:
    """seen[i] = hashes[i] was in `gen` before this call; then adds them all. Returns how many
    were not there (so duplicates in one call all see the state before it)."""
    new = 0
    for i in range(hashes.shape[0]):
        seen[i] = _has(gen, hashes[i], mask, k)
        if not seen[i]:
            new += 1
    _add(gen, hashes, mask, k)
    return new


@nb.njit(**_JIT)
def _or_had(gen: np.ndarray, hashes: np.ndarray, mask: np.uint64, k: int, seen: np.ndarray) -> None:
    """seen[i] |= hashes[i] is in `gen` (probed only where still false)."""
    for i in range(hashes.shape[0]):
        if not seen[i]:
            seen[i] = _has(gen, hashes[i], mask, k)


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
        self._gens: list[np.ndarray] = [np.zeros(self.bits // 8, dtype=np.uint8)]
        self._young_count = 0
        self.rotations = 0

    @property
    def nbytes(self) -> int:
        return sum(g.nbytes for g in self._gens)

    def check_and_add(self, hashes: np.ndarray) -> np.ndarray:
        """For each hash, whether it was (probably) seen before this call; then adds them all to
        the young generation. Duplicates inside one call all report the state before the call."""
        if hashes.size == 0:
            return np.zeros(0, dtype=bool)
        hashes = np.ascontiguousarray(hashes, dtype=np.uint64)
        seen = np.empty(hashes.shape[0], dtype=bool)
        # the young generation first, probed and filled in one call; the older ones only answer
        # for hashes the young one lacked (adding to the young one does not change them)
        self._young_count += _check_add(self._gens[-1], hashes, self._mask, self.k, seen)
        for gen in self._gens[:-1]:
            _or_had(gen, hashes, self._mask, self.k, seen)
        if self._young_count >= self.capacity:
            self._rotate()
        return seen

    def contains(self, hashes: np.ndarray) -> np.ndarray:
        if hashes.size == 0:
            return np.zeros(0, dtype=bool)
        hashes = np.ascontiguousarray(hashes, dtype=np.uint64)
        seen = np.zeros(hashes.shape[0], dtype=bool)
        for gen in self._gens:
            _or_had(gen, hashes, self._mask, self.k, seen)
        return seen

    def _rotate(self) -> None:
        self._gens.append(np.zeros(self.bits // 8, dtype=np.uint8))
        if len(self._gens) > self.generations:
            self._gens.pop(0)
        self._young_count = 0
        self.rotations += 1

    def clear(self) -> None:
        self._gens = [np.zeros(self.bits // 8, dtype=np.uint8)]
        self._young_count = 0
