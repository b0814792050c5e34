"""Benchmark: how close do TPE and random search get to the exhaustive grid optimum on the twin?

Search space: the DESIGN.md space at its real granularity, bounded by one deployment's limits
(`limits`): chunk 64..2048 tokens (6), CPU buffer 0..12 GiB per pod in 2 GiB steps (node memory
headroom 12 GiB; 7), every L2 eviction policy the twin has (5; watermarks 1/1), every router (4),
L2 read threshold 0..1024 tokens in steps of 256 (5): 4,200 configurations. (Above ~1k tokens an
L2 read always pays on this profile: its calibration has a 2,500-token prompt 2.7x faster from
L2, and a 500-token prompt ~1.0x.) The shared L2 pool is
fixed at 64 GiB, so L2 eviction matters.

For each workload (both Mooncake traces and the `shift` synthetic preset, each sliced to a
short time window on a fixed pod count so one replay takes tens of milliseconds) every grid point
is replayed on the digital twin once: the exhaustive grid optimum. Replays run in `--jobs`
worker processes and are cached by configuration in a JSON file per workload under
`--cache-dir` (keyed by a digest of the workload slice, the cluster and the twin's source code,
so a changed twin is never read from a stale cache); reruns read the file. TPE and random search
then run 40 ask/tell trials over the same space for `--seeds` seeds each (0..seeds-1), reading
the shared cache (no configuration is replayed twice). Reported per workload:

- regret (% above the grid optimum) after 10, 20 and 40 trials, mean and worst over seeds, for
  TPE and random search, plus random search's exact expected regret computed from the grid;
- the share of the grid within 1% / 2% / 5% of the optimum (how hard the problem is);
- TTFT p95 of the tuned configuration (TPE, 40 trials, mean over seeds) against the defaults
  (LMCache: chunk 256, CPU 5 GiB, LRU; round-robin routing);
- the drift detector's false-alarm rate on stationary synthetic workloads and its detection
  delay on the `shift` preset and on Gaussian level shifts of 2/3/4 sigma.

Target: TPE mean regret <= 2% at 40 trials, and below random.
Run: .venv/bin/python bench/tuning.py   (about 7 min cold on a shared 2-core machine; under a minute
with the cache)
"""
from __future__ import annotations

import argparse
import dataclasses
import hashlib
import json
import multiprocessing
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Self

import numpy as np
import optuna
import polars as pl

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))

from helpers.drift_figures import drift_figures  # bench/ is on the path from here

from contracts.knobs import Knobs
from simulator.cluster import ClusterSpec
from simulator.synthetic import synthetic
from tuners.evaluators import EvaluationCache, TwinEvaluator, evaluation_from_summary, run_trials
from tuners.objective import ObjectiveSpec
from tuners.offline import load_workload
from tuners.optuna_tuner import OptunaTuner
from tuners.space import DeploymentLimits, SearchSpace

L2_TOKENS = 64 * 8192  # a 64 GiB shared pool (Llama-3.1-8B bf16: 8,192 tokens per GiB): eviction matters
GPU_TOKENS = 8 * 8192  # GPU prefix cache per pod
CHECKPOINTS = (10, 20, 40)
SAMPLERS = ("tpe", "random")
DEFAULTS = Knobs()


def limits(pods: int) -> DeploymentLimits:
    """One deployment: 12 GiB host memory headroom per pod for the CPU buffer (2 GiB steps), a
    fixed 64 GiB L2 pool with every twin eviction policy (on-demand eviction, watermarks 1/1),
    all routers, chunk sizes 64..2048, L2 read threshold 0..1024 in steps of 256."""
    return DeploymentLimits(pods=pods, node_memory_headroom_gib=12.0, cpu_gib_step=2.0, l2_pool_gib=64.0,
                            l2_backend="twin", watermarks=((1.0, 1.0),), l2_threshold_max=1024,
                            l2_threshold_step=256)


@dataclasses.dataclass(frozen=True)
class Workload:
    """A replay slice: `frame` is replayed whole, TTFT and hit ratio are measured on the requests
    arriving at or after `measure_from_ms` (the earlier ones warm the caches up)."""

    name: str
    label: str
    frame: pl.DataFrame
    cluster: ClusterSpec
    measure_from_ms: int = 0

    @property
    def space(self) -> SearchSpace:
        return SearchSpace.from_limits(limits(self.cluster.pods))


def shared_dir() -> Path:
    env = os.environ.get("TIERPILOT_SHARED")
    return Path(env) if env else REPO.parent / "shared"


def conversations(frame: pl.DataFrame, keep_one_in: int) -> pl.DataFrame:
    """Every `keep_one_in`-th conversation of a Mooncake trace, whole. Mooncake has no session ids;
    a request's second prefix block (its first if it has one) identifies its conversation or
    document, so turns and questions sharing a prefix are kept or dropped together."""
    ids = pl.col("hash_ids")
    key = ids.list.get(1, null_on_oob=True).fill_null(ids.list.get(0))
    return frame.filter((key * 2654435761) % (1 << 32) % keep_one_in == 0)


def trace_slice(name: str, cluster: ClusterSpec, *, keep_one_in: int, start_s: float, warm_s: float,
                measure_s: float) -> Workload:
    """Measure [start, start + measure) of a thinned trace after `warm_s` of warm-up replay."""
    frame = load_workload(trace=shared_dir() / "traces" / f"mooncake_fast25_{name}_trace.jsonl", preset=None)
    t0 = int(frame["timestamp_ms"].min())
    lo, start, hi = (t0 + int(x * 1000) for x in (start_s - warm_s, start_s, start_s + measure_s))
    frame = conversations(frame, keep_one_in).filter(pl.col("timestamp_ms").is_between(lo, hi, closed="left"))
    label = (f"mooncake {name}, 1/{keep_one_in} of conversations, {start_s:.0f}-{start_s + measure_s:.0f} s "
             f"(+{warm_s:.0f} s warm-up), {cluster.pods} pods")
    return Workload(f"mooncake {name}", label, frame, cluster, measure_from_ms=start)


def workloads() -> list[Workload]:
    """Replay slices of about 400-850 requests (tens of ms per replay). GPU prefix cache: 64k
    tokens (8 GiB of KV) per pod left for cached prefixes beside the running batch; shared L2 64 GiB.
    Thinned traces run on fewer pods, so the per-pod load stays that of the full trace on ~24 pods."""
    def cluster(pods: int) -> ClusterSpec:
        return ClusterSpec(pods=pods, gpu_tokens=GPU_TOKENS, l2_tokens=L2_TOKENS)

    return [
        trace_slice("conversation", cluster(6), keep_one_in=4, start_s=1200.0, warm_s=600.0, measure_s=300.0),
        trace_slice("synthetic", cluster(6), keep_one_in=4, start_s=480.0, warm_s=240.0, measure_s=180.0),
        Workload("'shift' preset", "synthetic 'shift' preset (rag -> sessions), 300 s, 8 pods",
                 synthetic("shift", seed=1, duration_s=300.0), cluster(8)),
    ]


# -- the grid cache --------------------------------------------------------------------------
def twin_source_digest() -> str:
    """Digest of the twin's code and data: every simulator module except the demo's, plus the
    profiles and model files. A changed twin never reads a stale cache."""
    sim = REPO / "simulator"
    files = [f for f in sorted(sim.glob("*.py")) if not f.name.startswith("demo")]
    files += sorted(sim.glob("profiles/*.yaml")) + sorted(sim.glob("*.yaml"))
    h = hashlib.sha256()
    for f in files:
        h.update(f.name.encode())
        h.update(f.read_bytes())
    return h.hexdigest()


def cache_path(cache_dir: Path, wl: Workload, twin_digest: str) -> Path:
    h = hashlib.sha256(twin_digest.encode())
    h.update(f"{wl.cluster!r} measure_from_ms={wl.measure_from_ms}".encode())
    cols = ("timestamp_ms", "input_length", "output_length", "hash_ids", "session_id")
    h.update(json.dumps(wl.frame.select(cols).to_dict(as_series=False), default=str).encode())
    slug = "".join(c if c.isalnum() else "-" for c in wl.name).strip("-")
    return cache_dir / f"tuning-{slug}-{h.hexdigest()[:16]}.json"


def knobs_key(k: Knobs) -> str:
    return json.dumps(k.to_dict(), sort_keys=True)


def load_cache(path: Path) -> dict[str, dict[str, Any]]:
    try:
        return json.loads(path.read_text())["summaries"]
    except (OSError, ValueError, KeyError):
        return {}


def save_cache(path: Path, summaries: dict[str, dict[str, Any]]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps({"summaries": summaries}))
    tmp.replace(path)


def measured_summary(frame: pl.DataFrame, cluster: ClusterSpec, knobs: Knobs, measure_from_ms: int) -> dict[str, Any]:
    """Replay the whole slice; TTFT p50/p95 (as the twin's summary computes them) and hit ratio
    over the requests arriving at or after `measure_from_ms`."""
    from simulator.replay import replay

    r = replay(frame, cluster, knobs).requests.filter(pl.col("timestamp_ms") >= measure_from_ms)
    p50, p95 = (float(x) for x in np.percentile(r["ttft_s"].to_numpy(), [50, 95]))
    hits = sum(int(r[f"{t}_hit_tokens"].sum()) for t in ("gpu", "cpu", "l2"))
    return {"ttft_p50_s": p50, "ttft_p95_s": p95, "hit_ratio": hits / max(int(r["prompt_tokens"].sum()), 1),
            "requests": r.height}


_WORK: Workload | None = None  # per worker process, set by _init_worker


def _init_worker(wl: Workload) -> None:
    global _WORK
    _WORK = wl


def _replay_one(knobs: Knobs) -> tuple[str, dict[str, Any]]:
    assert _WORK is not None
    return knobs_key(knobs), measured_summary(_WORK.frame, _WORK.cluster, knobs, _WORK.measure_from_ms)


def fill_grid(wl: Workload, path: Path, jobs: int) -> tuple[dict[str, dict[str, Any]], int, float]:
    """Every grid point's replay summary (cached ones from `path`). Returns (summaries, new, seconds)."""
    summaries = load_cache(path)
    points = [k for k in wl.space.iter_grid() if knobs_key(k) not in summaries]
    if DEFAULTS not in points and knobs_key(DEFAULTS) not in summaries:
        points.append(DEFAULTS)
    t0 = time.perf_counter()
    if not points:
        return summaries, 0, 0.0
    print(f"  replaying {len(points):,} configurations ({len(summaries):,} cached) on {jobs} worker(s)",
          flush=True)
    _init_worker(wl)
    step = max(len(points) // 20, 1)
    # spawn, not fork: forking a process whose polars thread pool is running can deadlock
    ctx = multiprocessing.get_context("spawn")
    pool_cm = (ctx.Pool(jobs, initializer=_init_worker, initargs=(wl,)) if jobs > 1
               else _InlinePool())
    with pool_cm as pool:
        for i, (key, summary) in enumerate(pool.imap_unordered(_replay_one, points, chunksize=8), 1):
            summaries[key] = summary
            if i % step == 0 or i == len(points):
                el = time.perf_counter() - t0
                print(f"  {i:,}/{len(points):,} replayed, {el:.0f} s, ~{el / i * (len(points) - i):.0f} s left",
                      flush=True)
                save_cache(path, summaries)
    return summaries, len(points), time.perf_counter() - t0


class _InlinePool:
    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        return None

    def imap_unordered(self, fn: Any, items: list[Knobs], chunksize: int = 1) -> Any:
        return map(fn, items)


def evaluator_for(wl: Workload, summaries: dict[str, dict[str, Any]]) -> TwinEvaluator:
    """A twin evaluator whose cache holds every grid point (samplers never replay)."""
    space = wl.space
    cache = EvaluationCache()
    for k in [*space.iter_grid(), DEFAULTS]:
        cache.put(k, evaluation_from_summary(summaries[knobs_key(k)], k, space.limits))
    return TwinEvaluator(wl.frame, wl.cluster, space.limits, cache=cache,
                         replay_fn=lambda frame, cluster, knobs: _Measured(
                             measured_summary(frame, cluster, knobs, wl.measure_from_ms)))


@dataclasses.dataclass(frozen=True)
class _Measured:
    """A replay result as `TwinEvaluator` reads it: only the measured window's summary."""

    measured: dict[str, Any]

    def summary(self) -> dict[str, Any]:
        return self.measured


# -- samplers --------------------------------------------------------------------------------
def sampler_regrets(wl: Workload, evaluator: TwinEvaluator, optimum: float, sampler: str,
                    seeds: int) -> tuple[dict[int, list[float]], list[float], list[int]]:
    """Regret (%) per checkpoint and seed, trials needed to get within 1% (inf if never), and the
    number of distinct configurations among the 40 trials, per seed."""
    out: dict[int, list[float]] = {c: [] for c in CHECKPOINTS}
    to_1pct: list[float] = []
    distinct: list[int] = []
    for seed in range(seeds):
        tuner = OptunaTuner(wl.space, ObjectiveSpec(), storage=None, study_name=f"{sampler}-{seed}",
                            sampler=sampler, seed=seed)
        records = run_trials(tuner, evaluator, max(CHECKPOINTS))
        values = [r.value if r.value is not None else float("inf") for r in records]
        for c in CHECKPOINTS:
            out[c].append(100.0 * (min(values[:c]) / optimum - 1.0))
        to_1pct.append(next((i + 1 for i, v in enumerate(values) if v <= optimum * 1.01), float("inf")))
        distinct.append(len({r.knobs for r in records}))
    return out, to_1pct, distinct


def expected_random_regret(grid_values: np.ndarray, optimum: float, n: int) -> float:
    """Exact expected regret (%) of the best of n uniform draws (with replacement) from the grid."""
    v = np.sort(grid_values)
    m = len(v)
    # P(min = v[i]) = ((m - i) / m)^n - ((m - i - 1) / m)^n
    i = np.arange(m)
    p = ((m - i) / m) ** n - ((m - i - 1) / m) ** n
    return float(100.0 * (np.dot(p, v) / optimum - 1.0))


# -- main ------------------------------------------------------------------------------------
def fmt(vals: list[float]) -> str:
    return f"{statistics.mean(vals):5.2f} / {max(vals):5.2f}"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seeds", type=int, default=5, help="seeds per sampler, 0..N-1 (default 5)")
    ap.add_argument("--jobs", type=int, default=2, help="worker processes for the grid replays (default 2)")
    ap.add_argument("--cache-dir", type=Path, default=Path(tempfile.gettempdir()) / "tierpilot-bench-cache",
                    help="where grid replays are cached (default: $TMPDIR/tierpilot-bench-cache)")
    ap.add_argument("--no-drift", action="store_true", help="skip the drift-detection figures")
    args = ap.parse_args()
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    t_start = time.perf_counter()
    twin_digest = twin_source_digest()
    summary = []
    for wl in workloads():
        space = wl.space
        print(f"\n== {wl.label}: {wl.frame.height} requests ==", flush=True)
        print(f"search space: {space.grid_size():,} configurations "
              f"({' x '.join(str(len(v)) for v in space.grid().values())}: {', '.join(space.grid())})")
        path = cache_path(args.cache_dir, wl, twin_digest)
        for stale in path.parent.glob(path.name.rsplit("-", 1)[0] + "-*.json"):
            if stale != path:  # an older twin or slice: never read again
                stale.unlink()
        summaries, replayed, grid_s = fill_grid(wl, path, args.jobs)
        print(f"  grid: {replayed:,} replays in {grid_s:.0f} s"
              + (f" ({grid_s / replayed * 1000 * args.jobs:.0f} ms each per worker)" if replayed else "")
              + f"; cache {path}", flush=True)
        ev = evaluator_for(wl, summaries)
        grid = [(k, ev.evaluate(k).ttft_p95_s) for k in space.iter_grid()]
        opt_knobs, optimum = min(grid, key=lambda kv: kv[1])
        values = np.array([v for _, v in grid])
        default_v = ev.evaluate(DEFAULTS).ttft_p95_s
        print(f"grid optimum TTFT p95 {optimum:.3f} s: {space.to_params(opt_knobs)}")
        print(f"grid median {np.median(values):.3f} s, worst {values.max():.3f} s; defaults {default_v:.3f} s")
        print(f"share of the grid within 1% / 2% / 5% of the optimum: {np.mean(values <= optimum * 1.01):.2%} / "
              f"{np.mean(values <= optimum * 1.02):.2%} / {np.mean(values <= optimum * 1.05):.2%}")
        runs = {s: sampler_regrets(wl, ev, optimum, s, args.seeds) for s in SAMPLERS}
        exp_rand = {c: expected_random_regret(values, optimum, c) for c in CHECKPOINTS}
        print(f"  regret % (mean / worst over {args.seeds} seeds)   @10           @20           @40")
        for s in SAMPLERS:
            r = runs[s][0]
            print(f"  {s:6s}                              {fmt(r[10])}  {fmt(r[20])}  {fmt(r[40])}   "
                  f"trials to 1%: {', '.join(str(t) for t in runs[s][1])}; distinct configs in 40: "
                  f"{', '.join(map(str, runs[s][2]))}")
        print(f"  random, expected (exact, from the grid) {exp_rand[10]:13.2f}  {exp_rand[20]:12.2f}  "
              f"{exp_rand[40]:12.2f}")
        tuned = optimum * (1 + statistics.mean(runs["tpe"][0][40]) / 100)
        print(f"tuned (TPE, 40 trials, mean over seeds) TTFT p95 {tuned:.3f} s vs defaults {default_v:.3f} s: "
              f"{default_v / tuned:.2f}x", flush=True)
        summary.append((wl.name, optimum, default_v, {s: runs[s][0] for s in SAMPLERS}, exp_rand, tuned))
    print(f"\n== summary: regret % above the grid optimum, mean / worst over {args.seeds} seeds ==")
    head = "".join(f" {f'{s}@{c}':>13s}" for c in CHECKPOINTS for s in ("TPE", "rand"))
    print(f"{'workload':22s}{head} {'E[rand@40]':>10s} {'defaults':>9s} {'tuned':>7s}")
    for label, optimum, default_v, regrets, exp_rand, tuned in summary:
        cells = "".join(f" {fmt(regrets[s][c]):>13s}" for c in CHECKPOINTS for s in SAMPLERS)
        print(f"{label:22s}{cells} {exp_rand[40]:10.2f} {default_v:8.2f}s {tuned:6.2f}s")
    mean_t40 = statistics.mean(statistics.mean(s[3]["tpe"][40]) for s in summary)
    mean_r40 = statistics.mean(statistics.mean(s[3]["random"][40]) for s in summary)
    below = all(statistics.mean(s[3]["tpe"][40]) < statistics.mean(s[3]["random"][40]) for s in summary)
    ok = mean_t40 <= 2.0 and mean_t40 < mean_r40
    print(f"overall mean regret at 40 trials: TPE {mean_t40:.2f}% vs random {mean_r40:.2f}% "
          f"(target: TPE <= 2% and below random: {'met' if ok else 'NOT met'}; "
          f"below random on every workload: {'yes' if below else 'no'})")
    print(f"benchmark (without drift figures): {time.perf_counter() - t_start:.0f} s", flush=True)
    if not args.no_drift:
        drift_figures(args.seeds)


if __name__ == "__main__":
    main()
