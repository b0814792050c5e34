"""The interface shared by the eviction policies (see `simulator.policies`)."""
from __future__ import annotations

from collections.abc import Sequence
from itertools import islice, takewhile


class Policy:
    name = "?"

    def __init__(self, capacity: int) -> None:
        if capacity < 1:
            raise ValueError(f"{self.name}: capacity must be >= 1 chunk, got {capacity}")
        self.capacity = capacity

    # -- subclasses provide _resident (a dict-like of resident keys) ------------------------------
    _resident: dict

    def __contains__(self, key: int) -> bool:
        return key in self._resident

    def __len__(self) -> int:
        return len(self._resident)

    def prefix_len(self, keys: Sequence[int], start: int = 0) -> int:
        it = islice(keys, start, None) if start else keys
        return len(list(takewhile(self._resident.__contains__, it)))

    def keys_in_order(self) -> list[int]:
        return list(self._resident)

    def insert_many(self, keys: Sequence[int]) -> list[int]:
        raise NotImplementedError

    def insert_count(self, keys: Sequence[int], fresh: int = 0) -> int:
        return len(self.insert_many(keys))
