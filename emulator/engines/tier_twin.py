"""The twin against a real tiered engine: fit its tier terms from a calibration, then replay a
held-out stream on both and compare per-tier hit ratios and TTFT (bench/twin_tiers.py and
tests/test_twin_real_tiers.py).

The fit (simulator/profile_fit.py, simulator/tier_fit.py): the base model (overhead, prefill,
attention) on the calibration's cold and KV-hit requests; the per-token cost of a CPU-tier hit
from the engine's `kv_offload_load_time / load_bytes` (its CPU tier -> KV cache copies), and of an
fs-tier hit from `kv_offload_tiering_read_time / read_bytes{tier="1:fs"}` (fs -> CPU tier) plus
that copy; the fixed part of each from the TTFTs of the CPU-tier and fs-tier requests.

The held-out stream is sent one request at a time, or open-loop at `rate_rps`; the twin replays it
at the actual send times on one pod with the engine's KV cache, CPU tier and an fs tier that never
evicts (vLLM's fs tier has no size limit).
"""
from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path

import numpy as np
import polars as pl

from contracts.knobs import Knobs
from emulator.engines.engine import kv_bytes_per_token
from emulator.engines.prompts import PromptBuilder, cap_prompt_length, prompts
from emulator.engines.tier_probe import Calibration, Counters, Sample, TierProbe, delta
from simulator.cluster import ClusterSpec
from simulator.profile import HardwareProfile, get_profile
from simulator.profile_fit import FitError, ServiceFit, fit_service_latency, with_service_fit
from simulator.replay import replay
from simulator.synthetic import Phase, generate
from simulator.tier_fit import (
    TierRatios,
    TransferFit,
    counter_ratios,
    engine_style_ratios,
    fit_transfer,
    rate_per_token,
    with_tier_fit,
)

PROFILE = "cpu-tiny-llama"
MAX_PROMPT = 2000  # the engine's max_model_len 2048, with room for the output token
FS_TOKENS = 1 << 30  # vLLM's fs tier never evicts
HIT_TARGET, TTFT_TARGET = 0.02, 0.15
ONE_AT_A_TIME = "one at a time"
SPACED_MS = 3_600_000  # the twin's arrivals for a stream sent one at a time: far apart, so nothing queues

# Multi-turn sessions over 4 shared system prompts and a Zipf RAG corpus of 40 documents: about
# 30,000 tokens of distinct prefixes, several times a 6,144-token KV cache.
HELD_OUT = Phase(duration_s=100_000.0, rate_rps=1.0, system_prompts=4, system_prompt_tokens=(150, 600),
                 rag_docs=40, rag_doc_tokens=(300, 1000), rag_zipf_s=0.8, rag_share=0.85, turns=(1, 3),
                 user_tokens=(20, 200), output_tokens=(20, 120), think_time_s=5.0, name="held-out")


@dataclasses.dataclass(frozen=True)
class TierFits:
    base: ServiceFit
    cpu: TransferFit
    fs: TransferFit
    kv_bytes_per_token: int
    load_gbps: float  # the engine's CPU tier -> KV cache copies
    read_gbps: float  # its fs tier -> CPU tier reads
    cpu_chunk_hits: float  # the engine's chunk hits per tier during the calibration ...
    cpu_expected: float  # ... and what the calibration's construction makes them
    fs_chunk_hits: float
    fs_expected: float

    def profile(self, base: HardwareProfile | str = PROFILE) -> HardwareProfile:
        prof = with_service_fit(get_profile(base), self.base)
        return with_tier_fit(prof, self.cpu, self.fs)


def fit_base(rows: list[Sample]) -> ServiceFit:
    """The base model on cold and KV-hit requests; without the attention term when the samples make
    it negative (a few requests slowed by other processes can, on a short calibration)."""
    cols = ([s.computed_tokens for s in rows], [s.cached_tokens for s in rows], [s.ttft_s for s in rows])
    try:
        return fit_service_latency(*cols)
    except FitError as exc:
        if "attention" not in str(exc):
            raise
        return fit_service_latency(*cols, attention=False)


def fit_tiers(cal: Calibration, dtype: str, chunk_tokens: int) -> TierFits:
    bpt = kv_bytes_per_token(dtype)
    base = fit_base(cal.of("cold") + cal.of("gpu"))
    b, a = cal.before, cal.after
    load_s, load_b = delta(b, a, "vllm:kv_offload_load_time_total"), delta(b, a, "vllm:kv_offload_load_bytes_total")
    read_s = delta(b, a, "vllm:kv_offload_tiering_read_time_total", "1:fs")
    read_b = delta(b, a, "vllm:kv_offload_tiering_read_bytes_total", "1:fs")
    cpu_tok = rate_per_token(load_s, load_b, bpt)
    fs_tok = rate_per_token(read_s, read_b, bpt) + cpu_tok

    def extra(kind: str) -> tuple[list[int], list[float]]:
        rows = cal.of(kind)
        return ([s.cached_tokens for s in rows],
                [s.ttft_s - base.predict(s.computed_tokens, s.cached_tokens) for s in rows])

    return TierFits(base, fit_transfer(*extra("cpu"), cpu_tok), fit_transfer(*extra("fs"), fs_tok), bpt,
                    load_b / load_s / 1e9 if load_s > 0 else math.inf, read_b / read_s / 1e9 if read_s > 0 else math.inf,
                    *calibration_hits(cal, chunk_tokens))


def calibration_hits(cal: Calibration, chunk_tokens: int) -> tuple[float, float, float, float]:
    """The engine's chunk hits in its CPU tier during the calibration and what the calibration's
    construction makes them, then the same for its fs tier (counters only, no timing)."""
    hits, b, a = "vllm:kv_offload_tiering_chunk_hits_total", cal.before, cal.after
    return (delta(b, a, hits, "0:primary"), sum(s.cached_tokens for s in cal.of("cpu")) / chunk_tokens,
            delta(b, a, hits, "1:fs"), sum(s.cached_tokens for s in cal.of("fs")) / chunk_tokens)


def held_out_stream(n: int, *, seed: int, phase: Phase = HELD_OUT, max_prompt: int = MAX_PROMPT) -> pl.DataFrame:
    """The first `n` requests of `phase` of at most `max_prompt` tokens, in arrival order."""
    return cap_prompt_length(generate((phase,), seed=seed), max_prompt).head(n)


@dataclasses.dataclass(frozen=True)
class HeldOutRun:
    """What the engine did with a held-out stream: the stream at its send times, every request's
    TTFT, and the engine's counters around it."""

    sent: pl.DataFrame  # the workload frame, `timestamp_ms` = when each request was sent
    ttft_s: list[float]
    before: Counters
    after: Counters
    mode: str

    def save(self, directory: Path) -> None:
        directory.mkdir(parents=True, exist_ok=True)
        self.sent.with_columns(pl.Series("ttft_s", self.ttft_s)).write_parquet(directory / "held_out.parquet")
        (directory / "counters.json").write_text(json.dumps(
            {"mode": self.mode, "before": [[k[0], k[1], v] for k, v in self.before.items()],
             "after": [[k[0], k[1], v] for k, v in self.after.items()]}))

    @classmethod
    def load(cls, directory: Path) -> HeldOutRun:
        frame = pl.read_parquet(directory / "held_out.parquet")
        doc = json.loads((directory / "counters.json").read_text())
        return cls(frame.drop("ttft_s"), frame["ttft_s"].to_list(), {(a, b): v for a, b, v in doc["before"]},
                   {(a, b): v for a, b, v in doc["after"]}, doc["mode"])


@dataclasses.dataclass(frozen=True)
class HeldOutResult:
    engine: TierRatios
    twin: TierRatios
    requests: int
    prompt_tokens: int
    mode: str
    engine_tokens: tuple[int, int, int]  # prompt tokens served from device / host / disk, by the engine
    twin_tokens: tuple[int, int, int]  # ... by the twin's GPU / CPU / L2
    engine_p50: float
    engine_p95: float
    twin_p50: float
    twin_p95: float

    @property
    def p50_err(self) -> float:
        return self.twin_p50 / self.engine_p50 - 1

    @property
    def p95_err(self) -> float:
        return self.twin_p95 / self.engine_p95 - 1

    def ratio_errors(self) -> tuple[float, float, float]:
        e, t = self.engine, self.twin
        return t.l0 - e.l0, t.l1 - e.l1, t.l2 - e.l2

    def ok(self) -> bool:
        return (all(abs(x) <= HIT_TARGET for x in self.ratio_errors())
                and abs(self.p50_err) <= TTFT_TARGET and abs(self.p95_err) <= TTFT_TARGET)


def _quantiles(x: list[float]) -> tuple[float, float]:
    a = np.asarray(x)
    return float(np.quantile(a, 0.5)), float(np.quantile(a, 0.95))


def send_held_out(probe: TierProbe, frame: pl.DataFrame, *, salt: int, rate_rps: float | None = None) -> HeldOutRun:
    """Send `frame` to the engine, one request at a time or open-loop at `rate_rps`."""
    ids = list(prompts(frame, PromptBuilder(salt=salt)))
    before = probe.counters()
    if rate_rps is None:
        done, mode = probe.sender.send_closed_loop(ids), ONE_AT_A_TIME
    else:
        gaps = np.random.default_rng(salt).exponential(1.0 / rate_rps, len(ids))
        done, mode = probe.sender.send_open_loop(ids, np.cumsum(gaps).tolist()), f"open loop at {rate_rps:.2f} req/s"
    after = probe.counters()
    bad = [c for c in done if not c.ok]
    if bad or len(done) != len(ids):
        raise RuntimeError(f"held-out: {len(bad)} of {len(done)} requests failed: {bad[0].error if bad else 'missing'}")
    sent = frame.with_columns(pl.Series("timestamp_ms", [int(c.sent_s * 1000) for c in done], dtype=pl.Int64))
    return HeldOutRun(sent, [c.latency_s for c in done], before, after, mode)


def compare(run: HeldOutRun, profile: HardwareProfile, *, kv_tokens: int, cpu_tokens: int, chunk_tokens: int,
            native_tiering: bool = True) -> HeldOutResult:
    """Replay the stream the engine served on the twin, with the engine's sizes; both sides' figures."""
    cluster = ClusterSpec(pods=1, gpu_tokens=kv_tokens, cpu_tokens=cpu_tokens, l2_tokens=FS_TOKENS, profile=profile,
                          native_tiering=native_tiering)
    sent = run.sent
    if run.mode == ONE_AT_A_TIME:  # nothing queued at the engine: nothing may queue in the twin
        sent = sent.with_columns((pl.int_range(pl.len(), dtype=pl.Int64) * SPACED_MS).alias("timestamp_ms"))
    r = replay(sent, cluster, Knobs(chunk_tokens=chunk_tokens, cpu_gib=0.0)).requests
    before, after = run.before, run.after

    def src(name: str) -> int:
        return int(delta(before, after, "vllm:prompt_tokens_cached_by_source_total", name))

    e50, e95 = _quantiles(run.ttft_s)
    t50, t95 = _quantiles(r["ttft_s"].to_list())
    return HeldOutResult(counter_ratios(before, after), engine_style_ratios(r, chunk_tokens), len(run.ttft_s),
                         int(run.sent["input_length"].sum()), run.mode, (src("device"), src("host"), src("disk")),
                         (int(r["gpu_hit_tokens"].sum()), int(r["cpu_hit_tokens"].sum()), int(r["l2_hit_tokens"].sum())),
                         e50, e95, t50, t95)


__all__ = ["HELD_OUT", "HIT_TARGET", "TTFT_TARGET", "HeldOutResult", "HeldOutRun", "TierFits", "calibration_hits", "compare", "fit_base", "fit_tiers",
           "held_out_stream", "send_held_out"]
