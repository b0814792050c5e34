"""Which targets' processes restarted since their previous scrape, from their counters (pure state)."""
from __future__ import annotations

from collections.abc import Iterable

from contracts.tier_model import Signal


class CounterResetDetector:
    """Remembers the last value of every counter series of each origin (target) and reports the
    series that went down since. Pure state object, no clock.

    `restarted(origin)` tells a process restart from one odd series: at least half of the
    origin's counters that had counted something went down (after a real restart nearly all do;
    only rarely hit ones, e.g. a quiet histogram bucket, can climb past their old value)."""

    def __init__(self) -> None:
        self._last: dict[str, dict[tuple, float]] = {}
        self._restarted: dict[str, bool] = {}

    def observe(self, origin: str, signals: Iterable[Signal]) -> int:
        prev = self._last.get(origin, {})
        cur: dict[tuple, float] = {}
        resets = counted = 0
        for s in signals:
            if s.kind != "counter":
                continue
            key = (s.model, s.name, s.le if s.le == s.le else None, s.source)
            cur[key] = s.value
            before = prev.get(key)
            if before is not None and before > 0:
                counted += 1
            if before is not None and s.value < before:
                resets += 1
        self._last[origin] = cur
        self._restarted[origin] = resets > 0 and 2 * resets >= counted
        return resets

    def restarted(self, origin: str) -> bool:
        """The last `observe` of `origin` saw its process restart."""
        return self._restarted.get(origin, False)

    def forget(self, origin: str) -> None:
        self._last.pop(origin, None)
        self._restarted.pop(origin, None)


__all__ = ["CounterResetDetector"]
