"""Benchmark: twin searches in parallel on one optuna study in a real PostgreSQL.

For 1, 2 and 4 worker processes at the same trial budget (and the same seeds), prints:
- wall time per search and the speed-up against 1 worker, in this process; every arm, 1 worker
  included, runs in freshly spawned processes, so each pays the same start-up (imports, workload);
- the best TTFT p95 each search found, and a two-sided Mann-Whitney U test of the parallel
  searches' best values against the serial ones (a large p: no evidence the parallel search finds
  worse configurations at the same budget).
Target: about 2x with 2 and with 4 workers on a 2-core machine; best values equal in distribution.

PostgreSQL 15 is started on a free loopback port (tests/support/postgres.py). The machine is
shared: figures are noisy, and the speed-up is bounded by the cores actually free.
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trials", type=int, default=24, help="trial budget per search")
    ap.add_argument("--seeds", type=int, default=4, help="searches per worker count")
    ap.add_argument("--requests", type=int, default=1500, help="replayed requests per trial")
    ap.add_argument("--workers", default="1,2,4")
    ap.add_argument("--trace", type=Path, default=None,
                    help="replay this Mooncake trace instead of the `sessions` preset (heavier trials)")
    args = ap.parse_args()

    import optuna
    from scipy.stats import mannwhitneyu

    from tests.support.postgres import running_postgres
    from tuners.parallel import ClusterArgs, WorkloadSpec, parallel_tune
    from tuners.space import DeploymentLimits

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    counts = [int(x) for x in args.workers.split(",")]
    workload = (WorkloadSpec(trace=args.trace, max_requests=args.requests) if args.trace
                else WorkloadSpec(preset="sessions", seed=0, max_requests=args.requests))
    cluster = ClusterArgs({"pods": 4})
    limits = DeploymentLimits(pods=4, l2_backend="twin")
    print(f"{os.cpu_count()} cores; load average {os.getloadavg()[0]:.1f} at start; budget {args.trials} trials, "
          f"{args.trace or 'sessions'} up to {args.requests} requests per trial, {args.seeds} seeds per worker count")
    walls: dict[int, list[float]] = {n: [] for n in counts}
    bests: dict[int, list[float]] = {n: [] for n in counts}
    with running_postgres("bench") as url:
        for seed in range(args.seeds):
            for n in counts:  # interleaved, so drift in the machine's load hits every arm alike
                t = time.perf_counter()
                res = parallel_tune(workload, cluster, limits, storage=url, study=f"s{seed}-w{n}",
                                    trials=args.trials, workers=n, seed=seed)
                walls[n].append(time.perf_counter() - t)
                bests[n].append(res.best.value if res.best and res.best.value is not None else float("nan"))
                print(f"  seed {seed} workers {n}: {walls[n][-1]:6.1f} s, best TTFT p95 {bests[n][-1]:.4f} s")
    base = statistics.median(walls[counts[0]])
    print("\nworkers  median wall s  speed-up  median best p95 s  Mann-Whitney p vs 1 worker")
    for n in counts:
        p = mannwhitneyu(bests[n], bests[counts[0]], alternative="two-sided").pvalue if n != counts[0] else 1.0
        print(f"{n:>7}  {statistics.median(walls[n]):13.1f}  {base / statistics.median(walls[n]):7.2f}x  "
              f"{statistics.median(bests[n]):17.4f}  {p:.2f}")
    print(f"load average {os.getloadavg()[0]:.1f} at the end (the machine is shared: 2 cores, noisy)")


if __name__ == "__main__":
    main()
