"""Faults of the optuna study storage (PostgreSQL down, SQLite file corrupt, disk full), told
apart from other errors and reduced to one line for logs, /healthz and the command line.

optuna wraps SQLAlchemy's errors in `StorageInternalError("... invalid data in the commit ...")`,
which blames the data when the database is gone or the disk is full; the root cause (the DB-API
error) says what happened, so that is what `one_line` reports. Detection goes by the exception's
module, so callers need not import SQLAlchemy or a DB driver.
"""
from __future__ import annotations

from contracts.redact import redact_text

STORAGE_MODULES = ("sqlalchemy", "sqlite3", "_sqlite3", "psycopg2", "psycopg")
STORAGE_CLASSES = ("StorageInternalError",)  # optuna's wrapper of any database failure


def causes(exc: BaseException) -> list[BaseException]:
    """`exc` and its chain of causes (explicit `from`, else the exception being handled)."""
    out: list[BaseException] = []
    seen: set[int] = set()
    cur: BaseException | None = exc
    while cur is not None and id(cur) not in seen:
        out.append(cur)
        seen.add(id(cur))
        cur = cur.__cause__ or cur.__context__
    return out


def is_storage_error(exc: BaseException) -> bool:
    for e in causes(exc):
        for cls in type(e).__mro__:
            if cls.__module__.startswith(STORAGE_MODULES) or cls.__name__ in STORAGE_CLASSES:
                return True
    return False


def one_line(exc: BaseException, limit: int = 300) -> str:
    """`Type: first line of the root cause's message`, credentials redacted (never a traceback)."""
    root = causes(exc)[-1]
    lines = [line.strip() for line in str(root).strip().splitlines() if line.strip()]
    msg = lines[0] if lines else ""
    if msg.startswith("(") and ") " in msg:  # SQLAlchemy's "(sqlite3.OperationalError) ..."
        msg = msg.split(") ", 1)[1]
    return redact_text(f"{type(root).__name__}: {msg}")[:limit]
