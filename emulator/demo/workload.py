"""The demo's two-phase workload, and the honest per-phase verdict computed on the twin."""
from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence

import polars as pl

from contracts.knobs import DEFAULT_KNOBS, Knobs
from emulator.cluster.timeline import PhaseVerdict
from simulator.cluster import ClusterSpec as TwinClusterSpec
from simulator.records import WORKLOAD_SCHEMA
from simulator.replay import replay
from simulator.synthetic import generate, preset_phases
from simulator.workload import load_trace

PHASE1_SHARE = 0.4  # the first phase takes this share of the run; the shifted phase the rest
TRACE_HASH_OFFSET = 1 << 40  # keeps trace block ids apart from the synthetic generator's


@dataclasses.dataclass(frozen=True)
class DemoWorkload:
    frame: pl.DataFrame
    phase_starts_s: tuple[float, ...]  # trace seconds where each phase begins
    labels: tuple[str, ...]
    span_s: float

    def phase_frame(self, phase: int) -> pl.DataFrame:
        return self.frame.filter(pl.col("phase") == phase)

    def recent(self, now_s: float, window_s: float, min_rows: int = 200) -> pl.DataFrame:
        """Requests that have arrived in [now - window, now] (never the future); widened until
        it holds `min_rows` requests or everything so far."""
        lo = now_s - window_s
        arrived = self.frame.filter(pl.col("timestamp_ms") <= int(now_s * 1000))
        while True:
            part = arrived.filter(pl.col("timestamp_ms") >= int(lo * 1000))
            if part.height >= min_rows or lo <= 0:
                return part if part.height else arrived
            lo -= window_s


def build_workload(span_s: float, seed: int, trace: str | None = None, rate_rps: float = 4.0) -> DemoWorkload:
    """Phase 1: shared system prompts and Zipf RAG documents. Phase 2: many distinct multi-turn
    sessions (built in), or the given Mooncake trace, time-shifted to start where phase 1 ends."""
    p1_s = span_s * PHASE1_SHARE
    rag, sessions = preset_phases("shift", rate_rps=rate_rps)
    rag = dataclasses.replace(rag, duration_s=p1_s)
    if trace is None:
        sessions = dataclasses.replace(sessions, duration_s=span_s - p1_s)
        frame = generate((rag, sessions), seed=seed)
        return DemoWorkload(frame, (0.0, p1_s), ("phase 1: shared prompts + RAG", "phase 2: multi-turn sessions"),
                            span_s)
    first = generate((rag,), seed=seed)
    tr = load_trace(trace)
    tr = tr.filter(pl.col("timestamp_ms") < int((span_s - p1_s) * 1000)).with_columns(
        (pl.col("timestamp_ms") + int(p1_s * 1000)).alias("timestamp_ms"),
        pl.col("hash_ids").list.eval(pl.element() + TRACE_HASH_OFFSET).alias("hash_ids"),
        pl.lit(1, dtype=pl.Int32).alias("phase"))
    frame = pl.concat([first.select(list(WORKLOAD_SCHEMA)), tr.select(list(WORKLOAD_SCHEMA))], how="vertical")
    return DemoWorkload(frame, (0.0, p1_s), ("phase 1: shared prompts + RAG", f"phase 2: trace {trace}"), span_s)


METHOD = ("each phase's requests were replayed on a fresh digital twin (same requests, same cluster, cold "
          "caches), once with the default configuration (LMCache defaults: chunk 256, CPU 5 GiB, LRU; "
          "round-robin routing) and once with the configuration tierpilot had in force at the end of that phase")


def phase_verdicts(workload: DemoWorkload, cluster: TwinClusterSpec, tuned: Sequence[Knobs]) -> list[PhaseVerdict]:
    """Default vs tuned, per phase, by replaying that phase's workload on the twin."""
    out = []
    for phase, knobs in enumerate(tuned):
        frame = workload.phase_frame(phase)
        if frame.height == 0:
            continue
        base = replay(frame, cluster, DEFAULT_KNOBS).summary()
        mine = base if knobs == DEFAULT_KNOBS else replay(frame, cluster, knobs).summary()
        out.append(PhaseVerdict(phase, workload.labels[phase], frame.height,
                                float(base["ttft_p95_s"]), float(mine["ttft_p95_s"]),
                                float(base["hit_ratio"]), float(mine["hit_ratio"]), METHOD))
    return out


def finite(x: float) -> bool:
    return isinstance(x, float) and math.isfinite(x)


