"""bench/live_tuning.py's summary: the targets of the production tuner, one PASS/FAIL line each,
and one row per workload (what the docs' table quotes), per planning workload source."""
from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence

import numpy as np

from tuners.payoff import WHOLE_RUN

ROOM = 1.10  # the ceiling must beat held by this much on a statistic for its captured gain to count
NO_PAYING_MOVE = ("short",)  # the per-phase ceiling is out of reach: a restart there must be declined
WHOLE_MIN = 1.00  # whole run tuned/held, p95 and mean, every workload and seed
PHASE_MIN = 0.98  # every phase, p95 and mean
GAIN_MEAN_MIN = 0.60  # captured gain over seeds, wherever the ceiling beats held by ROOM
GAIN_WORST_MIN = 0.30  # captured gain of the worst seed


@dataclasses.dataclass
class Outcome:
    """One (workload, seed, planning workload source): its printed run and the figures the summary
    needs."""

    name: str
    seed: int
    source: str
    text: str
    scores: list
    restarts: int
    false_alarms_held: int


def _whole(o: Outcome):
    return next(s for s in o.scores if s.label == WHOLE_RUN)


def _phases(o: Outcome) -> list:
    return [s for s in o.scores if s.label != WHOLE_RUN]


def gains(outcomes: Sequence[Outcome]) -> dict[str, list[float]]:
    """(workload / phase (statistic)) -> captured gain per seed where the ceiling beats held by
    ROOM on that statistic (a one-phase run's whole run is that phase: counted once)."""
    out: dict[str, list[float]] = {}
    for o in outcomes:
        rows = o.scores if len(o.scores) > 2 else _phases(o)
        for s in rows:
            if s.hindsight_speedup_p95 >= ROOM:
                out.setdefault(f"{o.name} / {s.label} (p95)", []).append(s.gain_p95)
            if s.hindsight_speedup_mean >= ROOM:
                out.setdefault(f"{o.name} / {s.label} (mean)", []).append(s.gain_mean)
    return out


def _fmt_gain(g: dict[str, list[float]]) -> str:
    if not g:
        return "-"
    return (f"{min(np.nanmean(v) for v in g.values()) * 100:.0f}% / "
            f"{min(np.nanmin(v) for v in g.values()) * 100:.0f}%")


def workload_row(name: str, outs: Sequence[Outcome]) -> str:
    """| workload | seeds | tuned/held p95 mean (worst) | mean ... | worst phase | captured gain worst
    mean / worst seed | seeds with a restart (restarts) | rollbacks |"""
    p95 = [_whole(o).speedup_p95 for o in outs]
    mean = [_whole(o).speedup_mean for o in outs]
    phase = min(min(s.speedup_p95, s.speedup_mean) for o in outs for s in _phases(o))
    restarted = sum(1 for o in outs if o.restarts)
    rollbacks = sum(s.actions.rollbacks for o in outs for s in _phases(o))
    g = gains(outs)
    gain = _fmt_gain(g) if name not in NO_PAYING_MOVE else f"not a target ({_fmt_gain(g)})"
    return (f"| {name} | {len(outs)} | {np.mean(p95):.3f}x ({min(p95):.3f}x) | {np.mean(mean):.3f}x "
            f"({min(mean):.3f}x) | {phase:.3f}x | {gain} | {restarted}/{len(outs)} "
            f"({sum(o.restarts for o in outs)}) | {rollbacks} |")


def table(source: str, by_name: dict[str, list[Outcome]]) -> list[str]:
    """One markdown row per workload for one planning workload source."""
    out = [f"\n## Per workload, planning on the {source} workload",
           ("| workload | seeds | whole run p95 tuned/held: mean (worst seed) | mean TTFT tuned/held: mean (worst "
            "seed) | worst phase | captured gain: worst mean / worst seed | seeds with a restart (restarts) | "
            "rollbacks |"),
           "|---|---:|---:|---:|---:|---:|---:|---:|"]
    return out + [workload_row(name, outs) for name, outs in by_name.items()]


def _verdict(ok: bool) -> str:
    return "PASS" if ok else "FAIL"


def _worst(outs: Sequence[Outcome], stat: str) -> tuple[float, str]:
    best = (math.inf, "")
    for o in outs:
        v = getattr(_whole(o), f"speedup_{stat}")
        if v < best[0]:
            best = (v, f"{o.name} seed {o.seed}")
    return best


def target_lines(source: str, outs: Sequence[Outcome], restart_pays: Sequence[str]) -> list[str]:
    """One PASS/FAIL line per target of the production tuner over `outs` (one source)."""
    lines = [f"\n## Targets, planning on the {source} workload"]
    for stat in ("p95", "mean"):
        v, where = _worst(outs, stat)
        lines.append(f"{_verdict(v >= WHOLE_MIN)} whole run tuned/held {stat} >= {WHOLE_MIN:.2f}x on every "
                     f"workload and seed: worst {v:.3f}x ({where})")
    ph = min(((min(s.speedup_p95, s.speedup_mean), f"{o.name} seed {o.seed} {s.label}")
              for o in outs for s in _phases(o)), default=(math.inf, ""))
    lines.append(f"{_verdict(ph[0] >= PHASE_MIN)} no phase below {PHASE_MIN:.2f}x (p95 and mean): worst "
                 f"{ph[0]:.3f}x ({ph[1]})")
    g = gains([o for o in outs if o.name not in NO_PAYING_MOVE])
    means = {k: float(np.nanmean(v)) for k, v in g.items()}
    lows = {k: float(np.nanmin(v)) for k, v in g.items()}
    if g:
        km, kl = min(means, key=means.get), min(lows, key=lows.get)
        lines.append(f"{_verdict(means[km] >= GAIN_MEAN_MIN)} captured gain >= {GAIN_MEAN_MIN:.0%} on average "
                     f"wherever the ceiling beats held by >= {ROOM - 1:.0%}: worst {means[km]:.0%} ({km}; "
                     f"{sum(v >= GAIN_MEAN_MIN for v in means.values())}/{len(means)} pass)")
        lines.append(f"{_verdict(lows[kl] >= GAIN_WORST_MIN)} captured gain >= {GAIN_WORST_MIN:.0%} in the worst "
                     f"seed: worst {lows[kl]:.0%} ({kl}; {sum(v >= GAIN_WORST_MIN for v in lows.values())}/"
                     f"{len(lows)} pass)")
        lines += [f"  - {k}: {means[k]:.0%} / {lows[k]:.0%} ({len(g[k])} seeds)" for k in g]
    else:
        lines.append("n/a captured gain: the ceiling beats held by >= 10% nowhere")
    for name in (*restart_pays, *NO_PAYING_MOVE):
        r = [o.restarts for o in outs if o.name == name]
        if not r:
            continue
        if name in NO_PAYING_MOVE:
            lines.append(f"{_verdict(sum(r) == 0)} no restart on {name}: {sum(r)} restarts in {len(r)} seeds")
        else:
            hit = sum(1 for x in r if x)
            lines.append(f"{_verdict(hit == len(r))} a restart in every seed of {name}: {hit}/{len(r)} seeds")
    lines.append(f"- drift on held runs: {sum(o.false_alarms_held for o in outs)} false alarms")
    return lines


__all__ = ["NO_PAYING_MOVE", "ROOM", "Outcome", "gains", "table", "target_lines", "workload_row"]
