"""The agent's data clock: wall-clock seconds that advance with the monotonic clock.

Samples, windows, rates and the KV-event windows are stamped with it. It starts at `time.time()`
and then moves only as `time.monotonic()` does, so a step of the system clock (an NTP correction,
a manual `date -s`, a VM resumed from suspend) changes neither a rate nor a window: with the plain
wall clock, +2 h between two scrapes read a 1.33/s request rate as 0.0028/s, and -1 day put every
new sample before the window. The price: after such a step, exported timestamps differ from the
system clock by the size of the step until the agent restarts.
"""
from __future__ import annotations

import time
from collections.abc import Callable


class SteadyWallClock:
    """Call it for the time now (Unix seconds, steady)."""

    def __init__(self, wall: Callable[[], float] = time.time, monotonic: Callable[[], float] = time.monotonic):
        self._monotonic = monotonic
        self._offset = wall() - monotonic()

    def __call__(self) -> float:
        return self._monotonic() + self._offset
