"""The demo's headline verdict: did tuning pay for itself over the whole run?

Tuned = the TTFT of every request as the emulated fleet served it (the twin's truth, restarts,
cold caches and all). Held = the same requests replayed on the twin with the defaults held for
the whole run. Hindsight = per phase, the best of a few static configurations (every router with
the default LMCache settings, and the configurations tierpilot ended each phase with), each
replayed over the whole stream. `tuners.payoff` does the arithmetic; what the tuner did per phase
(rolling restarts, applies, rollbacks, true / false drift alarms) comes from the run's events.
"""
from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from contracts.knobs import DEFAULT_KNOBS, Knobs
from emulator.cluster.timeline import DemoEvent, Disturbance, Served
from emulator.demo.sim_run import DETECT_WITHIN_S, classify_alarms, held_ttfts, hindsight
from emulator.demo.workload import DemoWorkload
from simulator.cluster import ClusterSpec
from tuners.payoff import ActionCounts, PhaseScore, score_phases

HINDSIGHT_ROUTERS = ("roundrobin", "session", "prefixaware", "kvaware")


def _phase_of(starts: Sequence[float], t: float) -> int:
    return sum(1 for p in starts[1:] if t >= p)


def action_counts(starts: Sequence[float], events: Sequence[DemoEvent], disturbances: Sequence[Disturbance],
                  pods: int) -> dict[int, ActionCounts]:
    """Per phase: rolling restarts (pod restarts / pods, rounded up), applies (every configuration
    change: trial applies and rollbacks), rollbacks, and drift alarms (true: the first within
    `DETECT_WITHIN_S` of a real shift)."""
    out: dict[int, ActionCounts] = {}

    def add(t: float, **kw: int) -> None:
        p = _phase_of(starts, t)
        out[p] = out.get(p, ActionCounts()) + ActionCounts(**kw)

    restarts: dict[int, int] = {}
    for d in disturbances:
        if d.kind == "restart":
            p = _phase_of(starts, d.trace_s)
            restarts[p] = restarts.get(p, 0) + 1
        elif d.kind == "config":
            add(d.trace_s, applies=1)
    for p, n in restarts.items():
        out[p] = out.get(p, ActionCounts()) + ActionCounts(restarts=math.ceil(n / max(pods, 1)))
    for e in events:
        if e.kind == "rollback":
            add(e.trace_s, rollbacks=1)
    classify_alarms(starts, [e.trace_s for e in events if e.kind == "drift"], out)
    return out


def demo_scorecard(workload: DemoWorkload, cluster: ClusterSpec, served: Sequence[Served],
                   end_knobs: Sequence[Knobs], actions: dict[int, ActionCounts]) -> tuple[list[PhaseScore], str]:
    """The scorecard over the requests served so far, and a one-line method note."""
    if not served:
        return [], "no requests were served"
    n = len(served)
    part = DemoWorkload(workload.frame.head(n), workload.phase_starts_s, workload.labels, workload.span_s)
    tuned: dict[int, list[float]] = {}
    for r in served:
        tuned.setdefault(r.phase, []).append(r.ttft_s)
    held = held_ttfts(part, cluster)
    tuned_arrays = {p: np.asarray(v) for p, v in tuned.items()}
    grid = [DEFAULT_KNOBS.replace(router=r) for r in HINDSIGHT_ROUTERS]
    hind = hindsight(part, cluster, grid, extra=end_knobs)
    scores = score_phases(workload.labels, held, tuned_arrays, hind.ttft, actions)
    best = "; ".join(f"phase {p + 1}: " + (", ".join(f"{k}={b}" for k, (_a, b) in DEFAULT_KNOBS.diff(kn).items())
                                           or "defaults") for p, kn in sorted(hind.best.items()))
    method = (f"tuned = the {n} requests as the emulated fleet served them (restarts, cold caches and all); held = "
              "the same requests replayed on the twin with the defaults (chunk 256, CPU 5 GiB, LRU, round-robin) "
              "for the whole run; hindsight = per phase the best (TTFT p95) of "
              f"{len({DEFAULT_KNOBS, *grid, *end_knobs})} static configurations (every router, and the "
              f"configuration in force at the end of each phase), each replayed over the whole stream ({best}). "
              "Captured gain = (held - tuned) / (held - hindsight); n/a where hindsight does not beat held. "
              f"A drift alarm is true when it is the first within {DETECT_WITHIN_S:g} s of the real shift.")
    return scores, method


__all__ = ["action_counts", "demo_scorecard"]
