"""The demo's tuner on a simulated clock: one run of minutes of cluster time takes seconds.

`run_live(workload, cluster, seed)` drives the real `TuningController` (guardrails, drift
detector, live evaluator, twin warm start: `emulator.demo.tuning_setup`, the demo's own wiring)
against `emulator.cluster.twin_fleet.TwinFleet`, ticking every `CONTROL_TICK_S` cluster seconds
as the demo does. `held_ttfts` replays the same requests with the defaults held; `hindsight`
replays them with each configuration of a static grid and keeps, per phase, the best one (the
ceiling). `score_run` turns the three into the `tuners.payoff` scorecard.

Workloads (`workload(name, seed)`): `demo` (the demo's two phases at its default length), `shift`
(the synthetic preset, 30 minutes) and `mooncake` (the demo's RAG phase, then a thinned Mooncake
conversation trace; the seed picks which conversations are kept).
"""
from __future__ import annotations

import dataclasses
import math
import os
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import polars as pl

from contracts.knobs import DEFAULT_KNOBS, Knobs
from emulator.cluster.twin_fleet import DEFAULT_RESTART_DOWNTIME_S, TwinFleet
from emulator.demo.tuning_setup import (
    CONTROL_START_S,
    DRIFT,
    DRIFT_SIGNALS,
    DRIFT_SIGNALS_WINDOW_S,
    Deployment,
    build_tuning,
    demo_deployment,
)
from emulator.demo.workload import TRACE_HASH_OFFSET, DemoWorkload, build_workload
from simulator.cluster import ClusterSpec
from simulator.records import WORKLOAD_SCHEMA, iter_requests
from simulator.replay import replay
from simulator.synthetic import generate, preset_phases
from simulator.workload import load_trace
from tuners.drift import DriftDetector
from tuners.metrics import TunerMetrics
from tuners.payoff import ActionCounts, PhaseScore, score_phases

CONTROL_TICK_S = 10.0  # the demo steps the controller every 0.5 wall s at 20x
DEMO_SPAN_S = 180.0 * 20.0 * 0.95  # `make demo`: 180 s wall at 20x, 95% of it workload
WORKLOADS = ("demo", "shift", "mooncake")  # the scenarios of emulator.demo.scenarios come on top
DETECT_WITHIN_S = 2 * DRIFT_SIGNALS_WINDOW_S  # an alarm this soon after a real shift detected it


def shared_dir() -> Path:
    env = os.environ.get("TIERPILOT_SHARED")
    return Path(env) if env else Path(__file__).resolve().parents[2].parent / "shared"


def thin_conversations(frame: pl.DataFrame, keep_one_in: int, pick: int) -> pl.DataFrame:
    """Every conversation whose key falls in residue `pick` of `keep_one_in`. Mooncake has no
    session ids: a request's second prefix block (its first if it has one) identifies its
    conversation or document, so its turns are kept or dropped together."""
    ids = pl.col("hash_ids")
    key = ids.list.get(1, null_on_oob=True).fill_null(ids.list.get(0))
    return frame.filter((key * 2654435761) % (1 << 32) % keep_one_in == pick % keep_one_in)


def workload(name: str, seed: int) -> tuple[DemoWorkload, ClusterSpec]:
    """A named benchmark workload and the fleet it runs on (sized to stay below saturation)."""
    if name == "demo":
        return build_workload(DEMO_SPAN_S, seed), ClusterSpec(pods=4)
    if name == "shift":
        frame = generate(preset_phases("shift", duration_s=1800.0), seed=seed)
        return DemoWorkload(frame, (0.0, 900.0), ("phase 1: rag", "phase 2: sessions"), 1800.0), ClusterSpec(pods=4)
    if name == "mooncake":
        p1_s, p2_s = 1200.0, 1800.0
        rag, _ = preset_phases("shift", rate_rps=4.0)
        first = generate((dataclasses.replace(rag, duration_s=p1_s),), seed=seed)
        tr = load_trace(shared_dir() / "traces" / "mooncake_fast25_conversation_trace.jsonl")
        tr = thin_conversations(tr, 3, seed).filter(pl.col("timestamp_ms") < int(p2_s * 1000)).with_columns(
            (pl.col("timestamp_ms") + int(p1_s * 1000)).alias("timestamp_ms"),
            pl.col("hash_ids").list.eval(pl.element() + TRACE_HASH_OFFSET).alias("hash_ids"),
            pl.lit(1, dtype=pl.Int32).alias("phase"))
        frame = pl.concat([first.select(list(WORKLOAD_SCHEMA)), tr.select(list(WORKLOAD_SCHEMA))])
        labels = ("phase 1: shared prompts + RAG", "phase 2: Mooncake conversations (1 in 3)")
        return DemoWorkload(frame, (0.0, p1_s), labels, p1_s + p2_s), ClusterSpec(pods=8)
    raise ValueError(f"workload: unknown {name!r}; valid: {', '.join(WORKLOADS)}")


@dataclasses.dataclass(frozen=True)
class LiveRun:
    """What one simulated run served and did."""

    ttft: dict[int, np.ndarray]  # phase -> TTFT (s) of its requests as served
    actions: dict[int, ActionCounts]
    alarms: tuple[float, ...]  # drift alarm times (cluster s)
    detection_delays_s: tuple[float, ...]  # per real shift: delay of its first alarm (inf: missed)
    end_knobs: tuple[Knobs, ...]  # configuration in force at the end of each phase
    states: tuple[tuple[float, str, str], ...]  # (time, controller state, message) of every non-quiet step
    signals: tuple[tuple[float, dict[str, float]], ...]  # the drift signals of every tick
    prediction_errors: tuple[tuple[float, float], ...]  # (window end, twin p95 error ratio)
    latency_fits: tuple = ()  # (when, tuners.calibration.LatencyFit) of each calibration
    plans: tuple = ()  # every plan: time, horizon, each priced candidate and its verdict
    restarts_applied: tuple[float, ...] = ()  # when a restart-requiring change (pods or L2 master) was applied


def _phase_of(starts: Sequence[float], t: float) -> int:
    return sum(1 for p in starts[1:] if t >= p)


def run_live(wl: DemoWorkload, cluster: ClusterSpec, seed: int, *, dry_run: bool = False,
             restart_downtime_s: float = DEFAULT_RESTART_DOWNTIME_S, deployment: Deployment | None = None) -> LiveRun:
    """The demo's tuner against the twin fleet on a simulated clock (dry_run: the start held)."""
    deployment = deployment or demo_deployment(cluster.pods)
    fleet = TwinFleet(list(iter_requests(wl.frame)), cluster, deployment.start,
                      restart_downtime_s=restart_downtime_s, dry_run=dry_run)
    clock = [0.0]
    tuning = build_tuning(actuator=fleet, window_source=fleet, clock=lambda: clock[0], twin_cluster=cluster,
                          history=wl.recent, metrics=TunerMetrics(target="bench"), seed=seed, dry_run=dry_run,
                          restart_downtime_s=restart_downtime_s, latency_points=fleet.latency_points,
                          deployment=deployment)
    ctl = tuning.controller
    starts = wl.phase_starts_s
    end_knobs: list[Knobs] = []
    alarms: list[float] = []
    states: list[tuple[float, str, str]] = []
    signals: list[tuple[float, dict[str, float]]] = []
    t = CONTROL_START_S
    fleet.advance(t)
    last_t = wl.frame["timestamp_ms"].max() / 1000.0
    while t <= last_t + CONTROL_TICK_S:
        phase = _phase_of(starts, t)
        while len(end_knobs) < phase:
            end_knobs.append(fleet.current())
        clock[0] = t
        signals.append((t, fleet.signals(t, DRIFT_SIGNALS_WINDOW_S)))
        rep = ctl.step(t, signals[-1][1])
        if rep.state == "drift":
            alarms.append(t)
        if rep.state not in ("measuring", "holding", "blocked", "baseline", "retry", "planning"):
            states.append((t, rep.state, rep.message))
        t += CONTROL_TICK_S
        fleet.advance(t)
    fleet.advance(math.inf)
    while len(end_knobs) < len(starts):
        end_knobs.append(fleet.current())
    phases = sorted(set(fleet.phase.tolist()))
    ttft = {p: fleet.ttft[fleet.phase == p] for p in phases}
    actions = {p: ActionCounts() for p in phases}
    for a in fleet.actions:
        p = _phase_of(starts, a.at)
        actions[p] = actions[p] + ActionCounts(restarts=int(a.pods_restarted), applies=1,
                                               rollbacks=int(a.kind == "rollback"))
    delays = classify_alarms(starts, alarms, actions)
    plans = tuple(tuning.planner.history) if tuning.planner is not None else ()
    restarted = tuple(a.at for a in fleet.actions if a.kind == "apply" and set(a.changed) - {"router"})
    return LiveRun(ttft, actions, tuple(alarms), tuple(delays), tuple(end_knobs), tuple(states), tuple(signals),
                   tuple(ctl.prediction_errors), tuple(tuning.latency_fits), plans, restarted)


def classify_alarms(starts: Sequence[float], alarms: Sequence[float], actions: dict[int, ActionCounts]) -> list[float]:
    """Count each alarm into its phase's actions as true (the first within `DETECT_WITHIN_S` of a
    real shift) or false; returns each real shift's detection delay (inf: missed)."""
    delays, true_alarms = [], set()
    for s in starts[1:]:
        hit = next((a for a in alarms if s <= a <= s + DETECT_WITHIN_S), None)
        delays.append(math.inf if hit is None else hit - s)
        if hit is not None:
            true_alarms.add(hit)
    for a in alarms:
        p = _phase_of(starts, a)
        true = a in true_alarms
        actions[p] = actions.get(p, ActionCounts()) + ActionCounts(true_alarms=int(true), false_alarms=int(not true))
    return delays


def held_alarms(wl: DemoWorkload, run: LiveRun) -> tuple[list[float], dict[int, ActionCounts], list[float]]:
    """The drift detector over the held run: the same signals (they come from the request stream,
    not the configuration), the same detector settings, nothing applied. Returns the alarm times,
    per-phase true/false counts and each shift's detection delay."""
    det = DriftDetector(DRIFT, signals=DRIFT_SIGNALS)
    alarms = [t for t, sig in run.signals if sig and det.update(sig, t) is not None]
    counts: dict[int, ActionCounts] = {}
    delays = classify_alarms(wl.phase_starts_s, alarms, counts)
    return alarms, counts, delays


def phase_ttfts(frame: pl.DataFrame, cluster: ClusterSpec, knobs: Knobs) -> dict[int, np.ndarray]:
    """TTFT per phase of one static configuration over the whole stream."""
    req = replay(frame, cluster, knobs).requests
    return {int(p): req.filter(pl.col("phase") == p)["ttft_s"].to_numpy() for p in req["phase"].unique().to_list()}


def held_ttfts(wl: DemoWorkload, cluster: ClusterSpec, start: Knobs = DEFAULT_KNOBS) -> dict[int, np.ndarray]:
    return phase_ttfts(wl.frame, cluster, start)


def hindsight_grid(pods: int, *, small: bool = False) -> list[Knobs]:
    """Static configurations hindsight chooses from: every router x chunk size x CPU buffer."""
    routers = ("roundrobin", "session", "prefixaware", "kvaware")
    chunks = (256, 512) if small else (256, 512, 1024)
    cpus = (5.0,) if small else (0.0, 5.0, 16.0)
    return [DEFAULT_KNOBS.replace(router=r, chunk_tokens=c, cpu_gib=g) for r in routers for c in chunks for g in cpus]


@dataclasses.dataclass(frozen=True)
class Hindsight:
    ttft: dict[int, np.ndarray]
    best: dict[int, Knobs]


def hindsight(wl: DemoWorkload, cluster: ClusterSpec, grid: Sequence[Knobs], *,
              extra: Sequence[Knobs] = (), start: Knobs = DEFAULT_KNOBS) -> Hindsight:
    """Per phase, the static configuration with the lowest TTFT p95 on that phase (ties: mean),
    every candidate replayed over the whole stream (so its caches are warm, as they would be had it
    been in force all along)."""
    best: dict[int, tuple[tuple[float, float], Knobs, np.ndarray]] = {}
    for knobs in dict.fromkeys([start, *grid, *extra]):
        for p, x in phase_ttfts(wl.frame, cluster, knobs).items():
            key = (float(np.quantile(x, 0.95)), float(x.mean()))
            if p not in best or key < best[p][0]:
                best[p] = (key, knobs, x)
    return Hindsight({p: v[2] for p, v in best.items()}, {p: v[1] for p, v in best.items()})


def score_run(wl: DemoWorkload, held: dict[int, np.ndarray], run: LiveRun, hind: Hindsight) -> list[PhaseScore]:
    return score_phases(wl.labels, held, run.ttft, hind.ttft, run.actions)


__all__ = ["CONTROL_TICK_S", "WORKLOADS", "Hindsight", "LiveRun", "held_alarms", "held_ttfts", "hindsight", "hindsight_grid",
           "run_live", "score_run", "workload"]
