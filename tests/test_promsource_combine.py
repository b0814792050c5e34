"""prom/table.py's combining of the rows left per series after the server's aggregation: one row
per series is its own result (no grouping), bit for bit what grouping gives; several rows of one
series (two scrape targets of one pod in one role) are summed, maxed or averaged as the rule says."""
from __future__ import annotations

import math

import polars as pl

from agent.collect.prom.table import COMBINE, _combine

KEYS = ["role", "pod", "namespace", "model", "signal", "le", "source", "kind", "rule"]


def rows(values: list[tuple[str, str, float | None]]) -> pl.DataFrame:
    """(pod, aggregation, value) rows of one signal; `le` null, as for a counter."""
    return pl.DataFrame({
        "role": ["vllm"] * len(values), "pod": [p for p, _, _ in values], "namespace": ["ns"] * len(values),
        "model": ["m"] * len(values), "signal": ["requests"] * len(values), "le": [None] * len(values),
        "source": ["vllm_v1"] * len(values), "kind": ["counter"] * len(values), "rule": [7] * len(values),
        "value": [v for _, _, v in values], "agg": [a for _, a, _ in values], "buckets": [False] * len(values),
        "part": ["value"] * len(values)},
        schema_overrides={"le": pl.Float64, "value": pl.Float64, "rule": pl.Int64})


def grouped(frame: pl.DataFrame) -> pl.DataFrame:
    """The reference: every series grouped, whatever its number of rows."""
    return pl.concat([frame.filter(pl.col("agg") == name).group_by(KEYS, maintain_order=True).agg(
        value=expr, buckets=pl.col("buckets").first(), part=pl.col("part").first())
        for name, expr in COMBINE.items()], how="vertical_relaxed")


def test_one_row_per_series_is_its_own_result_bit_for_bit():
    frame = rows([("a", "sum", -0.0), ("b", "sum", None), ("c", "max", math.inf), ("d", "mean", math.nan),
                  ("e", "sum", 0.1), ("f", "max", None), ("g", "mean", 2.5), ("h", "sum", 1e308)])
    got, want = _combine(frame, KEYS), grouped(frame)
    assert got.schema == want.schema and got.height == 8
    assert got.drop("value").equals(want.drop("value"))
    for x, y in zip(got["value"].to_list(), want["value"].to_list(), strict=True):
        assert (x is None and y is None) or (math.isnan(x) and math.isnan(y)) or \
            (x == y and math.copysign(1.0, x) == math.copysign(1.0, y)), (x, y)
    assert got["value"].to_list()[:2] == [-0.0, 0.0]  # a lone null sums to 0, as grouping gives


def test_several_rows_of_one_series_are_combined_by_the_rule():
    frame = rows([("a", "sum", 2.0), ("a", "sum", 3.0), ("b", "max", 1.0), ("b", "max", 4.0),
                  ("c", "mean", 1.0), ("c", "mean", 2.0), ("d", "sum", 9.0)])
    got = _combine(frame, KEYS)
    assert got.equals(grouped(frame))
    assert dict(zip(got["pod"], got["value"], strict=True)) == {"a": 5.0, "d": 9.0, "b": 4.0, "c": 1.5}
