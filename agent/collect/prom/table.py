"""`source: prometheus`, server-side aggregation: the answers to prom/plan.py's queries -> the
normalised signals as one polars frame, resolved across sources; then the window frame the
snapshot reads. Pure functions, no I/O. Columnar throughout: an answer is decoded straight into
typed structs (msgspec, only the labels the agent reads) and becomes columns; nothing here makes
a Python object per series beyond that.

The frame of one cycle's lifetime values has the columns
`role, pod, namespace, model, signal, le, source, kind, value`, one row per target, model,
signal and bucket: what normalise.py + resolve() give for a scraped payload.
"""
from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from operator import attrgetter

import msgspec
import polars as pl

from agent.collect.mapping import MappingSet
from agent.collect.prom.frame import Labelling
from agent.collect.prom.plan import Part, decode_labels, default_role
from contracts.tier_model import ROLES, Role, Signal

KEY = ["pod", "model", "signal", "le", "source"]
FRAME_SCHEMA = {"role": pl.String(), "pod": pl.String(), "namespace": pl.String(), "model": pl.String(),
                "signal": pl.String(), "le": pl.Float64(), "source": pl.String(), "kind": pl.String(),
                "value": pl.Float64()}


class AnswerDecoder:
    """Decodes a query answer into (label columns, values) with one struct type per label set."""

    def __init__(self, lab: Labelling, mappings: MappingSet):
        self.labels = decode_labels(lab, mappings)
        fields = [(f"l{i}", str, "") for i in range(len(self.labels))]
        metric = msgspec.defstruct("Metric", fields, rename={f"l{i}": name for i, name in enumerate(self.labels)},
                                   gc=False)
        series = msgspec.defstruct("Series", [("metric", metric), ("value", tuple[float, str])], gc=False)
        data = msgspec.defstruct("Data", [("resultType", str), ("result", list[series])])  # type: ignore[valid-type]
        answer = msgspec.defstruct("Answer", [("status", str), ("data", data | None, None)])  # type: ignore[operator]
        self._decoder = msgspec.json.Decoder(answer)
        self._attr = {name: f"l{i}" for i, name in enumerate(self.labels)}

    def decode(self, body: bytes) -> list | None:
        """The result list, or None when the body is not a successful vector answer in this shape
        (the caller then reads it the generic way for the error text)."""
        try:
            doc = self._decoder.decode(body)
        except (msgspec.DecodeError, msgspec.ValidationError):
            return None
        if doc.status != "success" or doc.data is None or doc.data.resultType != "vector":
            return None
        return doc.data.result

    def columns(self, result: list, labels: Iterable[str]) -> dict[str, list]:
        """The given labels' columns ("" where a series lacks one) and `__value`."""
        metrics = [s.metric for s in result]
        cols: dict[str, list] = {}
        for name in labels:
            if name not in cols:
                cols[name] = list(map(attrgetter(self._attr[name]), metrics))
        cols["__value"] = [_float(s.value[1]) for s in result]
        return cols


def _float(text: str) -> float:
    try:
        return float(text)
    except ValueError:
        return math.nan


@dataclass(frozen=True, slots=True)
class StageFrames:
    """One stage's rows and the targets whose aggregates were not finite (to be read raw)."""

    frame: pl.DataFrame
    suspects: frozenset[tuple[str, str, str]]  # (role, pod, namespace)


def part_labels(part: Part, group_role: Role | None, lab: Labelling) -> tuple[str, ...]:
    """The labels `part_rows` reads from an answer to `part`."""
    out = [lab.pod_label, "instance", lab.namespace_label, *part.mapping.model_labels]
    if group_role is None:
        out.append("job")
    if part.part == "bucket":
        out.append("le")
    if part.rule.value_from_label:
        out.append(part.rule.value_from_label)
    return tuple(out)


def part_rows(part: Part, cols: dict[str, list], group_role: Role | None, lab: Labelling,
              roles_by_name: dict[str, Role]) -> pl.DataFrame:
    """One answer of one part -> rows (role, pod, namespace, model, le_text, value), filtered to
    the series the part's mapping applies to (a role-less group: the role from `job`, else from
    the metric name, as frame.series_key)."""
    n = len(cols["__value"])
    if n == 0:
        return pl.DataFrame(schema={"role": pl.String(), "pod": pl.String(), "namespace": pl.String(),
                                    "model": pl.String(), "le_text": pl.String(), "value": pl.Float64(),
                                    "label_value": pl.String()})
    pod = [p or i for p, i in zip(cols[lab.pod_label], cols["instance"], strict=True)]
    model_labels = part.mapping.model_labels
    if not model_labels:
        model = [""] * n
    elif len(model_labels) == 1:
        model = cols[model_labels[0]]
    else:
        columns = [cols[m] for m in model_labels]
        model = [next((v for v in vs if v), "") for vs in zip(*columns, strict=True)]
    if group_role is not None:
        role: list[str] = [group_role] * n
    else:
        fallback = default_role(part, roles_by_name) or ""
        role = [j if j in ROLES else fallback for j in cols["job"]]
    label = part.rule.value_from_label
    frame = pl.DataFrame({
        "role": role, "pod": pod, "namespace": cols[lab.namespace_label], "model": model,
        "le_text": cols["le"] if "le" in cols else [""] * n, "value": cols["__value"],
        "label_value": cols[label] if label else [""] * n,
    }, schema={"role": pl.String(), "pod": pl.String(), "namespace": pl.String(), "model": pl.String(),
               "le_text": pl.String(), "value": pl.Float64(), "label_value": pl.String()})
    return frame.filter((pl.col("pod") != "") & pl.col("role").is_in(list(part.roles)))


def stage_frame(answers: Iterable[tuple[Part, pl.DataFrame]]) -> StageFrames:
    """Every part's rows of one stage -> normalised signals per target, model, signal and `le`
    (not yet resolved across sources), and the targets with a NaN or infinite aggregate."""
    pieces: list[pl.DataFrame] = []
    for part, rows in answers:
        if rows.height == 0:
            continue
        rule = part.rule
        value = pl.col("value")
        if part.part == "raw":  # the value is a label's number; series without one are skipped
            value = pl.col("label_value").cast(pl.Float64, strict=False)
            rows = rows.with_columns(value=value).filter(pl.col("value").is_not_null()
                                                         & pl.col("value").is_finite())
        elif part.part in ("value", "sum", "mean_sum") and rule.scale != 1.0:
            rows = rows.with_columns(value=value * rule.scale)
        if part.part == "bucket":
            le = (pl.when(pl.col("le_text") == "+Inf").then(pl.lit(math.inf))
                  .otherwise(pl.col("le_text").cast(pl.Float64, strict=False)))
            if rule.scale != 1.0:
                le = pl.when(le.is_infinite()).then(le).otherwise(le * rule.scale)
            rows = rows.with_columns(le=le)
        else:
            rows = rows.with_columns(le=pl.lit(None, pl.Float64))
        pieces.append(rows.select(
            "role", "pod", "namespace", "model", "le", "value",
            qid=pl.lit(part.qid, pl.Int32), part=pl.lit(part.part), rule=pl.lit(id(rule), pl.Int64),
            signal=pl.lit(part.signal), source=pl.lit(part.mapping.source), kind=pl.lit(part.kind),
            agg=pl.lit(rule.aggregation if part.part not in ("bucket", "sum", "count") else "sum"),
            buckets=pl.lit(rule.type == "histogram" and rule.buckets),
        ))
    if not pieces:
        return StageFrames(pl.DataFrame(schema=FRAME_SCHEMA), frozenset())
    rows = pl.concat(pieces, how="vertical_relaxed")
    target = ["role", "pod", "namespace"]
    bad = rows.filter(~pl.col("value").is_finite() | (pl.col("le").is_nan()))
    # a bucket whose `le` is not a number spoils its model's histogram (normalise.py: bad_models)
    suspects = frozenset(tuple(r) for r in bad.select(target).unique().iter_rows())
    if suspects:
        rows = rows.join(bad.select(target).unique(), on=target, how="anti", nulls_equal=True)
    keys = [*target, "model", "signal", "le", "source", "kind", "rule"]
    # several series of one target and model left after the server's aggregation (two scrape
    # targets of one pod in one role, several model labels): combined as the rule says
    combined = _combine(rows.filter(~pl.col("part").is_in(["mean_sum", "mean_count"])), keys)
    means = rows.filter(pl.col("part").is_in(["mean_sum", "mean_count"]))
    if means.height:
        m = means.group_by(keys, maintain_order=True).agg(
            total=pl.col("value").filter(pl.col("part") == "mean_sum").sum(),
            count=pl.col("value").filter(pl.col("part") == "mean_count").sum())
        m = m.filter(pl.col("count") > 0).select(*keys, value=pl.col("total") / pl.col("count"),
                                                  buckets=pl.lit(False), part=pl.lit("value"))
        combined = pl.concat([combined, m], how="vertical_relaxed")
    combined = _with_inf_buckets(combined, keys)
    return StageFrames(combined.select(list(FRAME_SCHEMA)), suspects)


COMBINE = {"sum": pl.col("value").sum(), "max": pl.col("value").max(), "mean": pl.col("value").mean()}
ONE_ROW = {"sum": pl.col("value").fill_null(0.0), "max": pl.col("value"), "mean": pl.col("value")}  # each of one row


def _combine(plain: pl.DataFrame, keys: list[str]) -> pl.DataFrame:
    """The rows of each series combined as its rule says (sum, max or mean), one block per
    aggregation, each in first-seen order. When no series has two rows (the usual case once the
    server has aggregated) each row is its own result, with no grouping."""
    single = not plain.select(pl.struct(keys).hash()).to_series().is_duplicated().any()
    blocks = []
    for name, expr in COMBINE.items():
        rows = plain.filter(pl.col("agg") == name)
        if single:  # a shared hash only sends us the grouping way
            blocks.append(rows.select(*keys, value=ONE_ROW[name], buckets="buckets", part="part"))
        else:
            blocks.append(rows.group_by(keys, maintain_order=True).agg(
                value=expr, buckets=pl.col("buckets").first(), part=pl.col("part").first()))
    return pl.concat(blocks, how="vertical_relaxed")


def _with_inf_buckets(rows: pl.DataFrame, keys: list[str]) -> pl.DataFrame:
    """A histogram without a `+Inf` bucket gets one from its `_count` (normalise.py does the same)."""
    hist = ["role", "pod", "namespace", "model", "source", "rule"]
    buckets = rows.filter(pl.col("part") == "bucket")
    if buckets.height == 0:
        return rows
    has_inf = buckets.filter(pl.col("le") == math.inf).select(hist).unique()
    with_buckets = buckets.select(hist).unique()
    missing = with_buckets.join(has_inf, on=hist, how="anti", nulls_equal=True)
    if missing.height == 0:
        return rows
    counts = rows.filter(pl.col("part") == "count").join(missing, on=hist, how="semi", nulls_equal=True)
    extra = counts.with_columns(signal=pl.col("signal").str.strip_suffix(":count"), le=pl.lit(math.inf),
                                part=pl.lit("bucket"))
    return pl.concat([rows, extra.select(rows.columns)], how="vertical_relaxed")


def resolve_frame(frame: pl.DataFrame, mappings: MappingSet) -> pl.DataFrame:
    """normalise.resolve on a frame: per pod, model and signal, the preferred source only; a
    model-less signal competes with every model of its pod; one row per series (the first)."""
    if frame.height == 0:
        return frame
    ranks = pl.DataFrame(
        [(src, base, _rank_key(rank)) for (src, base), rank in mappings.source_rank.items()],
        schema={"source": pl.String(), "base": pl.String(), "rank": pl.String()}, orient="row")
    f = frame.with_columns(base=pl.col("signal").str.split(":").list.first())
    f = f.join(ranks, on=["source", "base"], how="left").with_columns(
        rank=pl.col("rank").fill_null(pl.format("0{}{}", pl.lit(f"{1000:012d}"), pl.col("source"))))
    best = f.group_by(["pod", "model", "base"]).agg(best=pl.col("rank").min())
    modelless = best.filter(pl.col("model") == "").drop("model").rename({"best": "pod_best"})
    if modelless.height:
        best = best.join(modelless, on=["pod", "base"], how="left").with_columns(
            best=pl.when(pl.col("pod_best").is_not_null() & (pl.col("model") != "")
                         & (pl.col("pod_best") < pl.col("best"))).then(pl.col("pod_best"))
            .otherwise(pl.col("best"))).drop("pod_best")
    f = f.join(best, on=["pod", "model", "base"], how="left")
    f = f.filter(pl.col("best").str.slice(RANK_PREFIX) == pl.col("source"))
    return f.unique(subset=["pod", "model", "signal", "le"], keep="first", maintain_order=True).select(frame.columns)


RANK_PREFIX = 13  # "0"/"1" (fallback-only) + a 12-digit preference, then the source name


def _rank_key(rank: tuple[bool, int, str]) -> str:
    """normalise.resolve's sort key as one string that orders the same way."""
    fallback, pref, name = rank
    return f"{int(fallback)}{pref:012d}{name}"


def signals_frame(signals: Sequence[Signal]) -> pl.DataFrame:
    """Signal objects (the exact path's) -> rows of FRAME_SCHEMA; the caller sets role and namespace."""
    return pl.DataFrame({
        "role": [""] * len(signals), "pod": [s.pod for s in signals],
        "namespace": [""] * len(signals), "model": [s.model for s in signals],
        "signal": [s.name for s in signals], "le": [None if s.le != s.le else s.le for s in signals],
        "source": [s.source for s in signals], "kind": [s.kind for s in signals],
        "value": [s.value for s in signals],
    }, schema=FRAME_SCHEMA)


__all__ = [
    "FRAME_SCHEMA",
    "AnswerDecoder",
    "StageFrames",
    "part_labels",
    "part_rows",
    "resolve_frame",
    "signals_frame",
    "stage_frame",
]
