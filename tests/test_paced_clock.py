"""The emulated cluster's paced clock: it runs with the wall clock while its control loop keeps
up, and waits for the loop when the machine is busy (fake time, no sleeping; the plan thread's CPU clock spins real threads briefly)."""
from __future__ import annotations

import threading
import time

import pytest

from emulator.cluster.paced_clock import CpuGate, PacedClock, thread_cpu_clock


class FakeWall:
    def __init__(self) -> None:
        self.t = 100.0

    def __call__(self) -> float:
        return self.t

    def sleep(self, s: float) -> None:
        self.t += s


def test_runs_with_the_wall_while_the_loop_keeps_up():
    wall = FakeWall()
    clock = PacedClock(1.0, wall=wall, real_sleep=wall.sleep)
    for _ in range(10):
        wall.t += 0.5
        assert clock() == pytest.approx(clock._paced + 0.5)
        clock.tick()
    assert clock() == pytest.approx(5.0) and clock.held_back_s == 0.0


def test_waits_for_a_late_loop_and_counts_what_it_held_back():
    wall = FakeWall()
    clock = PacedClock(1.0, wall=wall, real_sleep=wall.sleep)
    wall.t += 0.5
    clock.tick()
    wall.t += 7.0  # the loop got the CPU 7 s late
    assert clock() == pytest.approx(1.5)  # at most max_lead past the last tick, even before it comes
    clock.tick()
    assert clock() == pytest.approx(1.5) and clock.held_back_s == pytest.approx(6.0)
    readings = []
    for _ in range(4):
        wall.t += 0.3
        readings.append(clock())
    assert readings == sorted(readings)  # never goes back


def test_sleep_lets_all_of_its_time_pass_on_the_clock():
    wall = FakeWall()
    clock = PacedClock(1.0, wall=wall, real_sleep=wall.sleep)
    clock.sleep(4.0)  # a rolling restart's downtime, spent in the loop's own thread
    assert clock() == pytest.approx(4.0) and clock.held_back_s == 0.0
    with pytest.raises(ValueError):
        PacedClock(0.0)


def test_wait_beside_the_loop_lasts_as_long_as_the_loop_lets_the_clock_run():
    wall = FakeWall()
    clock = PacedClock(1.0, wall=wall, real_sleep=wall.sleep)
    late = {"naps": 0}

    def nap(s: float) -> None:  # the loop's thread: late for 6 naps, then ticking after each one
        wall.sleep(s)
        late["naps"] += 1
        if late["naps"] > 6:
            clock.tick()

    clock._real_sleep = nap
    clock.wait(4.0)  # a pod's downtime, waited in a rollout thread beside the loop
    assert clock() == pytest.approx(4.0)
    assert late["naps"] > 6 and wall.t - 100.0 > 4.0  # the clock stood still at 1 s while the loop was late
    assert clock.held_back_s == pytest.approx(wall.t - 100.0 - 4.0)



def test_a_plan_starved_of_cpu_holds_the_clock_and_one_with_a_core_does_not():
    wall = FakeWall()
    clock = PacedClock(1.0, wall=wall, real_sleep=wall.sleep)
    cpu = {"s": 0.0, "per_wall_s": 1.0}
    plan = {"running": False}
    gate = CpuGate(lambda: plan["running"], clock, cpu=lambda: cpu["s"])

    def nap(s: float) -> None:  # wall time passes; the process gets cpu["per_wall_s"] of it
        wall.sleep(s)
        cpu["s"] += s * cpu["per_wall_s"]

    clock._real_sleep = nap
    clock.sleep(3.0, gate=gate)  # no plan: the clock runs with the wall
    assert clock() == pytest.approx(3.0)
    plan["running"] = True
    clock.sleep(4.0, gate=gate)  # a plan with a core of its own: nothing held back
    assert clock() == pytest.approx(7.0) and clock.held_back_s == 0.0
    cpu["per_wall_s"] = 0.1  # the machine gets busy while the plan runs
    at = clock()
    clock.sleep(20.0, gate=gate)
    assert clock() - at <= 20.0 * 0.1 + 2 * clock.max_lead_s  # ~the plan's CPU, not the wall's 20 s
    assert clock.held_back_s >= 16.0
    plan["running"] = False  # the plan is in: the clock runs with the wall again
    at = clock()
    clock.sleep(3.0, gate=gate)
    assert clock() - at == pytest.approx(3.0)


def _spin(seconds: float) -> None:
    end = time.thread_time() + seconds
    while time.thread_time() < end:
        pass


def test_the_plan_threads_cpu_clock_counts_only_that_thread():
    """The gate reads the plan thread's own CPU: work on other threads of the process (the loop,
    the agent) does not let the cluster's clock run on while the plan itself makes no progress."""
    started, release = threading.Event(), threading.Event()
    ident: list[int] = []

    def plan() -> None:
        ident.append(threading.get_ident())
        _spin(0.3)
        started.set()
        release.wait(10)

    t = threading.Thread(target=plan)
    t.start()
    assert started.wait(10)
    clock = thread_cpu_clock(ident[0])
    before = clock()
    assert before >= 0.25  # the plan's own spin
    _spin(0.3)  # another thread of the process works; the plan waits
    assert clock() - before < 0.1
    release.set()
    t.join(10)
    assert clock() >= before  # an ended thread: its final CPU time, or the process's where the kernel dropped it
