"""Plans computed off the control tick.

Pricing a plan on the twin (a search of the restart-requiring knobs, then every candidate replayed
as stay, transition and steady) takes seconds of CPU. The controller's tick must never wait on it:
drift checks, live windows and rollbacks keep their cadence while a plan is being priced.

`PlanRunner.start(fn)` hands the plan to an `Executor`: a one-thread pool in the agent and the
live demo (`background_executor()`), or `InlineExecutor` where the clock is simulated and a plan
costs no cluster time (`bench/live_tuning.py`, most tests). `take()` is polled from the tick: it
returns the candidates once, when they are ready. A plan started before a drift alarm is
discarded: it priced a regime that has ended.
"""
from __future__ import annotations

import dataclasses
import math
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import Executor, Future, ThreadPoolExecutor
from typing import Any


class InlineExecutor(Executor):
    """Runs each submitted call at once, on the caller's thread (a simulated clock)."""

    def submit(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Future:  # type: ignore[override]
        fut: Future = Future()
        try:
            fut.set_result(fn(*args, **kwargs))
        except BaseException as exc:  # noqa: BLE001 - handed to whoever reads the future
            fut.set_exception(exc)
        return fut


def background_executor() -> ThreadPoolExecutor:
    """One worker thread for plans (one plan at a time; its thread is named for `py-spy`)."""
    return ThreadPoolExecutor(max_workers=1, thread_name_prefix="tierpilot-plan")


@dataclasses.dataclass
class PlanOutcome:
    """A finished plan: its candidates, or the error that ended it; when it started and ended."""

    candidates: Sequence[Any]
    error: BaseException | None
    started: float
    seconds: float


class PlanRunner:
    """At most one plan in flight; `take()` hands its outcome over exactly once."""

    def __init__(self, executor: Executor | None = None, *, wall: Callable[[], float] | None = None) -> None:
        import time

        self.executor = executor or InlineExecutor()
        self.wall = wall or time.monotonic
        self._future: Future | None = None
        self._started = math.nan
        self._wall0 = 0.0
        self._lock = threading.Lock()
        self.discarded = 0

    @property
    def running(self) -> bool:
        with self._lock:
            return self._future is not None and not self._future.done()

    def start(self, fn: Callable[[], Sequence[Any]], now: float) -> None:
        with self._lock:
            if self._future is not None and not self._future.done():
                raise RuntimeError("a plan is already being priced")
            self._started, self._wall0 = now, self.wall()
            self._future = self.executor.submit(fn)

    def take(self) -> PlanOutcome | None:
        """The finished plan's outcome (once), or None while it runs or when none was started."""
        with self._lock:
            fut = self._future
            if fut is None or not fut.done():
                return None
            self._future = None
        seconds = self.wall() - self._wall0
        exc = fut.exception()
        if exc is not None:
            return PlanOutcome((), exc, self._started, seconds)
        return PlanOutcome(list(fut.result() or ()), None, self._started, seconds)

    def discard(self) -> bool:
        """Forget the plan in flight (its result, when it comes, is dropped). True if there was one."""
        with self._lock:
            had = self._future is not None
            if had:
                assert self._future is not None
                self._future.cancel()  # a plan not started yet never runs
                self.discarded += 1
            self._future = None
            return had


__all__ = ["InlineExecutor", "PlanOutcome", "PlanRunner", "background_executor"]
