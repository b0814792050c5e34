"""Structured log lines: one JSON object per event, on the `tierpilot.tuner` logger.

Every proposal, apply, rollback, verdict and drift event goes through `log_event`, so log
pipelines can parse them (`{"event": "apply", "trial": 3, ...}`).
"""
from __future__ import annotations

import json
import logging
import math
from typing import Any

from contracts.knobs import Knobs

LOGGER = logging.getLogger("tierpilot.tuner")


def _jsonable(value: Any) -> Any:
    if isinstance(value, Knobs):
        return value.to_dict()
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    if isinstance(value, float) and math.isnan(value):  # NaN is not JSON
        return None
    return value


def log_event(event: str, *, level: int = logging.INFO, logger: logging.Logger | None = None,
              **fields: Any) -> dict[str, Any]:
    """Log `{"event": event, **fields}` as one JSON line and return the record."""
    record = {"event": event, **{k: _jsonable(v) for k, v in fields.items()}}
    (logger or LOGGER).log(level, json.dumps(record, sort_keys=False, default=str))
    return record
