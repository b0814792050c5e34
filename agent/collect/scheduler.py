"""apscheduler wiring only: every job gets max_instances=1, coalescing and a misfire grace time."""
from __future__ import annotations

import asyncio
import inspect
import logging
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from apscheduler.events import EVENT_JOB_MAX_INSTANCES
from apscheduler.schedulers.asyncio import AsyncIOScheduler
from apscheduler.schedulers.base import STATE_RUNNING

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class JobSpec:
    """A periodic job: `func` is a plain callable (run in a worker thread) or a coroutine function
    (run on the agent's event loop). `first_run_now` starts it at once instead of after `interval_s`."""

    name: str
    interval_s: float
    func: Callable[[], Any]
    first_run_now: bool = False

    def __post_init__(self) -> None:
        if self.interval_s <= 0:
            raise ValueError(f"job {self.name!r}: interval_s must be positive")


def job_defaults(interval_s: float) -> dict[str, Any]:
    return {"max_instances": 1, "coalesce": True, "misfire_grace_time": max(1, int(interval_s))}


class _QuietShutdownCancellations(logging.Filter):
    """apscheduler logs a job future cancelled by the agent's own shutdown as a job error, with a
    traceback. That is expected, not a failure: drop just those records."""

    def filter(self, record: logging.LogRecord) -> bool:
        exc = record.exc_info[1] if record.exc_info else None
        return not isinstance(exc, asyncio.CancelledError)


def _quiet_shutdown_cancellations() -> None:
    executor_log = logging.getLogger("apscheduler.executors.default")
    if not any(isinstance(f, _QuietShutdownCancellations) for f in executor_log.filters):
        executor_log.addFilter(_QuietShutdownCancellations())


def build_scheduler(loop: asyncio.AbstractEventLoop, jobs: list[JobSpec],
                    record: Callable[[str, str], None] | None = None) -> AsyncIOScheduler:
    """An AsyncIOScheduler on `loop` with every job added (not started)."""
    _quiet_shutdown_cancellations()
    scheduler = AsyncIOScheduler(event_loop=loop, job_defaults={"max_instances": 1, "coalesce": True})
    if record is not None:  # a run skipped because the previous one still runs: counted, not lost
        scheduler.add_listener(lambda event: record(event.job_id, "skipped"), EVENT_JOB_MAX_INSTANCES)
    for spec in jobs:
        extra: dict[str, Any] = {}
        if spec.first_run_now:  # passing None would create the job paused
            extra["next_run_time"] = datetime.now().astimezone()
        scheduler.add_job(
            _wrap(spec, record), "interval", seconds=spec.interval_s, id=spec.name, name=spec.name,
            **job_defaults(spec.interval_s), **extra,
        )
    return scheduler


def is_running(scheduler: AsyncIOScheduler | None) -> bool:
    """Started and neither paused nor shut down."""
    return scheduler is not None and scheduler.state == STATE_RUNNING


def _wrap(spec: JobSpec, record: Callable[[str, str], None] | None) -> Callable[[], Any]:
    """Count outcomes and log failures; a failing job never stops the scheduler."""
    def note(outcome: str) -> None:
        if record is not None:
            record(spec.name, outcome)

    if inspect.iscoroutinefunction(spec.func):
        async def run_async() -> None:
            try:
                await spec.func()
                note("ok")
            except Exception:
                note("error")
                log.exception("job %s failed", spec.name)
        return run_async

    def run_sync() -> None:
        try:
            spec.func()
            note("ok")
        except Exception:
            note("error")
            log.exception("job %s failed", spec.name)
    return run_sync
