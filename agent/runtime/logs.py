"""What the command line logs: the agent's own records at the configured level, libraries' INFO
chatter (apscheduler runs every job with two INFO lines, optuna announces every study, aiohttp
logs every request) only with `--verbose`. Their warnings still show, except apscheduler's
"skipped: maximum number of running instances reached": a skipped run is counted in
`tierpilot_job_runs_total{outcome="skipped"}` instead, so it never breaks into a live view.
"""
from __future__ import annotations

import logging

LIBRARY_LOGGERS: tuple[str, ...] = (
    "apscheduler", "optuna", "aiohttp", "urllib3", "kubernetes", "asyncio", "sqlalchemy", "alembic",
    "matplotlib", "PIL", "httpx",
)


class DropSkippedRuns(logging.Filter):
    """Drop apscheduler's "maximum number of running instances reached" warning (counted instead)."""

    def filter(self, record: logging.LogRecord) -> bool:
        return "maximum number of running instances reached" not in record.getMessage()


def quiet_libraries(verbose: bool = False) -> None:
    """Libraries log at WARNING unless `verbose` (then everything they say, at the root's level)."""
    for name in LIBRARY_LOGGERS:
        logging.getLogger(name).setLevel(logging.NOTSET if verbose else logging.WARNING)
    scheduler = logging.getLogger("apscheduler.scheduler")
    for f in [f for f in scheduler.filters if isinstance(f, DropSkippedRuns)]:
        scheduler.removeFilter(f)
    if not verbose:
        scheduler.addFilter(DropSkippedRuns())
