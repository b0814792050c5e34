"""Benchmark of the agent's accuracy: every exported signal against the twin's truth,
end to end through the real HTTP scrape -> parse -> normalise -> window -> export path, over a
seeded emulated run with two rolling restarts (a plain rollout, then a configuration change).

The emulated cluster runs faster than the demo (`--time-scale` cluster seconds per wall second).
Prints the `## Agent accuracy` table (median and p95 absolute error, steady state and around
restarts), the quantiles' bucket-limited floor, and the live view's comparison bias; then the
targets as measured ratios (error / target; <= 1 meets it).

Targets: hit ratios within 2 pp (median) and 5 pp (p95); TTFT and L2 read quantiles within 10%
(median) and 20% (p95) where the buckets allow it (else the floor is stated).
Run: .venv/bin/python bench/accuracy.py [--wall 60] [--time-scale 30] [--seed 11]
"""
from __future__ import annotations

import argparse
import logging
import math
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from emulator.demo.accuracy import FLOOR, floor_signals, summarise
from emulator.demo.accuracy_run import AccuracySettings, run_accuracy

TARGETS = {"GPU hit ratio": (2.0, 5.0), "CPU hit ratio": (2.0, 5.0), "L2 hit ratio": (2.0, 5.0),
           "cumulative hit ratio": (2.0, 5.0), "TTFT p50": (10.0, 20.0), "TTFT p95": (10.0, 20.0),
           "L2 read latency p50": (10.0, 20.0), "L2 read latency p95": (10.0, 20.0)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--wall", type=float, default=60.0, help="wall seconds of the run")
    ap.add_argument("--time-scale", type=float, default=30.0, help="cluster seconds per wall second")
    ap.add_argument("--seed", type=int, default=11)
    ap.add_argument("--pods", type=int, default=4)
    args = ap.parse_args()
    logging.getLogger("apscheduler").setLevel(logging.ERROR)
    s = AccuracySettings(seed=args.seed, pods=args.pods, wall_s=args.wall, time_scale=args.time_scale)
    res = run_accuracy(s)
    print(f"{res.served} requests in {res.wall_s:.1f} s wall ({s.time_scale:g}x), {len(res.disturbances)} "
          f"disturbances, {len(res.samples)} error samples; the cluster's clock waited {res.held_back_s:.1f} s "
          "for the probe")
    print("\n".join(res.lines()))
    kw = {"window_s": s.window_s, "margin_s": s.margin_s}
    rows = {r.signal: r for r in summarise(res.samples, res.disturbances, **kw)}
    floors = {r.signal.removesuffix(FLOOR): r for r in summarise(res.samples, res.disturbances,
                                                                  signals=floor_signals(), **kw)}
    print("\nTargets (measured error / target; <= 1.00 meets it):")
    for name, (t_med, t_p95) in TARGETS.items():
        r = rows[name]
        cells = []
        for label, (med, p95, n) in (("steady", r.steady), ("restarts", r.restarts)):
            if n == 0 or not math.isfinite(med):
                cells.append(f"{label}: no samples")
                continue
            cells.append(f"{label}: median {med / t_med:.2f}, p95 {p95 / t_p95:.2f}")
        floor = floors.get(name)
        note = ""
        if floor is not None and floor.steady[2] and floor.steady[1] > t_p95:
            note = f"  (bucket-limited: floor p95 {floor.steady[1]:.1f}% > target)"
        print(f"  {name}: " + "; ".join(cells) + note)


if __name__ == "__main__":
    main()
