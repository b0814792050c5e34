"""The window's read side: one row per series from the store's rows, and the pure functions the
snapshot, the tuner's evaluators and the workload fit read it with (store.py keeps the rows).

Window semantics are store.py's (its module doc). Functions here take a window frame
(`WINDOW_SCHEMA`) and never touch the store's state.
"""
from __future__ import annotations

import polars as pl

KEYS = ["pod", "model", "signal", "le", "source", "kind"]
WINDOW_SCHEMA = {
    "pod": pl.String(), "model": pl.String(), "signal": pl.String(), "le": pl.Float64(),
    "source": pl.String(), "kind": pl.String(), "increase": pl.Float64(), "last": pl.Float64(),
    "seconds": pl.Float64(), "n": pl.UInt32(),
}


def window_aggregate(frame: pl.DataFrame, since: float | None = None) -> pl.DataFrame:
    """Rows of one window -> one row per series (see module doc for the semantics).

    With `since` (the window's start), a delta whose interval straddles the start counts only
    the share of it inside the window (its increase spread evenly over its interval), so the
    window covers `since`..now rather than reaching back to the scrape before it."""
    if frame.height == 0:
        return pl.DataFrame(schema=WINDOW_SCHEMA)
    if since is not None:
        inside = (pl.col("ts") - since) / pl.col("dt")
        share = pl.when(pl.col("dt") > 0).then(pl.min_horizontal(inside, pl.lit(1.0))).otherwise(1.0)
        frame = frame.with_columns((pl.col("delta") * share).alias("delta"), (pl.col("dt") * share).alias("dt"))
    agg = frame.group_by(KEYS).agg(
        pl.col("delta").sum().alias("inc"),
        pl.col("delta").count().alias("n"),
        pl.col("value").last().alias("last"),
        pl.col("dt").sum().alias("seconds"),
    )
    return agg.select(
        pl.col("pod").cast(pl.String),
        pl.col("model").cast(pl.String),
        pl.col("signal").cast(pl.String),
        "le",
        pl.col("source").cast(pl.String),
        pl.col("kind").cast(pl.String),
        pl.when((pl.col("kind") == "counter") & (pl.col("n") > 0))
        .then(pl.col("inc")).otherwise(pl.col("last")).alias("increase"),
        "last",
        pl.when(pl.col("n") > 0).then(pl.col("seconds")).otherwise(None).alias("seconds"),
        pl.col("n").cast(pl.UInt32),
    )


def since_engine_start(window: pl.DataFrame, bases: dict[tuple[str, str], float]) -> pl.DataFrame:
    """`last` of the based model-less counters, counted since their pod's engine restarted."""
    base = pl.DataFrame({"pod": [p for p, _ in bases], "signal": [n for _, n in bases],
                         "base": list(bases.values())},
                        schema={"pod": pl.String(), "signal": pl.String(), "base": pl.Float64()})
    joined = window.join(base, on=["pod", "signal"], how="left")
    hit = (pl.col("model") == "") & pl.col("le").is_null() & pl.col("base").is_not_null()
    return joined.with_columns(
        pl.when(hit).then(pl.max_horizontal(pl.col("last") - pl.col("base"), pl.lit(0.0)))
        .otherwise(pl.col("last")).alias("last")).drop("base")


def select(window: pl.DataFrame, pod: str | None, model: str | None) -> pl.DataFrame:
    if pod is not None:
        window = window.filter(pl.col("pod") == pod)
    if model is not None:
        window = window.filter(pl.col("model") == model)
    return window


def signal_values(window: pl.DataFrame) -> tuple[dict[str, float], dict[str, str]]:
    """Non-bucket signals summed over the selected series (gauges averaged), with their source."""
    rows = window.filter(pl.col("le").is_null())
    values: dict[str, float] = {}
    counts: dict[str, int] = {}
    sources: dict[str, str] = {}
    for name, kind, inc, src in rows.select("signal", "kind", "increase", "source").iter_rows():
        values[name] = values.get(name, 0.0) + inc
        counts[name] = counts.get(name, 0) + 1
        sources.setdefault(name, src)
        if kind == "gauge":
            sources[name] = src
    for name in list(values):
        if counts[name] > 1 and _is_gauge(rows, name):
            values[name] /= counts[name]
    return values, sources


def _is_gauge(rows: pl.DataFrame, name: str) -> bool:
    kinds = rows.filter(pl.col("signal") == name)["kind"].unique().to_list()
    return kinds == ["gauge"]


def bucket_increases(window: pl.DataFrame, signal: str) -> list[tuple[float, float]]:
    rows = (
        window.filter((pl.col("signal") == signal) & pl.col("le").is_not_null())
        .group_by("le").agg(pl.col("increase").sum()).sort("le")
    )
    return list(zip(rows["le"].to_list(), rows["increase"].to_list(), strict=True))


def bucket_shares(buckets: list[tuple[float, float]]) -> list[tuple[float, float, float]]:
    """Cumulative buckets -> (lower, upper, share) per bucket; empty when nothing was observed."""
    if not buckets or buckets[-1][1] <= 0:
        return []
    total = buckets[-1][1]
    out = []
    lower, below = 0.0, 0.0
    for le, cum in buckets:
        out.append((lower, le, max(cum - below, 0.0) / total))
        lower, below = le, max(cum, below)
    return out


def signal_rate(window: pl.DataFrame, signal: str) -> float | None:
    """Per-second increase of a counter signal (summed over series); None without two scrapes."""
    rows = window.filter((pl.col("signal") == signal) & pl.col("le").is_null() & (pl.col("n") > 0))
    if rows.height == 0:
        return None
    total = 0.0
    for inc, secs in rows.select("increase", "seconds").iter_rows():
        if secs is None or secs <= 0:
            return None
        total += inc / secs
    return total


__all__ = [
    "KEYS",
    "WINDOW_SCHEMA",
    "bucket_increases",
    "bucket_shares",
    "select",
    "signal_rate",
    "signal_values",
    "since_engine_start",
    "window_aggregate",
]
