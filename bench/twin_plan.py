"""Benchmark: one plan's twin search (24 trials) on an hour of a 16-pod fleet, against a plain LRU.

The planner fits a workload to what the fleet reported over the window
(`agent.runtime.workload_fit.capped_workload`, within `tuner.warm_start`'s caps) and searches the
restart-requiring knobs with `tuner.warm_start.trials` (24) twin trials (`TwinWarmStart`, TPE). Here: an hour
(3,600 s) of a 16-pod fleet at 4 requests/s per pod, prompts of 1-4k tokens, 16 pods in the twin.
Reference (same process, same frame): a single-tier OrderedDict LRU over the frame's block hashes,
run once per trial. Times are CPU seconds (process_time), median of `--repeats`, because the
machine is shared. Printed: the plan's CPU seconds against the 30 s target, and its ratio to the
reference. Then the same hour without the caps (every request of the hour): the same plan (24
trials) is timed once against 24 runs of its LRU reference. The trials of a plan share the stream's
chunk hashes (one computation per chunk size, `simulator.streams.StreamCache`).

Run: .venv/bin/python bench/twin_plan.py [--repeats 3]
"""
from __future__ import annotations

import argparse
import logging
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent / "helpers"))

from reference_lru import reference_lru

from agent.runtime.tuning.build import restart_space
from agent.runtime.workload_fit import ObservedWorkload, capped_workload
from agent.settings import load_settings
from simulator.cluster import ClusterSpec
from tuners.evaluators import TwinEvaluator
from tuners.planning.warmstart import TwinWarmStart
from tuners.space import DeploymentLimits, SearchSpace

PODS = 16
RATE_PER_POD = 4.0
SPAN_S = 3600.0
MIX = ((1024.0, 2048.0, 0.5), (2048.0, 4096.0, 0.5))
TARGET_S = 30.0
WARM_START_TRIALS = load_settings(env={}).tuner.warm_start.trials  # the planner's default



def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0], formatter_class=argparse.RawDescriptionHelpFormatter,
                                 epilog="examples:\n  .venv/bin/python bench/twin_plan.py\n"
                                        "  .venv/bin/python bench/twin_plan.py --repeats 5")
    ap.add_argument("--repeats", type=int, default=3, help="plans timed (the median is printed; default 3)")
    args = ap.parse_args()
    logging.disable(logging.WARNING)
    import optuna

    optuna.logging.set_verbosity(optuna.logging.ERROR)
    ws = load_settings(env={}).tuner.warm_start
    observed = ObservedWorkload(PODS * RATE_PER_POD, MIX, 0.5)
    frame, note = capped_workload(observed, duration_s=SPAN_S, max_requests=ws.max_requests,
                                  max_block_refs=ws.max_block_refs, seed=0)
    blocks = frame["hash_ids"].to_list()
    refs = sum(len(b) for b in blocks)
    print(f"window: {SPAN_S:.0f} s of {PODS} pods at {RATE_PER_POD:g} req/s each -> {frame.height:,} requests, "
          f"{refs:,} block references ({note or 'within the caps'})")
    cluster = ClusterSpec(pods=PODS)
    limits = DeploymentLimits()
    space = restart_space(SearchSpace.from_limits(limits))
    plans, lrus = [], []
    for i in range(args.repeats):
        print(f"repeat {i + 1}/{args.repeats} ...", file=sys.stderr, flush=True)
        c0 = time.process_time()
        search = TwinWarmStart(lambda: TwinEvaluator(frame, cluster, limits), space, trials=WARM_START_TRIALS, seed=i)
        search.candidates(1)
        plans.append(time.process_time() - c0)
        c0 = time.process_time()
        for _ in range(WARM_START_TRIALS):
            reference_lru(blocks, refs // 4)
        lrus.append(time.process_time() - c0)
    plan, lru = statistics.median(plans), statistics.median(lrus)
    print(f"plan ({WARM_START_TRIALS} twin trials): {plan:.2f} s CPU, median of {args.repeats} "
          f"({', '.join(f'{p:.2f}' for p in plans)})")
    print(f"reference LRU x {WARM_START_TRIALS}: {lru:.3f} s CPU")
    print(f"SUMMARY plan_cpu_s={plan:.2f} target_s={TARGET_S:.0f} {'PASS' if plan <= TARGET_S else 'FAIL'} "
          f"ratio_to_lru={plan / lru:.1f}x")
    uncapped(observed, cluster, limits, space)


def uncapped(observed: ObservedWorkload, cluster: ClusterSpec, limits: DeploymentLimits, space: SearchSpace) -> None:
    """The same plan (24 trials, seed 0) over every request of the hour, timed once."""
    frame, _ = capped_workload(observed, duration_s=SPAN_S, max_requests=None, max_block_refs=None, seed=0)
    blocks = frame["hash_ids"].to_list()
    refs = sum(len(b) for b in blocks)
    print(f"uncapped hour: {frame.height:,} requests, {refs:,} block references ...", file=sys.stderr, flush=True)
    evaluators: list[TwinEvaluator] = []

    def factory() -> TwinEvaluator:
        evaluators.append(TwinEvaluator(frame, cluster, limits))
        return evaluators[-1]

    c0 = time.process_time()
    TwinWarmStart(factory, space, trials=WARM_START_TRIALS, seed=0).candidates(1)
    plan = time.process_time() - c0
    c0 = time.process_time()
    for _ in range(WARM_START_TRIALS):
        reference_lru(blocks, refs // 4)
    lru = time.process_time() - c0
    replays = sum(e.replays for e in evaluators)
    print(f"uncapped hour: {frame.height:,} requests, {refs:,} block references; plan ({WARM_START_TRIALS} trials, "
          f"{replays} replays) {plan:.1f} s CPU, reference LRU x {WARM_START_TRIALS} {lru:.1f} s ({plan / lru:.1f}x)")
    print(f"SUMMARY uncapped_plan_s={plan:.1f} target_s={TARGET_S:.0f} "
          f"{'PASS' if plan <= TARGET_S else 'FAIL'} ratio_to_lru={plan / lru:.1f}x")


if __name__ == "__main__":
    main()
