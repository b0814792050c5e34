"""The planner's twin search against an exhaustive sweep of the same space on the same window.

At a moment of a scenario's run (default: 900 cluster-seconds in), the planner's twin search
(`tuners.planning.warmstart.TwinWarmStart`, TPE, over the restart-requiring knobs the deployment has:
`agent.runtime.tuning.build.restart_space`) and a sweep of every grid point of that space score
candidates with the same evaluator on the same window (the recent 150 s, warmed by the history
before it) under the same objective. Printed per scenario and seed: the sweep's best, the search's
pick for 8 / 16 / 24 / 32 trials, and the pick's objective as a ratio to the sweep's best (target:
the pick at the planner's number of trials, `tuner.warm_start.trials`, within 2%, <= 1.02x). The CPU buffer dimension is stepped at `--cpu-step` GiB for both, so the
sweep stays small.

    TIERPILOT_SHARED=../shared .venv/bin/python bench/twin_search.py [--scenarios cpu_hot_nol2,l2_evict] [--seeds 2]
"""
from __future__ import annotations

import argparse
import dataclasses
import logging
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from agent.runtime.tuning.build import restart_space
from agent.settings import AgentSettings
from emulator.demo.scenarios import SCENARIOS, scenario
from tuners.evaluators import TwinEvaluator, WarmReplay
from tuners.planning.warmstart import TwinWarmStart
from tuners.space import SearchSpace

PLANNER_TRIALS = AgentSettings().tuner.warm_start.trials  # what the planner's twin search runs


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--scenarios", default="cpu_hot_nol2,l2_evict")
    ap.add_argument("--seeds", type=int, default=2)
    ap.add_argument("--first-seed", type=int, default=7)
    ap.add_argument("--at", type=float, default=900.0, help="cluster seconds into the run")
    ap.add_argument("--cpu-step", type=float, default=4.0)
    ap.add_argument("--trials", default=f"8,16,{PLANNER_TRIALS},32")
    args = ap.parse_args()
    logging.disable(logging.WARNING)
    import optuna

    optuna.logging.set_verbosity(optuna.logging.ERROR)
    worst = 0.0
    for name in [s for s in args.scenarios.split(",") if s]:
        if name not in SCENARIOS:
            ap.error(f"--scenarios: unknown {name!r}; valid: {', '.join(SCENARIOS)}")
        for seed in range(args.first_seed, args.first_seed + args.seeds):
            sc = scenario(name, seed)
            dep = sc.deployment
            limits = dataclasses.replace(dep.limits, cpu_gib_step=args.cpu_step)
            space = restart_space(SearchSpace.from_limits(limits))
            space = dataclasses.replace(space, fixed=dep.start)
            now = args.at
            p = dep.settings.tuner.planner
            window = sc.workload.recent(now, p.recent_s + p.warm_s)
            ev = TwinEvaluator(window, sc.cluster, limits, replay_fn=WarmReplay(now - p.recent_s))
            obj = dep.objective
            t0 = time.perf_counter()
            values = {k: obj.values(ev.evaluate(k))[0] for k in space.iter_grid()}
            best = min(values, key=values.get)
            sweep_s = time.perf_counter() - t0
            dims = ", ".join(f"{d.name} ({len(d.grid())})" for d in space.dimensions)
            print(f"\n### {name}, seed {seed}, at {now:g} s: {len(values)} grid points over {dims} "
                  f"({sweep_s:.0f} s); best {space.to_params(best)} objective {values[best] * 1000:.0f} ms")
            for n in sorted({int(x) for x in args.trials.split(",")} | {PLANNER_TRIALS}):
                ws = TwinWarmStart(lambda ev=ev: ev, space, obj, trials=n, seed=seed)
                pick = ws.candidates(1)[0]
                v = values.get(pick, obj.values(ev.evaluate(pick))[0])
                ratio = v / values[best]
                if n == PLANNER_TRIALS:
                    worst = max(worst, ratio)
                print(f"- {n} trials: pick {space.to_params(pick)}, objective {v * 1000:.0f} ms = {ratio:.3f}x the "
                      f"sweep's best")
    print(f"\n## Target: the planner's {PLANNER_TRIALS}-trial pick within 2% of the sweep's best: worst {worst:.3f}x "
          f"({'met' if worst <= 1.02 else 'missed'})")


if __name__ == "__main__":
    main()
