"""Benchmark: the cost of one plan's twin workload at the caps, whatever rate or prompt length a pod claims.

The planner replays a workload fitted to the fleet's signals (agent/runtime/workload_fit.py
`capped_workload`), capped by `tuner.warm_start.max_requests` (2,000) and `max_block_refs`
(100,000). Each case runs in a fresh child process (its peak RSS is its own) and times: fitting the
frame, and one twin replay of it with the default knobs on 4 pods (a plan replays a few such
candidates). Printed per case: rows and block references replayed, whether the cap note fired, the
seconds (fit + replay), the peak RSS, and the time and memory ratios to the honest case measured in
the same run.

Cases: honest (4 req/s, 1-4k-token prompts), at the request cap (2,000 requests in the window),
claimed 10^4, 10^6 and 10^9 req/s, and 10^9 req/s with 10^12-token prompts.
Target: every claimed case within the caps, and its time and memory within a small factor of the
at-cap case (the cap, not the claim, sets the cost).

Run: .venv/bin/python bench/plan_cap.py
"""
from __future__ import annotations

import json
import resource
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

MIX = [[1024.0, 2048.0, 0.5], [2048.0, 4096.0, 0.5]]
HUGE = [[1e12, float("inf"), 1.0]]
CASES = {  # name -> (claimed fleet req/s, prompt-length mix)
    "honest": (4.0, MIX),
    "at the request cap": (2000 / 300.0, MIX),
    "claimed 1e4 req/s": (1e4, MIX),
    "claimed 1e6 req/s": (1e6, MIX),
    "claimed 1e9 req/s": (1e9, MIX),
    "1e9 req/s, 1e12-token prompts": (1e9, HUGE),
}


def child(rate: float, mix: list[list[float]]) -> dict[str, object]:
    from agent.runtime.workload_fit import ObservedWorkload, capped_workload
    from agent.settings import load_settings
    from contracts.knobs import DEFAULT_KNOBS
    from simulator.cluster import ClusterSpec
    from tuners.evaluators import TwinEvaluator
    from tuners.space import DeploymentLimits

    ws = load_settings(env={}).tuner.warm_start
    observed = ObservedWorkload(rate, tuple(tuple(b) for b in mix), 0.5)
    start = time.perf_counter()
    frame, note = capped_workload(observed, duration_s=300.0, max_requests=ws.max_requests,
                                  max_block_refs=ws.max_block_refs, seed=0)
    fit_s = time.perf_counter() - start
    TwinEvaluator(frame, ClusterSpec(pods=4), DeploymentLimits()).evaluate(DEFAULT_KNOBS)
    return {"rows": frame.height, "refs": int(frame["hash_ids"].list.len().sum()), "capped": note is not None,
            "fit_s": fit_s, "total_s": time.perf_counter() - start,
            "rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
            "caps": [ws.max_requests, ws.max_block_refs]}


def main() -> None:
    if len(sys.argv) == 3 and sys.argv[1] == "--child":
        rate, mix = json.loads(sys.argv[2])
        print(json.dumps(child(rate, mix)))
        return
    results = {}
    for name, (rate, mix) in CASES.items():
        print(f"running {name} ...", file=sys.stderr, flush=True)
        out = subprocess.run([sys.executable, __file__, "--child", json.dumps([rate, mix])], check=True,
                             capture_output=True, text=True, timeout=600).stdout
        results[name] = json.loads(out.strip().splitlines()[-1])
    ref = results["honest"]
    caps = ref["caps"]
    print(f"caps: {caps[0]} requests, {caps[1]} block references (tuner.warm_start)")
    print(f"{'case':32} {'rows':>6} {'block refs':>10} {'capped':>6} {'fit s':>6} {'fit+replay s':>12} "
          f"{'x honest':>8} {'peak MiB':>8} {'x honest':>8}")
    for name, r in results.items():
        print(f"{name:32} {r['rows']:>6} {r['refs']:>10} {'yes' if r['capped'] else 'no':>6} {r['fit_s']:>6.2f} "
              f"{r['total_s']:>12.2f} {r['total_s'] / ref['total_s']:>8.2f} {r['rss_mib']:>8.0f} "
              f"{r['rss_mib'] / ref['rss_mib']:>8.2f}")
    within = all(r["rows"] <= caps[0] and r["refs"] <= caps[1] for r in results.values())
    print(f"every case within the caps: {'yes' if within else 'NO'}")


if __name__ == "__main__":
    main()
