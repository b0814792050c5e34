"""A wall clock for the scaled-real-time cluster that waits for its control loop.

The emulated cluster runs N cluster seconds per wall second. On a busy machine its control loop
(the tuner's steps, the agent's scrapes) gets the CPU late: at 20x, a loop iteration that should
take 0.5 s and takes 3 s lets 60 cluster seconds pass unobserved, so drift goes unseen and trial
windows close before they are judged. `PacedClock` is the driver's wall clock: it runs with the
real one, but never more than `max_lead_s` past the loop's last `tick()`. A busy machine then
slows the cluster down instead of skipping its control steps, and the run takes longer in wall
time; `held_back_s` says by how much. `sleep(s)` sleeps while ticking (a rolling restart's
downtime, spent in the loop's thread, still passes in cluster time); `wait(s)` sleeps until `s`
pass on the clock, for a thread beside the loop. The real clock and sleep are injected.
"""
from __future__ import annotations

import threading
import time
from collections.abc import Callable


class PacedClock:
    def __init__(self, max_lead_s: float, wall: Callable[[], float] = time.monotonic,
                 real_sleep: Callable[[float], None] = time.sleep) -> None:
        if max_lead_s <= 0:
            raise ValueError(f"max_lead_s must be > 0, got {max_lead_s}")
        self.max_lead_s = max_lead_s
        self._wall = wall
        self._real_sleep = real_sleep
        self._lock = threading.Lock()
        self._base = wall()  # real time of the last tick
        self._paced = 0.0  # paced seconds at the last tick
        self.held_back_s = 0.0  # real seconds the clock waited for the loop, in total

    def __call__(self) -> float:
        """Paced seconds since the clock was made."""
        with self._lock:
            return self._paced + min(self._wall() - self._base, self.max_lead_s)

    def tick(self) -> None:
        """The control loop came round: time up to now counts, at most `max_lead_s` of it."""
        with self._lock:
            now = self._wall()
            elapsed = now - self._base
            self._paced += min(elapsed, self.max_lead_s)
            self.held_back_s += max(elapsed - self.max_lead_s, 0.0)
            self._base = now

    def sleep(self, seconds: float) -> None:
        """Sleep `seconds` of real time, ticking, so that they all pass on this clock too."""
        end = self._wall() + seconds
        step = self.max_lead_s / 2
        while (left := end - self._wall()) > 0:
            self._real_sleep(min(step, left))
            self.tick()

    def wait(self, seconds: float) -> None:
        """Sleep until `seconds` pass on this clock, without ticking it: for a thread beside the
        loop (a rollout beside a probe), whose waits last as long as the loop lets the clock run."""
        end = self() + seconds
        step = self.max_lead_s / 2
        while (left := end - self()) > 0:
            self._real_sleep(min(step, left))


__all__ = ["PacedClock"]
