"""Structured log lines: one JSON object per event, on the `tierpilot.tuner` logger.

Every proposal, apply, rollback, verdict and drift event goes through `log_event`, so log
pipelines can parse them (`{"event": "apply", "trial": 3, ...}`). The lines are strict JSON: a
NaN or an infinity (a p95 of no requests, a ratio over zero) is written `null`, as in every JSON
body the agent serves, and numpy scalars are written as numbers.
"""
from __future__ import annotations

import logging
import numbers
from typing import Any

from contracts.jsonsafe import dumps
from contracts.knobs import Knobs

LOGGER = logging.getLogger("tierpilot.tuner")


def _jsonable(value: Any) -> Any:
    if isinstance(value, Knobs):
        return value.to_dict()
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    if isinstance(value, bool) or value is None or isinstance(value, str):
        return value
    if isinstance(value, numbers.Integral):  # numpy integers too
        return int(value)
    if isinstance(value, numbers.Real):  # numpy floats too; NaN and infinities become null in dumps
        return float(value)
    return value


def log_event(event: str, *, level: int = logging.INFO, logger: logging.Logger | None = None,
              **fields: Any) -> dict[str, Any]:
    """Log `{"event": event, **fields}` as one JSON line and return the record."""
    record = {"event": event, **{k: _jsonable(v) for k, v in fields.items()}}
    (logger or LOGGER).log(level, dumps(record, sort_keys=False, default=str))
    return record
