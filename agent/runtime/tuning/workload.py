"""Where the tuner's planning workload comes from: a `WorkloadSource`.

`history(now, seconds)` is the recent workload as a `simulator.records.WORKLOAD_SCHEMA` frame
(arrival order, the requests in [now - seconds, now]); `kind` says what it is, and every plan
and /healthz carry it:

- `rebuilt`: the block stream the agent's KV-event subscriber saw, rebuilt request by request;
- `fitted`: the fallback when KV events are off: a synthetic workload fitted to the scraped
  counters (arrival rate, prompt-length mix, overlap; agent/runtime/paying_runtime.py
  `FittedHistory`). It sees neither multi-turn growth nor document popularity.
"""
from __future__ import annotations

from typing import Protocol

import polars as pl

KIND_NOTES = {
    "rebuilt": "the block stream rebuilt from the KV events",
    "fitted": "fitted fallback: a synthetic workload fitted to the scraped counters (KV events off)",
}


class WorkloadSource(Protocol):
    kind: str

    def history(self, now: float, seconds: float) -> pl.DataFrame: ...


def describe(source: WorkloadSource) -> dict[str, str]:
    """What /healthz shows of the planning workload."""
    return {"kind": source.kind, "note": KIND_NOTES.get(source.kind, source.kind)}


__all__ = ["KIND_NOTES", "WorkloadSource", "describe"]
