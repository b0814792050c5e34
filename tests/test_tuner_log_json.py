"""The tuner's structured log lines are strict JSON: a parser that refuses NaN and Infinity (as
JSON.parse, Go's encoding/json and jq do) reads every one; non-finite numbers are null."""
from __future__ import annotations

import json
import logging
import math

import numpy as np
import pytest

from contracts.knobs import DEFAULT_KNOBS
from tuners.logline import log_event


def _refuse(name: str) -> None:
    raise ValueError(f"non-standard JSON constant {name}")


def _strict(line: str) -> dict:
    return json.loads(line, parse_constant=_refuse)


def test_non_finite_values_are_written_null(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG, logger="tierpilot.tuner")
    log_event("verdict", trial=3, p95=math.nan, gain=math.inf, loss=-math.inf,
              window={"p95": [1.0, math.inf, np.float64("nan")], "ratio": (np.float32(np.inf), 0.5)},
              count=np.int64(7), share=np.float32(0.25), knobs=DEFAULT_KNOBS, ok=True, note=None)
    [line] = [r.getMessage() for r in caplog.records if r.name == "tierpilot.tuner"]
    record = _strict(line)
    assert record["event"] == "verdict" and record["trial"] == 3
    assert record["p95"] is None and record["gain"] is None and record["loss"] is None
    assert record["window"] == {"p95": [1.0, None, None], "ratio": [None, 0.5]}
    assert record["count"] == 7 and record["share"] == 0.25
    assert record["knobs"] == json.loads(json.dumps(DEFAULT_KNOBS.to_dict()))
    assert record["ok"] is True and record["note"] is None


def test_the_returned_record_is_what_was_logged(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG, logger="tierpilot.tuner")
    record = log_event("apply", trial=1, value=1.5)
    [line] = [r.getMessage() for r in caplog.records if r.name == "tierpilot.tuner"]
    assert _strict(line) == record
