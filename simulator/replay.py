"""Batch replay of a whole workload on the twin: one row per request plus a summary.

The chunk hashes of the whole workload are derived once with numpy; the per-request loop then
only slices a flat list of Python ints and calls the engine, so no polars or per-chunk objects
sit in the hot path. This is what the tuner calls for every trial.
"""
from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import polars as pl

from contracts.events import EventSink
from contracts.knobs import Knobs
from simulator import fastloop, kernel
from simulator.chunking import BLOCK_TOKENS, chunk_hash_table
from simulator.cluster import Capacities, ClusterSpec
from simulator.counters import MissTotals
from simulator.profile import HardwareProfile
from simulator.streams import StreamCache, workload_chunks  # noqa: F401 (workload_chunks: public here)
from simulator.twin import Twin

ProgressFn = Callable[[int, int], None]  # (requests done, requests total)

RESULT_SCHEMA: dict[str, pl.DataType] = {
    "pod_index": pl.Int32(),
    "time_s": pl.Float64(),
    "prompt_tokens": pl.Int64(),
    "gpu_hit_tokens": pl.Int64(),
    "cpu_hit_tokens": pl.Int64(),
    "l2_hit_tokens": pl.Int64(),
    "computed_tokens": pl.Int64(),
    "queue_delay_s": pl.Float64(),
    "ttft_s": pl.Float64(),
    "l2_read_s": pl.Float64(),
    "l2_write_s": pl.Float64(),
    "cold_tokens": pl.Int64(),
    "capacity_tokens": pl.Int64(),
    "routing_tokens": pl.Int64(),
    "tail_tokens": pl.Int64(),
}


@dataclasses.dataclass(frozen=True)
class ReplayResult:
    """Per-request outcomes (`requests`) and whole-run totals of one replay."""

    requests: pl.DataFrame
    knobs: Knobs
    cluster: ClusterSpec
    capacities: Capacities
    evictions: dict[str, int]  # chunks evicted per tier: gpu, cpu (summed over pods), l2
    l2_counters: dict[str, float]
    truth: MissTotals
    elapsed_s: float  # wall-clock time of the replay loop

    def tier_lookups(self) -> pl.DataFrame:
        """Per-request lookup tokens per tier: the tokens that reached that tier in GPU -> CPU -> L2."""
        caps, r = self.capacities, self.requests
        c = self.knobs.chunk_tokens
        gpu_on = caps.gpu_tokens >= c
        cpu_on = caps.cpu_tokens >= c
        l2_on = caps.l2_tokens >= c
        prompt = pl.col("prompt_tokens")
        return r.select(
            gpu_lookup_tokens=prompt if gpu_on else pl.lit(0, pl.Int64),
            cpu_lookup_tokens=(prompt - pl.col("gpu_hit_tokens")) if cpu_on else pl.lit(0, pl.Int64),
            l2_lookup_tokens=pl.when(prompt >= self.knobs.l2_min_prompt_tokens)
            .then(prompt - pl.col("gpu_hit_tokens") - pl.col("cpu_hit_tokens"))
            .otherwise(0)
            if l2_on
            else pl.lit(0, pl.Int64),
        )

    def summary(self) -> dict[str, Any]:
        """Totals: hit ratio, per-tier lookups/hits/evictions, TTFT quantiles, L2 bytes, miss attribution."""
        r = self.requests
        look = self.tier_lookups()
        prompt = int(r["prompt_tokens"].sum())
        hits = {t: int(r[f"{t}_hit_tokens"].sum()) for t in ("gpu", "cpu", "l2")}
        lookups = {t: int(look[f"{t}_lookup_tokens"].sum()) for t in ("gpu", "cpu", "l2")}
        caps = {"gpu": self.capacities.gpu_tokens, "cpu": self.capacities.cpu_tokens, "l2": self.capacities.l2_tokens}
        ttft = r["ttft_s"].to_numpy()
        p50, p95, p99 = (float(x) for x in np.percentile(ttft, [50, 95, 99]))
        hit_total = sum(hits.values())
        span_s = float(r["time_s"].max() - r["time_s"].min()) if r.height else 0.0
        return {
            "requests": r.height,
            "prompt_tokens": prompt,
            "hit_tokens": hit_total,
            "computed_tokens": int(r["computed_tokens"].sum()),
            "hit_ratio": hit_total / prompt if prompt else 0.0,
            "tiers": {
                t: {
                    "lookup_tokens": lookups[t],
                    "hit_tokens": hits[t],
                    "hit_ratio": hits[t] / lookups[t] if lookups[t] else 0.0,
                    "evictions": self.evictions[t],
                    "capacity_tokens": caps[t],
                }
                for t in ("gpu", "cpu", "l2")
            },
            "ttft_p50_s": p50,
            "ttft_p95_s": p95,
            "ttft_p99_s": p99,
            "ttft_mean_s": float(ttft.mean()),
            "queue_delay_p95_s": float(np.percentile(r["queue_delay_s"].to_numpy(), 95)),
            "l2_bytes_read": int(self.l2_counters["read_bytes"]),
            "l2_bytes_written": int(self.l2_counters["write_bytes"]),
            "miss": {
                "cold_tokens": self.truth.cold_tokens,
                "capacity_tokens": self.truth.capacity_tokens,
                "routing_tokens": self.truth.routing_tokens,
                "tail_tokens": self.truth.tail_tokens,
            },
            "overlap": self.truth.overlap,
            "span_s": span_s,
            "pods": self.cluster.pods,
            "knobs": self.knobs.to_dict(),
            "elapsed_s": self.elapsed_s,
        }

    def timeline(self, bucket_s: float | None = None, buckets: int = 60) -> pl.DataFrame:
        """Per time bucket: per-tier hit ratio (hits / lookups), overall hit ratio, TTFT p50/p95."""
        r = pl.concat([self.requests, self.tier_lookups()], how="horizontal")
        if bucket_s is None:
            span = float(r["time_s"].max() - r["time_s"].min()) if r.height else 0.0
            bucket_s = max(span / buckets, 1e-3)
        r = r.with_columns(bucket=(pl.col("time_s") / bucket_s).floor().cast(pl.Int64))
        agg = r.group_by("bucket").agg(
            requests=pl.len(),
            prompt=pl.col("prompt_tokens").sum(),
            **{f"{t}_hit": pl.col(f"{t}_hit_tokens").sum() for t in ("gpu", "cpu", "l2")},
            **{f"{t}_lookup": pl.col(f"{t}_lookup_tokens").sum() for t in ("gpu", "cpu", "l2")},
            ttft_p50_s=pl.col("ttft_s").quantile(0.5, "linear"),
            ttft_p95_s=pl.col("ttft_s").quantile(0.95, "linear"),
        ).sort("bucket")

        def ratio(num: pl.Expr, den: pl.Expr) -> pl.Expr:
            return pl.when(den > 0).then(num / den).otherwise(None)

        return agg.select(
            time_s=pl.col("bucket") * bucket_s,
            requests="requests",
            gpu_hit_ratio=ratio(pl.col("gpu_hit"), pl.col("gpu_lookup")),
            cpu_hit_ratio=ratio(pl.col("cpu_hit"), pl.col("cpu_lookup")),
            l2_hit_ratio=ratio(pl.col("l2_hit"), pl.col("l2_lookup")),
            hit_ratio=ratio(pl.col("gpu_hit") + pl.col("cpu_hit") + pl.col("l2_hit"), pl.col("prompt")),
            ttft_p50_s="ttft_p50_s",
            ttft_p95_s="ttft_p95_s",
        )


def _event_blocks(workload: pl.DataFrame, chunk_tokens: int) -> tuple[list[int], list[int]] | None:
    """The 512-token block hashes of every request (flat, offsets) that the events announce for
    chunks above 512 tokens (simulator.twin_events); None at 512 tokens or less."""
    if chunk_tokens <= BLOCK_TOKENS:
        return None
    return chunk_hash_table(workload["hash_ids"].to_list(), workload["input_length"].to_list(), BLOCK_TOKENS)


def _rows_frame(rows: list[tuple]) -> pl.DataFrame:
    """The result rows as a frame (built column by column: a third of the time of orient="row")."""
    if not rows:
        return pl.DataFrame(rows, schema=RESULT_SCHEMA, orient="row")
    return pl.DataFrame([pl.Series(name, col, dtype=dtype)
                         for (name, dtype), col in zip(RESULT_SCHEMA.items(), zip(*rows), strict=True)])


_INT_COLUMNS = ("pod_index", "prompt_tokens", "gpu_hit_tokens", "cpu_hit_tokens", "l2_hit_tokens", "computed_tokens",
                "cold_tokens", "capacity_tokens", "routing_tokens", "tail_tokens")  # kernel.run's column order
_FLOAT_COLUMNS = ("time_s", "queue_delay_s", "ttft_s", "l2_read_s", "l2_write_s")


def _columns_frame(ints: np.ndarray, floats: np.ndarray) -> pl.DataFrame:
    """The compiled kernel's result columns as a frame (RESULT_SCHEMA's order and types)."""
    cols = {name: ints[:, j] for j, name in enumerate(_INT_COLUMNS)}
    cols.update({name: floats[:, j] for j, name in enumerate(_FLOAT_COLUMNS)})
    return pl.DataFrame([pl.Series(name, cols[name]).cast(dtype) for name, dtype in RESULT_SCHEMA.items()])


def replay(
    workload: pl.DataFrame,
    cluster: ClusterSpec,
    knobs: Knobs,
    *,
    profile: HardwareProfile | str | None = None,
    progress: ProgressFn | None = None,
    event_sink: EventSink | None = None,
    streams: StreamCache | None = None,
    placement: Sequence[int] | np.ndarray | None = None,
) -> ReplayResult:
    """Replay a workload frame (see `simulator.workload`) on a fresh twin. `streams`: keeps the
    frame's per-stream work (checked frame, columns, chunk hashes) for the next replay of the same
    frame object, as the trials of a search do (`simulator.streams`); results are the same.
    `placement`: each request's pod (arrival order), replayed as observed instead of routed."""
    streams = streams if streams is not None else StreamCache()
    stream = streams.stream(workload)
    frame, times, prompts, outputs, sessions = (stream.frame, stream.times, stream.prompts, stream.outputs,
                                                stream.sessions)
    twin = Twin(cluster, knobs, profile, event_sink=event_sink)
    if placement is not None:
        if len(placement) != len(times) or not workload["timestamp_ms"].is_sorted():
            raise ValueError(f"placement: {len(placement)} pods for {len(times)} requests; it needs one per "
                             "request of a workload in arrival order")
        twin.place(placement)
    # hash values only matter to events: without a sink the twin runs on dense ids
    arrays = streams.chunks(workload, knobs.chunk_tokens, dense=event_sink is None)
    total = len(times)
    step = max(total // 200, 1)
    compiled = kernel.supports(twin)
    fast = compiled or fastloop.supports(twin)
    t0 = time.perf_counter()
    rows: list[tuple] = []
    if compiled:  # the same loop compiled, over arrays (identical results)
        columns = kernel.run(twin, times, prompts, outputs, *arrays, sessions, progress)
    elif fast:  # the common policies written out in one loop (identical results)
        flat, offsets, cold, fresh = (a.tolist() for a in arrays)
        rows = fastloop.run(twin, times, prompts, outputs, flat, offsets, cold, fresh, sessions, progress)
    else:
        flat, offsets, cold, fresh = (a.tolist() for a in arrays)
        process = twin._process
        rows = []
        append = rows.append
        fine = _event_blocks(frame, knobs.chunk_tokens) if event_sink is not None else None
        for i in range(total):
            blocks = fine[0][fine[1][i]:fine[1][i + 1]] if fine is not None else None
            append(process(times[i], prompts[i], outputs[i], flat[offsets[i]:offsets[i + 1]], sessions[i], cold[i],
                           fresh[i], blocks))
            if progress is not None and i % step == 0:
                progress(i, total)
    elapsed = time.perf_counter() - t0
    if progress is not None:
        progress(total, total)
    out = _columns_frame(*columns) if compiled else _rows_frame(rows)
    names = list(twin.pod_names)
    out = out.with_columns(
        pod=pl.col("pod_index").replace_strict(list(range(len(names))), names, return_dtype=pl.String),
        timestamp_ms=frame["timestamp_ms"],
        output_tokens=frame["output_length"],
        phase=frame["phase"],
        session_id=frame["session_id"],
    )
    if fast:
        fastloop.add_truth(twin, out)
    return ReplayResult(
        requests=out,
        knobs=knobs,
        cluster=cluster,
        capacities=twin.capacities,
        evictions=twin.evictions(),
        l2_counters=twin.l2_counters(),
        truth=twin.miss_attribution(),
        elapsed_s=elapsed,
    )
