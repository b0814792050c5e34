"""Helpers for the digital-twin tests: tiny hand-built requests and workloads."""
from __future__ import annotations

import polars as pl

from simulator.records import WORKLOAD_SCHEMA, Request


def req(ts_ms: int, blocks: list[int], *, input_length: int | None = None, out: int = 1,
        session: int | None = None) -> Request:
    """A request whose 512-token blocks are `blocks` (full blocks unless input_length says otherwise)."""
    return Request(ts_ms, 512 * len(blocks) if input_length is None else input_length, out, tuple(blocks), session, 0)


def frame(requests: list[Request]) -> pl.DataFrame:
    return pl.DataFrame(
        {
            "timestamp_ms": [r.timestamp_ms for r in requests],
            "input_length": [r.input_length for r in requests],
            "output_length": [r.output_length for r in requests],
            "hash_ids": [list(r.hash_ids) for r in requests],
            "session_id": [r.session_id for r in requests],
            "phase": [r.phase for r in requests],
        },
        schema=WORKLOAD_SCHEMA,
    )


class PrefixIds:
    """Chained block ids for hand-built prompts: a prompt is a tuple of symbols, one per block."""

    def __init__(self) -> None:
        self._ids: dict[tuple, int] = {}

    def blocks(self, symbols: tuple) -> list[int]:
        return [self._ids.setdefault(symbols[: i + 1], len(self._ids)) for i in range(len(symbols))]
