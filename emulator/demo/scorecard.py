"""The demo's headline verdict: did tuning pay for itself over the whole run?

Tuned = the TTFT of every request as the emulated fleet served it (the twin's truth, restarts,
cold caches and all). Held = the same requests replayed on the twin with the defaults held for
the whole run. Ceiling = per phase, the best static configuration over everything the tuner may
choose (emulator.demo.ceiling: every router, chunk size and L2 eviction the demo's deployment
offers, the CPU buffer up to its headroom), under the tuner's own objective, memory price
included; the same search with memory priced at 0 is stated too. `tuners.payoff` does the
arithmetic; what the tuner did per phase (rolling restarts, applies, rollbacks, true / false drift
alarms) comes from the run's events. `plan_lines` renders every move the planner priced.
"""
from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from contracts.knobs import DEFAULT_KNOBS, Knobs
from emulator.cluster.timeline import DemoEvent, Disturbance, Served
from emulator.demo.ceiling import ceiling
from emulator.demo.deployment import demo_deployment
from emulator.demo.sim_run import DETECT_WITHIN_S, classify_alarms, held_ttfts
from emulator.demo.workload import DemoWorkload
from simulator.cluster import ClusterSpec
from tuners.payoff import ActionCounts, PhaseScore, change_text, score_phases


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


def _best(best: dict[int, Knobs]) -> str:
    return "; ".join(f"phase {p + 1}: " + (", ".join(f"{k}={b}" for k, (_a, b) in DEFAULT_KNOBS.diff(kn).items())
                                           or "defaults") for p, kn in sorted(best.items()))


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
    dep = demo_deployment(cluster.pods)
    priced, free = ceiling(part, cluster, dep.space(), [DEFAULT_KNOBS, *end_knobs],
                           memory_ms_per_gib=dep.objective.memory_ms_per_gib)
    scores = score_phases(workload.labels, held, tuned_arrays, priced.ttft, actions)
    method = (f"tuned = the {n} requests as the emulated fleet served them (restarts, cold caches and all); held = "
              "the same requests replayed on the twin with the defaults (chunk 256, CPU 5 GiB, LRU, round-robin) "
              "for the whole run; hindsight = per phase the best static configuration under the tuner's objective "
              f"(TTFT p95 + {dep.objective.memory_ms_per_gib:g} ms per GiB of host memory across the fleet), by a "
              f"{priced.label}, up to the {dep.limits.node_memory_headroom_gib:g} GiB headroom, each replayed over "
              f"the whole stream ({priced.replays} configurations; {_best(priced.best)}); with memory priced at 0: "
              f"{_best(free.best)}. Captured gain = (held - tuned) / (held - hindsight); n/a where hindsight does "
              f"not beat held. A drift alarm is true when it is the first within {DETECT_WITHIN_S:g} s of the real "
              "shift.")
    return scores, method


def _num(x: object, fmt: str) -> str:
    return "n/a" if x is None else format(x, fmt)


PLAN_NOTE = ("Saved per hour and transition cost are TTFT seconds summed over the requests; payback = transition "
             "cost / saved per hour; a move is applied when its net change over the horizon clears the margin.")


def _per_hour(saved_s: float | None) -> str:
    """TTFT seconds a move saves per hour once settled, signed in words."""
    if saved_s is None:
        return "TTFT per hour n/a"
    return f"{'saves' if saved_s >= 0 else 'loses'} {abs(saved_s):,.0f} s of TTFT per hour"


def plan_lines(plans: Sequence[dict]) -> list[str]:
    """Every plan the planner made (markdown list): when, the horizon and how it was estimated, and
    per priced candidate the predicted change over the horizon (`5.0% faster`), the TTFT seconds
    saved per hour once settled (summed over requests; negative: lost), the transition cost, the
    payback time and the verdict with its reason."""
    out = []
    for plan in plans:
        h = plan["horizon"]
        at = plan.get("at")
        on = f"; planned on the {plan['workload']} workload" if plan.get("workload") else ""
        out.append(f"- plan at {_num(at, ',.0f')} s: horizon {h['horizon_s']:,.0f} s ({h.get('basis', 'configured')}){on}")
        if plan.get("restarts_deferred"):
            out.append(f"  - restarts not priced: {plan['restarts_deferred']}")
        for d in plan["priced"]:
            knobs = ", ".join(f"{k} {b}" for k, (_a, b) in d["knobs"].items())
            g95 = "n/a" if d["gain_p95"] is None else change_text(d["gain_p95"])
            gm = "n/a" if d["gain_mean"] is None else change_text(d["gain_mean"])
            pay = "never" if d["payback_s"] is None else f"{d['payback_s']:,.0f} s"
            out.append(f"  - {knobs} ({'restart' if d['restart'] else 'hot reload'}): p95 {g95}, mean {gm} over "
                       f"the horizon; once settled {_per_hour(d['gain_per_hour_s'])}, "
                       f"transition cost {_num(d['transition_cost_s'], ',.0f')} s, payback {pay}: **{d['verdict']}**"
                       + (f" ({d['reason']})" if d["reason"] else ""))
    return out


__all__ = ["PLAN_NOTE", "action_counts", "demo_scorecard", "plan_lines"]
