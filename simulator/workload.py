"""Workloads for the twin: Mooncake traces and the seeded synthetic generator.

Both produce one polars frame per workload with `WORKLOAD_SCHEMA`:
timestamp_ms Int64, input_length Int64, output_length Int64, hash_ids List(Int64) (chained hash
per 512-token block), session_id Int64 (null where none), phase Int32.
"""
from __future__ import annotations

import json
import math
from pathlib import Path

import polars as pl

from simulator.chunking import BLOCK_TOKENS, chunk_hash_table, chunk_hashes
from simulator.records import WORKLOAD_SCHEMA, Request, WorkloadError, check_workload, iter_requests
from simulator.synthetic import PRESETS, Phase, generate, synthetic

__all__ = [
    "PRESETS",
    "WORKLOAD_SCHEMA",
    "Phase",
    "Request",
    "WorkloadError",
    "check_workload",
    "chunk_hash_table",
    "chunk_hashes",
    "generate",
    "iter_requests",
    "load_trace",
    "synthetic",
]

_REQUIRED = ("timestamp", "input_length", "output_length", "hash_ids")


def _int_field(rec: dict, key: str, where: str) -> int:
    v = rec[key]
    if isinstance(v, bool) or not isinstance(v, int) or v < 0:
        raise WorkloadError(f"{where}: {key} must be a non-negative integer, got {v!r}")
    return v


def _parse_line(line: str, where: str) -> tuple[int, int, int, list[int], int | None]:
    try:
        rec = json.loads(line)
    except json.JSONDecodeError as exc:
        raise WorkloadError(f"{where}: not valid JSON ({exc.msg} at column {exc.colno})") from None
    if not isinstance(rec, dict):
        raise WorkloadError(f"{where}: expected a JSON object, got {type(rec).__name__}")
    missing = [k for k in _REQUIRED if k not in rec]
    if missing:
        raise WorkloadError(f"{where}: missing field(s) {', '.join(missing)}; a Mooncake record has {', '.join(_REQUIRED)}")
    ts = _int_field(rec, "timestamp", where)
    inp = _int_field(rec, "input_length", where)
    out = _int_field(rec, "output_length", where)
    ids = rec["hash_ids"]
    if not isinstance(ids, list) or any(isinstance(x, bool) or not isinstance(x, int) for x in ids):
        raise WorkloadError(f"{where}: hash_ids must be a list of integers")
    need = math.ceil(inp / BLOCK_TOKENS)
    if len(ids) != need:
        raise WorkloadError(
            f"{where}: hash_ids has {len(ids)} entries but input_length {inp} needs ceil({inp}/{BLOCK_TOKENS}) = {need}"
        )
    sid = rec.get("session_id")
    if sid is not None and (isinstance(sid, bool) or not isinstance(sid, int)):
        raise WorkloadError(f"{where}: session_id must be an integer or null, got {sid!r}")
    return ts, inp, out, ids, sid


def load_trace(path: str | Path) -> pl.DataFrame:
    """Load a Mooncake JSONL trace (`timestamp` ms, `input_length`, `output_length`, `hash_ids`).

    Blank lines are skipped; any malformed line raises `WorkloadError` naming file and line.
    An optional integer `session_id` field is kept. Rows come back sorted by arrival (stable).
    """
    p = Path(path)
    cols: dict[str, list] = {c: [] for c in WORKLOAD_SCHEMA}
    try:
        fh = p.open("r", encoding="utf-8")
    except OSError as exc:
        raise WorkloadError(f"{p}: cannot read trace: {exc.strerror or exc}") from None
    with fh:
        try:
            for lineno, line in enumerate(fh, 1):
                if not line.strip():
                    continue
                ts, inp, out, ids, sid = _parse_line(line, f"{p}:{lineno}")
                cols["timestamp_ms"].append(ts)
                cols["input_length"].append(inp)
                cols["output_length"].append(out)
                cols["hash_ids"].append(ids)
                cols["session_id"].append(sid)
        except UnicodeDecodeError as exc:
            raise WorkloadError(f"{p}: not a UTF-8 text file ({exc.reason})") from None
    cols["phase"] = [0] * len(cols["timestamp_ms"])
    if not cols["timestamp_ms"]:
        raise WorkloadError(f"{p}: no requests in trace")
    frame = pl.DataFrame(cols, schema=WORKLOAD_SCHEMA)
    return check_workload(frame, source=str(p))
