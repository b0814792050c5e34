"""The workload record format shared by trace loading, the synthetic generator and the twin."""
from __future__ import annotations

import dataclasses
from collections.abc import Iterator

import polars as pl

WORKLOAD_SCHEMA: dict[str, pl.DataType] = {
    "timestamp_ms": pl.Int64(),
    "input_length": pl.Int64(),
    "output_length": pl.Int64(),
    "hash_ids": pl.List(pl.Int64()),  # chained hash per 512-token block (Mooncake semantics)
    "session_id": pl.Int64(),  # null where the request belongs to no known session
    "phase": pl.Int32(),  # 0 for traces; the phase index of a synthetic schedule
}


class WorkloadError(ValueError):
    """A malformed trace or workload; the message names the file and line (or the column)."""


@dataclasses.dataclass(frozen=True, slots=True)
class Request:
    """One request, as the twin consumes it."""

    timestamp_ms: int
    input_length: int
    output_length: int
    hash_ids: tuple[int, ...]
    session_id: int | None = None
    phase: int = 0


def check_workload(frame: pl.DataFrame, *, source: str = "workload") -> pl.DataFrame:
    """Check columns and dtypes; return the frame sorted by arrival (stable)."""
    missing = [c for c in WORKLOAD_SCHEMA if c not in frame.columns]
    if missing:
        raise WorkloadError(
            f"{source}: missing column(s) {', '.join(missing)}; a workload needs {', '.join(WORKLOAD_SCHEMA)}"
        )
    for col, dtype in WORKLOAD_SCHEMA.items():
        if frame.schema[col] != dtype:
            raise WorkloadError(f"{source}: column {col} has type {frame.schema[col]}, expected {dtype}")
    if frame.height == 0:
        raise WorkloadError(f"{source}: no requests")
    if not frame["timestamp_ms"].is_sorted():
        frame = frame.sort("timestamp_ms", maintain_order=True)
    return frame.select(list(WORKLOAD_SCHEMA))


def iter_requests(frame: pl.DataFrame) -> Iterator[Request]:
    """The rows of a workload frame as `Request` records, in arrival order."""
    for ts, inp, out, ids, sid, ph in zip(
        *(frame[c].to_list() for c in WORKLOAD_SCHEMA), strict=True
    ):
        yield Request(ts, inp, out, tuple(ids), sid, ph)
