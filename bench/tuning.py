"""Benchmark: how close do TPE and random search get to the exhaustive grid optimum on the twin?

For each workload (both Mooncake traces, sliced, and one synthetic preset) every point of a
discrete search space is replayed on the digital twin once (the exhaustive grid optimum). TPE
and random search then run 40 ask/tell trials over the same space for 5 seeds each, reading
evaluations from the shared cache (a configuration is never replayed twice). Reported:

- mean regret (% above the grid optimum) after 20 and 40 trials, per sampler;
- TTFT p95 of the tuned configuration (TPE, 40 trials) against the defaults
  (LMCache: chunk 256, CPU 5 GiB, LRU; round-robin routing);
- the drift detector's false-alarm rate on stationary synthetic workloads and its detection
  delay on the `shift` preset and on Gaussian level shifts of 2/3/4 sigma.

Target: TPE mean regret <= 2% at 40 trials, and below random. Run: .venv/bin/python bench/tuning.py
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import optuna

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from simulator.cluster import ClusterSpec
from simulator.knobs import Knobs
from simulator.synthetic import synthetic
from tuners.drift import DriftDetector, DriftSettings, SignalDetector, workload_signals
from tuners.evaluators import EvaluationCache, TwinEvaluator, run_trials
from tuners.objective import ObjectiveSpec
from tuners.offline import load_workload
from tuners.optuna_tuner import OptunaTuner
from tuners.space import Choice, DeploymentLimits, FloatRange, IntRange, SearchSpace

L2_TOKENS = 64 * 8192  # a 64 GiB shared pool (Llama-3.1-8B bf16: 8,192 tokens per GiB): eviction matters
LIMITS = DeploymentLimits(pods=16, node_memory_headroom_gib=32.0, l2_pool_gib=64.0)
# 4 x 3 x 3 x 4 x 3 = 432 configurations. Watermarks and CPU eviction stay at their defaults.
SPACE = SearchSpace(
    (Choice("chunk_tokens", (128, 256, 512, 1024)), FloatRange("cpu_gib", 0.0, 32.0, 16.0),
     Choice("l2_eviction", ("lru", "lfu", "s3fifo")),
     Choice("router", ("roundrobin", "session", "prefixaware", "kvaware")),
     IntRange("l2_min_prompt_tokens", 0, 4096, 2048)),
    LIMITS,
)
DEFAULTS = Knobs()


def shared_dir() -> Path:
    env = os.environ.get("TIERPILOT_SHARED")
    return Path(env) if env else REPO.parent / "shared"


def workloads(seed: int) -> list[tuple[str, object, ClusterSpec]]:
    traces = shared_dir() / "traces"
    return [
        ("mooncake conversation (first 600 requests)",
         load_workload(trace=traces / "mooncake_fast25_conversation_trace.jsonl", preset=None, max_requests=600),
         ClusterSpec(pods=16, l2_tokens=L2_TOKENS)),
        ("mooncake synthetic (first 500 requests)",
         load_workload(trace=traces / "mooncake_fast25_synthetic_trace.jsonl", preset=None, max_requests=500),
         ClusterSpec(pods=16, l2_tokens=L2_TOKENS)),
        ("synthetic 'shift' preset (300 s)",
         synthetic("shift", seed=seed, duration_s=300.0), ClusterSpec(pods=8, l2_tokens=L2_TOKENS)),
    ]


def grid_optimum(evaluator: TwinEvaluator, label: str) -> tuple[Knobs, float, float]:
    t0 = time.perf_counter()
    points = list(SPACE.iter_grid())
    best: tuple[Knobs, float] | None = None
    for i, knobs in enumerate(points, 1):
        v = evaluator.evaluate(knobs).ttft_p95_s
        if best is None or v < best[1]:
            best = (knobs, v)
        if i % 48 == 0 or i == len(points):
            print(f"  grid {label}: {i}/{len(points)} replayed ({time.perf_counter() - t0:.0f} s)", flush=True)
    assert best is not None
    return best[0], best[1], time.perf_counter() - t0


def sampler_regrets(evaluator: TwinEvaluator, optimum: float, sampler: str, seeds: int,
                    checkpoints: tuple[int, ...]) -> tuple[dict[int, list[float]], list[float]]:
    """Regret (%) per checkpoint and seed, and trials needed to get within 1% (inf if never)."""
    out: dict[int, list[float]] = {c: [] for c in checkpoints}
    to_1pct: list[float] = []
    for seed in range(seeds):
        tuner = OptunaTuner(SPACE, ObjectiveSpec(), storage=None, study_name=f"{sampler}-{seed}",
                            sampler=sampler, seed=seed)
        records = run_trials(tuner, evaluator, max(checkpoints))
        values = [r.value if r.value is not None else float("inf") for r in records]
        for c in checkpoints:
            out[c].append(100.0 * (min(values[:c]) / optimum - 1.0))
        to_1pct.append(next((i + 1 for i, v in enumerate(values) if v <= optimum * 1.01), float("inf")))
    return out, to_1pct


def drift_figures(seeds: int) -> None:
    print("\n== drift detection (Page-Hinkley, warm-up 20, delta 0.5, threshold 16 noise units) ==")
    windows = alarms = 0
    for preset in ("rag", "sessions", "short"):
        for seed in range(1, seeds + 1):
            sig = workload_signals(synthetic(preset, seed=seed, duration_s=1200.0), 10.0)
            det = DriftDetector(DriftSettings())
            alarms += sum(1 for s in sig if det.update(s, s["t"]))
            windows += len(sig)
    print(f"stationary presets (rag, sessions, short; {seeds} seeds, 20 min, 10 s windows): "
          f"{alarms} false alarms in {windows} windows ({1000 * alarms / windows:.2f} per 1,000 windows)")
    delays = []
    for seed in range(1, seeds + 1):
        wl = synthetic("shift", seed=seed, duration_s=1200.0)
        sig = workload_signals(wl, 10.0)
        change = 600.0 + sig[0]["t"]
        det = DriftDetector(DriftSettings())
        hits = [(e.at, e.signal) for s in sig if (e := det.update(s, s["t"]))]
        after = [h for h in hits if h[0] >= change]
        delays.append(after[0][0] - change if after else float("nan"))
        early = len(hits) - len(after)
        print(f"  shift preset seed {seed}: change at {change:.0f} s, alarm(s) {hits}, false before change: {early}")
    print(f"shift preset detection delay: mean {np.nanmean(delays):.1f} s (windows of 10 s), "
          f"max {np.nanmax(delays):.1f} s, missed {sum(np.isnan(delays))}/{len(delays)}")
    n, runs = 1000, 40
    for method in ("page_hinkley", "cusum"):
        fa = 0
        for s in range(runs):  # a detector re-learns after each alarm, so every alarm counts
            rng = np.random.default_rng(s)
            det1 = SignalDetector("x", DriftSettings(method=method))
            fa += sum(1 for v in 0.5 + 0.03 * rng.standard_normal(n) if det1.update(float(v)))
        parts = []
        for k in (2, 3, 4):
            ds = []
            for s in range(runs):
                rng = np.random.default_rng(1000 + s)
                x = 0.5 + 0.03 * rng.standard_normal(300)
                x[100:] -= 0.03 * k
                det1 = SignalDetector("x", DriftSettings(method=method))
                i = next((i for i, v in enumerate(x) if det1.update(float(v))), None)
                if i is not None and i >= 100:
                    ds.append(i - 100)
            parts.append(f"{k} sigma: {statistics.mean(ds):.1f} pts ({len(ds)}/{runs} found)")
        print(f"gaussian, {method}: {1000 * fa / (runs * n):.3f} false alarms per 1,000 points; delay "
              + "; ".join(parts))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seeds", type=int, default=5, help="seeds per sampler (default 5)")
    ap.add_argument("--no-drift", action="store_true", help="skip the drift-detection figures")
    args = ap.parse_args()
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    checkpoints = (10, 20, 40)
    print(f"search space: {SPACE.grid_size()} configurations "
          f"({' x '.join(str(len(v)) for v in SPACE.grid().values())}: {', '.join(SPACE.grid())}); "
          f"L2 pool fixed at {L2_TOKENS:,} tokens (64 GiB)")
    summary = []
    for label, wl, cluster in workloads(seed=1):
        print(f"\n== {label}: {wl.height} requests, {cluster.pods} pods ==", flush=True)
        ev = TwinEvaluator(wl, cluster, LIMITS, cache=EvaluationCache())
        opt_knobs, optimum, grid_s = grid_optimum(ev, label.split()[0])
        default_v = ev.evaluate(DEFAULTS).ttft_p95_s
        grid_values = np.array([e.ttft_p95_s for k, e in ev.cache.items() if k != DEFAULTS])
        print(f"share of the grid within 1% / 2% / 5% of the optimum: "
              f"{np.mean(grid_values <= optimum * 1.01):.1%} / {np.mean(grid_values <= optimum * 1.02):.1%} / "
              f"{np.mean(grid_values <= optimum * 1.05):.1%} (random search's odds per trial)")
        print(f"grid optimum TTFT p95 {optimum:.3f} s ({grid_s:.0f} s for {ev.replays} replays, "
              f"{grid_s / max(ev.replays, 1) * 1000:.0f} ms each): {opt_knobs.to_dict()}")
        print(f"defaults TTFT p95 {default_v:.3f} s -> grid optimum is {default_v / optimum:.2f}x faster")
        runs = {s: sampler_regrets(ev, optimum, s, args.seeds, checkpoints) for s in ("tpe", "random")}
        regrets = {s: r[0] for s, r in runs.items()}
        for s, by_c in regrets.items():
            for c in checkpoints:
                vals = by_c[c]
                print(f"  {s:6s} after {c:2d} trials: mean regret {statistics.mean(vals):5.2f}%  "
                      f"(per seed: {', '.join(f'{v:.2f}' for v in vals)})")
            print(f"  {s:6s} trials to reach within 1% of the optimum, per seed: "
                  f"{', '.join(str(t) for t in runs[s][1])}")
        tuned = optimum * (1 + statistics.mean(regrets["tpe"][40]) / 100)
        print(f"tuned (TPE, 40 trials, mean over seeds) TTFT p95 {tuned:.3f} s vs defaults {default_v:.3f} s: "
              f"{default_v / tuned:.2f}x; replays total {ev.replays} (cache hits {ev.cache.hits})")
        summary.append((label, statistics.mean(regrets["tpe"][10]), statistics.mean(regrets["random"][10]),
                        statistics.mean(regrets["tpe"][20]), statistics.mean(regrets["random"][20]),
                        statistics.mean(regrets["tpe"][40]), statistics.mean(regrets["random"][40]),
                        default_v / tuned))
    print("\n== summary: mean regret % above the grid optimum (5 seeds) ==")
    print(f"{'workload':45s} {'TPE@10':>7s} {'rand@10':>8s} {'TPE@20':>7s} {'rand@20':>8s} {'TPE@40':>7s} "
          f"{'rand@40':>8s} {'defaults/tuned':>15s}")
    for label, t10, r10, t20, r20, t40, r40, speedup in summary:
        print(f"{label:45s} {t10:7.2f} {r10:8.2f} {t20:7.2f} {r20:8.2f} {t40:7.2f} {r40:8.2f} {speedup:14.2f}x")
    mean_t40 = statistics.mean(s[5] for s in summary)
    mean_r40 = statistics.mean(s[6] for s in summary)
    ok = mean_t40 <= 2.0 and mean_t40 <= mean_r40
    print(f"overall mean regret at 40 trials: TPE {mean_t40:.2f}% vs random {mean_r40:.2f}% "
          f"(target: TPE <= 2% and below random: {'met' if ok else 'NOT met'})")
    if not args.no_drift:
        drift_figures(args.seeds)


if __name__ == "__main__":
    main()
