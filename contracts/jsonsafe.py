"""Strict JSON out: no NaN or Infinity ever reaches a client (`JSON.parse`, Go's encoding/json and
jq reject them). Pure functions.

- `finite(obj)` returns a copy of `obj` (dicts, lists, tuples) with every non-finite float as None.
- `dumps(obj, **kw)` is `json.dumps(finite(obj), allow_nan=False, **kw)`: what every JSON body the
  agent serves or prints goes through (/snapshot, /healthz, /readyz, /kv/sketch, `--json` output).
"""
from __future__ import annotations

import json
import math
from typing import Any


def finite(obj: Any) -> Any:
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, dict):
        return {k: finite(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [finite(v) for v in obj]
    return obj


def dumps(obj: Any, **kwargs: Any) -> str:
    return json.dumps(finite(obj), allow_nan=False, **kwargs)


def strict_loads(text: str | bytes) -> Any:
    """`json.loads` that refuses NaN, Infinity and -Infinity (as `JSON.parse` does)."""
    def refuse(name: str) -> Any:
        raise ValueError(f"non-standard JSON constant {name}")
    return json.loads(text, parse_constant=refuse)
