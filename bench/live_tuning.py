"""Live tuning on the twin, judged by the honest measure.

The agent's tuner (`agent.runtime.tuning.build_tuning` with the demo's settings file
`emulator/demo/tuner.yaml`: the real TuningController, Guardrails, drift detector, live
evaluator, transition planner and twin search) runs against the twin as a fleet on a
simulated clock (`emulator.cluster.twin_fleet`, `emulator.demo.sim_run`), so one run of tens of
cluster-minutes takes seconds. For each workload and seed it prints the scorecard of
`tuners.payoff`: per phase and for the whole run, TTFT p95 and mean of every request as served
(exploration and restarts included), tuned vs the start configuration held vs the ceiling, captured
gain, restarts, applies, rollbacks, drift alarms (true / false), then every plan the tuner priced
(horizon, predicted gain per hour, transition cost, payback, verdict).

The ceiling (`emulator.demo.ceiling`) is the best static configuration per phase over everything
the tuner may choose (every router, chunk size and L2 eviction the deployment offers, the CPU
buffer up to the headroom), under the tuner's own objective (memory price included) and again
with memory priced at 0; both are printed, the captured gain is against the first. `--quick`
uses a small grid instead (8 configurations, CPU buffer at 5 GiB), labelled as such.

Workloads: `demo`, `shift`, `mooncake` (emulator.demo.sim_run) and the restart scenarios of
emulator.demo.scenarios (`cpu_hot`, `cpu_hot_nol2`, `chunk`, `l2_evict`, `short`).

    TIERPILOT_SHARED=../shared .venv/bin/python bench/live_tuning.py [--seeds 5] [--workloads demo,cpu_hot] [--jobs 2]
        [--workload-source rebuilt|fitted|served, or several comma-separated: side by side on one held run and ceiling]

The end prints one row per workload and one PASS/FAIL line per target (bench/helpers/live_targets.py).
"""
from __future__ import annotations

import argparse
import dataclasses
import logging
import multiprocessing as mp
import pickle
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from helpers.live_targets import Outcome, table, target_lines  # bench/ is on the path from here

from emulator.demo.ceiling import ceiling
from emulator.demo.deployment import Deployment, demo_deployment
from emulator.demo.scenarios import RESTART_PAYS, SCENARIOS, Scenario, scenario
from emulator.demo.scorecard import plan_lines
from emulator.demo.sim_run import (
    WORKLOADS,
    held_alarms,
    held_ttfts,
    hindsight,
    hindsight_grid,
    run_live,
    score_run,
    workload,
)
from tuners.payoff import scorecard_lines, speedup

ALL = (*WORKLOADS, *SCENARIOS)
SOURCES = ("served", "rebuilt", "fitted")


def load(name: str, seed: int) -> Scenario:
    if name in SCENARIOS:
        return scenario(name, seed)
    wl, cluster = workload(name, seed)
    return Scenario(wl, cluster, demo_deployment(cluster.pods, seed))


def describe(k, start) -> str:
    return ", ".join(f"{n} {b}" for n, (_a, b) in start.diff(k).items()) or "the start"


def with_kv_events(dep: Deployment, on: bool) -> Deployment:
    """The deployment with the agent's KV-event subscriber on (the rebuilt planning workload) or
    off (the fitted fallback)."""
    kv = dep.settings.kv_events.model_copy(update={"enabled": on})
    return dataclasses.replace(dep, settings=dep.settings.model_copy(update={"kv_events": kv}))


def _ceilings(sc: Scenario, held, runs, quick: bool) -> list:
    """[(label, ceiling, best per phase)]: one ceiling for every run of this workload and seed
    (the coordinate search starts from the held configuration and every run's end-of-phase ones)."""
    wl, cluster, dep = sc.workload, sc.cluster, sc.deployment
    ends = [k for run in runs for k in run.end_knobs]
    if quick:
        q = hindsight(wl, cluster, hindsight_grid(cluster.pods, small=True), extra=ends, start=dep.start)
        return [("quick grid of 8 (CPU 5 GiB), TTFT p95", q, q.best)]
    priced, free = ceiling(wl, cluster, dep.space(), [dep.start, *ends],
                           memory_ms_per_gib=dep.objective.memory_ms_per_gib)
    return [(f"memory at {dep.objective.memory_ms_per_gib:g} ms/GiB", priced, priced.best),
            ("memory at 0", free, free.best)]


def _ceiling_lines(ceilings, held, start) -> list[str]:
    out = []
    for label, c, best in ceilings:
        extra = f"; {c.label}, {c.replays} replays" if hasattr(c, "label") else ""
        out.append(f"ceiling ({label}{extra}): " + "; ".join(
            f"phase {p + 1}: {describe(k, start)} (p95 {speedup(float(np.quantile(held[p], .95)), float(np.quantile(c.ttft[p], .95))):.2f}x, "
            f"mean {speedup(float(held[p].mean()), float(c.ttft[p].mean())):.2f}x vs held)"
            for p, k in sorted(best.items())))
    return out


def run_one(name: str, seed: int, quick: bool, plans: bool, sources: tuple[str, ...] = ("rebuilt",)) -> list[Outcome]:
    """One workload and seed: the held run and the ceiling once, the tuned run per planning
    workload source (the same request stream, the same ceiling: side by side)."""
    logging.disable(logging.WARNING)
    t0 = time.perf_counter()
    sc = load(name, seed)
    wl, cluster, dep = sc.workload, sc.cluster, sc.deployment
    held = held_ttfts(wl, cluster, dep.start)
    runs, took = [], []
    for source in sources:
        t1 = time.perf_counter()
        runs.append(run_live(wl, cluster, seed, deployment=with_kv_events(dep, source != "fitted"),
                             planning="served" if source == "served" else "agent"))
        took.append(time.perf_counter() - t1)
    t1 = time.perf_counter()
    ceilings = _ceilings(sc, held, runs, quick)
    t_ceiling = time.perf_counter() - t1
    outs = []
    for source, run, t_run in zip(sources, runs, took):
        _h_alarms, h_counts, _h_delays = held_alarms(wl, run, dep)
        scores = score_run(wl, held, run, ceilings[0][1])
        head = (f"\n### {name}, seed {seed}, planning on the {source} workload: {wl.frame.height} requests, "
                f"{cluster.pods} pods, start {dep.start.router}/chunk {dep.start.chunk_tokens}/cpu {dep.start.cpu_gib:g} GiB "
                f"(tuned run {t_run:.0f} s; held and ceiling {t_ceiling:.0f} s, shared; all {time.perf_counter() - t0:.0f} s)")
        out = [head, *scorecard_lines(scores), *_ceiling_lines(ceilings, held, dep.start)]
        applied = [t for t, st, _m in run.states if st == "trial_started"]
        out.append(f"tuned: ended phases on {[describe(k, dep.start) for k in run.end_knobs]}; "
                   f"{len(run.plans)} plans (on the {'/'.join(run.workloads) or 'no'} workload), trials started at "
                   f"{[round(t) for t in applied]} s, restart-requiring changes applied at "
                   f"{[round(t) for t in run.restarts_applied]} s")
        if plans:
            out += plan_lines(run.plans)
        outs.append(Outcome(name, seed, source, "\n".join(out), scores, len(run.restarts_applied),
                            sum(a.false_alarms for a in h_counts.values())))
    return outs


def _job(args: tuple[str, int, bool, bool, tuple[str, ...], str]) -> list[Outcome]:
    """One workload and seed; with a results directory, its outcomes are kept there (a rerun with
    the same directory reads them back instead of running again)."""
    name, seed, quick, plans, sources, keep = args
    path = Path(keep) / f"{name}-{seed}-{'-'.join(sources)}{'-quick' if quick else ''}.pkl" if keep else None
    if path is not None and path.exists():
        return pickle.loads(path.read_bytes())
    outs = run_one(name, seed, quick, plans, sources)
    if path is not None:
        path.write_bytes(pickle.dumps(outs))
    return outs


def _sources(ap: argparse.ArgumentParser, text: str) -> tuple[str, ...]:
    got = tuple(s for s in text.split(",") if s)
    bad = [s for s in got if s not in SOURCES]
    if bad or not got:
        ap.error(f"--workload-source: unknown {bad[0] if bad else text!r}; valid: {', '.join(SOURCES)} "
                 "(comma-separated for side by side)")
    return got


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter,
                                 epilog="examples:\n  bench/live_tuning.py --seeds 1 --workloads chunk --quick\n"
                                        "  bench/live_tuning.py --seeds 5 --workload-source rebuilt,fitted --jobs 2")
    ap.add_argument("--seeds", type=int, default=5)
    ap.add_argument("--first-seed", type=int, default=7)
    ap.add_argument("--workloads", default=",".join(ALL))
    ap.add_argument("--quick", action="store_true", help="quick mode: the ceiling from 8 static configurations")
    ap.add_argument("--plans", action="store_true", help="print every priced candidate of every plan")
    ap.add_argument("--jobs", type=int, default=1, help="runs in parallel processes (each is one core) [1]")
    ap.add_argument("--results", metavar="DIR", default="",
                    help="keep each workload and seed's outcome in DIR and reuse the ones already there (a long "
                         "measurement resumes; use a fresh DIR for each commit measured)")
    ap.add_argument("--workload-source", default="rebuilt",
                    help="what the planner replays, comma-separated to run several side by side on the same "
                         "held run and ceiling: the block stream the agent rebuilt from the KV events [rebuilt], "
                         "the fallback fitted to the scraped counters (fitted), or (a comparison only) the "
                         "stream the fleet served (served)")
    args = ap.parse_args()
    logging.disable(logging.WARNING)
    sources = _sources(ap, args.workload_source)
    names = [w for w in args.workloads.split(",") if w]
    for w in names:
        if w not in ALL:
            ap.error(f"--workloads: unknown {w!r}; valid: {', '.join(ALL)}")
    if args.jobs < 1:
        ap.error("--jobs: must be >= 1")
    seeds = range(args.first_seed, args.first_seed + args.seeds)
    t_all = time.perf_counter()
    if args.results:
        Path(args.results).mkdir(parents=True, exist_ok=True)
    # seed-major: every workload's first seed comes before any workload's second
    jobs = [(name, seed, args.quick, args.plans, sources, args.results) for seed in seeds for name in names]
    if args.jobs > 1:
        pool = mp.get_context("spawn").Pool(args.jobs)
        results = pool.imap(_job, jobs)
    else:
        pool, results = None, map(_job, jobs)
    done: list[Outcome] = []
    for outs in results:
        for o in outs:
            print(o.text, flush=True)
        done += outs
    if pool is not None:
        pool.close()
        pool.join()
    apply = demo_deployment(4).settings.tuner.apply
    print(f"\ntuner.apply: {apply} (emulator/demo/tuner.yaml: restart-requiring changes allowed, the restart "
          "scenarios are measured)")
    print(f"{len(jobs)} workload-seeds in {time.perf_counter() - t_all:.0f} s; ceiling: "
          f"{'quick grid, labelled' if args.quick else 'full space under the objective'}; seeds "
          f"{seeds.start}-{seeds.stop - 1}")
    for source in sources:
        mine = [o for o in done if o.source == source]
        by_name = {n: sorted((o for o in mine if o.name == n), key=lambda o: o.seed) for n in names}
        print("\n".join(table(source, by_name)))
        print("\n".join(target_lines(source, mine, RESTART_PAYS)))

if __name__ == "__main__":
    main()
