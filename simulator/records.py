"""The workload record format shared by trace loading, the synthetic generator and the twin."""
from __future__ import annotations

import dataclasses
from collections.abc import Iterator

import numpy as np
import polars as pl

WORKLOAD_SCHEMA: dict[str, pl.DataType] = {
    "timestamp_ms": pl.Int64(),
    "input_length": pl.Int64(),
    "output_length": pl.Int64(),
    "hash_ids": pl.List(pl.Int64()),  # chained hash per 512-token block (Mooncake semantics)
    "session_id": pl.Int64(),  # null where the request belongs to no known session
    "phase": pl.Int32(),  # 0 for traces; the phase index of a synthetic schedule
}

# Optional, beside the schema: the pod (0-based, dense) that served each request, where a stream
# observed on a fleet knows it (agent/kvevents/rebuild/layout.py). Replays route afresh; the
# capacity curves of the stream as served take it (`observed_placement`).
PLACEMENT_COLUMN = "served_by"


def observed_placement(frame: pl.DataFrame, pods: int) -> np.ndarray | None:
    """The frame's `PLACEMENT_COLUMN` as pod indices, when it has one that fits `pods` pods (no
    nulls, every index below `pods`) and the frame is in arrival order; None otherwise."""
    if PLACEMENT_COLUMN not in frame.columns or not frame.height or not frame["timestamp_ms"].is_sorted():
        return None
    col = frame[PLACEMENT_COLUMN]
    if col.null_count() or int(col.min()) < 0 or int(col.max()) >= pods:
        return None
    return col.to_numpy().astype(np.int64)


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
