"""Merge the per-pod streams into one order by event time (pure; the clock is injected).

Each pod's batches arrive in order on its own socket, but the sockets race each other, so a
block stored on pod A at t=1 and on pod B at t=2 may reach the agent B first, which would turn a
cold miss into a routing miss and back. The merger holds batches for up to `hold_s` (wall time)
and releases them in batch-`ts` order; a batch is released earlier once every recently active
stream has delivered something at or after its `ts` (a watermark). One stream's own batches are
never reordered: their sort key is clamped to be non-decreasing.
"""
from __future__ import annotations

import heapq
import itertools
from collections.abc import Callable, Hashable
from typing import Any

ACTIVE_S = 1.0  # a stream silent for longer does not hold the watermark back


class EventTimeMerger:
    def __init__(self, hold_s: float, clock: Callable[[], float]) -> None:
        self.hold_s = hold_s
        self.clock = clock
        self._heap: list[tuple[float, int, float, Hashable, Any]] = []
        self._order = itertools.count()
        self._last_key: dict[Hashable, float] = {}
        self._last_arrival: dict[Hashable, float] = {}

    def __len__(self) -> int:
        return len(self._heap)

    def push(self, stream: Hashable, ts: float, item: Any) -> None:
        key = max(ts, self._last_key.get(stream, float("-inf")))
        self._last_key[stream] = key
        now = self.clock()
        self._last_arrival[stream] = now
        heapq.heappush(self._heap, (key, next(self._order), now, stream, item))

    def _watermark(self, now: float) -> float:
        active = [k for s, k in self._last_key.items() if now - self._last_arrival[s] <= ACTIVE_S]
        return min(active) if active else float("inf")

    def pop_ready(self, flush: bool = False, limit: int | None = None) -> list[tuple[Hashable, Any]]:
        """Items that may be applied now, in order (at most `limit`). `flush` releases everything."""
        out: list[tuple[Hashable, Any]] = []
        if not self._heap:
            return out
        now = self.clock()
        room = len(self._heap) if limit is None else limit
        if flush or self.hold_s <= 0:
            while self._heap and len(out) < room:
                _, _, _, stream, item = heapq.heappop(self._heap)
                out.append((stream, item))
            return out
        mark = self._watermark(now)
        while self._heap and len(out) < room:
            key, _, arrival, stream, item = self._heap[0]
            if key <= mark or now - arrival >= self.hold_s:
                heapq.heappop(self._heap)
                out.append((stream, item))
            else:
                break
        return out

    def next_deadline(self) -> float | None:
        """Wall time at which the head item (the next to go) is released by the hold rule."""
        if not self._heap:
            return None
        return self._heap[0][2] + self.hold_s

    def forget(self, stream: Hashable) -> None:
        self._last_key.pop(stream, None)
        self._last_arrival.pop(stream, None)
