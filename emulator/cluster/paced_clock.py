"""A wall clock for the scaled-real-time cluster that waits for its control loop.

The emulated cluster runs N cluster seconds per wall second. On a busy machine its control loop
(the tuner's steps, the agent's scrapes) gets the CPU late: at 20x, a loop iteration that should
take 0.5 s and takes 3 s lets 60 cluster seconds pass unobserved, so drift goes unseen and trial
windows close before they are judged. `PacedClock` is the driver's wall clock: it runs with the
real one, but never more than `max_lead_s` past the loop's last `tick()`. A busy machine then
slows the cluster down instead of skipping its control steps, and the run takes longer in wall
time; `held_back_s` says by how much. `sleep(s)` sleeps while ticking (a rolling restart's
downtime, spent in the loop's thread, still passes in cluster time); `wait(s)` sleeps until `s`
pass on the clock, for a thread beside the loop. `CpuGate` holds the clock while work the loop
waits for (a plan) runs on a starved thread. The real clock and sleep are injected.
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

    def sleep(self, seconds: float, gate: Callable[[], bool] | None = None) -> None:
        """Sleep `seconds` of real time, ticking, so that they all pass on this clock too (only the
        ticks `gate()` allows, when a gate is given: the time it holds back does not pass)."""
        end = self._wall() + seconds
        step = self.max_lead_s / 2
        while (left := end - self._wall()) > 0:
            self._real_sleep(min(step, left))
            if gate is None or gate():
                self.tick()

    def wait(self, seconds: float) -> None:
        """Sleep until `seconds` pass on this clock, without ticking it: for a thread beside the
        loop (a rollout beside a probe), whose waits last as long as the loop lets the clock run."""
        end = self() + seconds
        step = self.max_lead_s / 2
        while (left := end - self()) > 0:
            self._real_sleep(min(step, left))


class CpuGate:
    """While `busy()` (a plan priced on a thread beside the loop), the paced clock may run only as
    fast as the plan gets CPU: on a busy machine the cluster waits for the plan as it waits for
    the loop, so a plan costs the cluster about the time it costs with a core of its own. Call it
    before each tick; False means hold the clock. `cpu` is the plan thread's CPU clock
    (`thread_cpu_clock`; the process's by default, which also counts the loop's and the agent's
    threads, so a plan starved of the GIL by them costs the cluster more than its own CPU)."""

    def __init__(self, busy: Callable[[], bool], clock: PacedClock,
                 cpu: Callable[[], float] = time.process_time) -> None:
        self._busy, self._clock, self._cpu = busy, clock, cpu
        self._mark: tuple[float, float] | None = None  # (paced, cpu) when the plan was first seen

    def __call__(self) -> bool:
        if not self._busy():
            self._mark = None
            return True
        paced, cpu = self._clock(), self._cpu()
        if self._mark is None:
            self._mark = (paced, cpu)
            return True
        return paced - self._mark[0] <= cpu - self._mark[1] + self._clock.max_lead_s


def thread_cpu_clock(ident: int) -> Callable[[], float]:
    """The CPU time of thread `ident` (Linux's per-thread CPU clock); the process's CPU time where
    the platform has none, or where the kernel no longer knows the ended thread's clock."""
    try:
        clock_id = time.pthread_getcpuclockid(ident)
    except (AttributeError, OSError):
        return time.process_time

    def read() -> float:
        try:
            return time.clock_gettime(clock_id)
        except OSError:  # the thread has ended
            return time.process_time()
    return read


__all__ = ["CpuGate", "PacedClock", "thread_cpu_clock"]
