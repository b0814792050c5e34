"""The demo's tuner on a simulated clock: one run of minutes of cluster time takes seconds.

`run_live(workload, cluster, seed)` drives the agent's tuning stack (`agent.runtime.tuning`:
guardrails, drift detector, live evaluator, planner and twin search, built from the demo's settings
file `emulator/demo/tuner.yaml`) against `emulator.cluster.twin_fleet.TwinFleet`, one controller
step every `tuner.step_interval_s` cluster seconds, as the demo does. `held_ttfts` replays the same requests with the defaults held; `hindsight`
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
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np
import optuna
import polars as pl

from agent.runtime.tuning.build import Tuning, TuningIO, build_tuning
from agent.runtime.tuning.schema import drift_settings
from agent.runtime.tuning.workload import WorkloadSource
from agent.settings import AgentSettings
from contracts.knobs import DEFAULT_KNOBS, Knobs
from emulator.cluster.pod_metrics import PodIdentity
from emulator.cluster.twin_fleet import TwinFleet
from emulator.demo.deployment import DEMO_TTFT_BUCKETS, MODEL_NAME, Deployment, demo_deployment, restarts_pods
from emulator.demo.sim_agent import SimAgent
from emulator.demo.workload import TRACE_HASH_OFFSET, DemoWorkload, build_workload
from simulator.cluster import ClusterSpec
from simulator.records import WORKLOAD_SCHEMA, iter_requests
from simulator.replay import replay
from simulator.synthetic import generate, preset_phases
from simulator.workload import load_trace
from tuners.drift import DriftDetector
from tuners.metrics import TunerMetrics
from tuners.payoff import ActionCounts, PhaseScore, score_phases

DEMO_SPAN_S = 180.0 * 20.0 * 0.95  # `make demo`: 180 s wall at 20x, 95% of it workload
WORKLOADS = ("demo", "shift", "mooncake")  # the scenarios of emulator.demo.scenarios come on top
DETECT_WITHIN_S = 120.0  # scoring: an alarm this soon after a real shift detected it


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
    workloads: tuple[str, ...] = ()  # what the plans were priced on (rebuilt, fitted)


def _phase_of(starts: Sequence[float], t: float) -> int:
    return sum(1 for p in starts[1:] if t >= p)


@dataclasses.dataclass(frozen=True)
class ServedFrame:
    """The requests the emulated fleet served up to `now` (kind `served`): what the real-engine
    demo's planner replays (its few engines publish no block stream it rebuilds yet). The
    simulated-clock harness never uses it: its tuner sees only what the agent collects."""

    workload: DemoWorkload
    kind: str = "served"
    min_rows: int = 200  # widened back until it holds this many requests

    def history(self, now: float, seconds: float) -> pl.DataFrame:
        return self.workload.recent(now, seconds, min_rows=self.min_rows)


def sim_fleet(wl: DemoWorkload, cluster: ClusterSpec, deployment: Deployment, agent: SimAgent, *,
              dry_run: bool) -> TwinFleet:
    """The emulated fleet serving `wl`: the deployment's starting configuration, its pods down
    `tuner.planner.restart_downtime_s` in a rolling restart (as the tuner expects), each pod's
    `/metrics` and block events for the agent."""
    caps = cluster.capacities(deployment.start)
    identity = PodIdentity(model_name=MODEL_NAME, kv_bytes_per_token=int(caps.kv_bytes_per_token),
                           num_gpu_blocks=caps.gpu_tokens // 16, ttft_buckets=DEMO_TTFT_BUCKETS)
    return TwinFleet(list(iter_requests(wl.frame)), cluster, deployment.start,
                     restart_downtime_s=deployment.settings.tuner.planner.restart_downtime_s, dry_run=dry_run,
                     identity=identity, event_sink=agent.sink)


def tuner_for(settings: AgentSettings, agent: SimAgent, fleet: TwinFleet, cluster: ClusterSpec,
              deployment: Deployment, clock: Callable[[], float], *, dry_run: bool,
              workload: WorkloadSource | None = None) -> Tuning:
    """The agent's tuning stack over the in-process agent: its inputs are agent objects only (the
    window source, calibration points and planning workload of `agent`); the fleet is the
    actuator, the deployment's space and restart rule bound it, the twin is the fleet's spec.
    `workload`: another planning workload (run_live planning="served": the served stream)."""
    return build_tuning(settings, TuningIO(
        actuator=fleet, space=deployment.space(), window_source=agent.window_source,
        workload=workload if workload is not None else agent.workload,
        twin_cluster=lambda: cluster, clock=clock, metrics=TunerMetrics(target="bench"),
        storage=optuna.storages.InMemoryStorage(), restarts=restarts_pods, latency_points=agent.latency_points,
        dry_run=dry_run))


def run_live(wl: DemoWorkload, cluster: ClusterSpec, seed: int, *, dry_run: bool = False,
             deployment: Deployment | None = None, planning: str = "agent") -> LiveRun:
    """The agent's tuner with the deployment's settings (default: the demo's, `tuner.yaml`) against
    the twin fleet on a simulated clock (dry_run: the start held). The frame drives the fleet
    only; every `tuner.step_interval_s` the in-process agent scrapes the pods, then the
    controller steps on the agent's drift signals. `planning`: agent (the agent's planning
    workload: rebuilt from the block stream, or fitted without KV events) or served (the planner
    replays the served stream: a comparison for bench/live_tuning.py only)."""
    deployment = deployment or demo_deployment(cluster.pods, seed)
    settings = deployment.settings
    t = settings.tuner
    clock = [0.0]
    agent = SimAgent(settings, model=MODEL_NAME, clock=lambda: clock[0], scrape_interval_s=t.step_interval_s)
    fleet = sim_fleet(wl, cluster, deployment, agent, dry_run=dry_run)
    tuning = tuner_for(settings, agent, fleet, cluster, deployment, lambda: clock[0], dry_run=dry_run,
                       workload=ServedFrame(wl) if planning == "served" else None)
    ctl = tuning.new_controller()
    starts = wl.phase_starts_s
    end_knobs: list[Knobs] = []
    alarms: list[float] = []
    states: list[tuple[float, str, str]] = []
    signals: list[tuple[float, dict[str, float]]] = []
    t_s = 0.0
    last_t = wl.frame["timestamp_ms"].max() / 1000.0
    while t_s <= last_t + t.step_interval_s:
        fleet.advance(t_s)
        clock[0] = t_s
        agent.scrape(t_s, fleet.snapshots())
        if t_s >= t.drift.window_s:  # the first step once the agent has a window
            phase = _phase_of(starts, t_s)
            while len(end_knobs) < phase:
                end_knobs.append(fleet.current())
            signals.append((t_s, agent.drift_signals()))
            rep = ctl.step(t_s, signals[-1][1])
            if rep.state == "drift":
                alarms.append(t_s)
            if rep.state not in ("measuring", "holding", "blocked", "baseline", "retry", "planning"):
                states.append((t_s, rep.state, rep.message))
        t_s += t.step_interval_s
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
    kinds = sorted({p.get("workload", "") for p in plans} - {""})
    return LiveRun(ttft, actions, tuple(alarms), tuple(delays), tuple(end_knobs), tuple(states), tuple(signals),
                   tuple(ctl.prediction_errors), tuple(tuning.latency_fits), plans, restarted, tuple(kinds))


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


def held_alarms(wl: DemoWorkload, run: LiveRun, deployment: Deployment) -> tuple[list[float], dict[int, ActionCounts], list[float]]:
    """The drift detector over the held run: the same signals (they come from the request stream,
    not the configuration), the same detector settings, nothing applied. Returns the alarm times,
    per-phase true/false counts and each shift's detection delay."""
    drift = deployment.settings.tuner.drift
    det = DriftDetector(drift_settings(deployment.settings), signals=tuple(drift.signals))
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


__all__ = [
    "DETECT_WITHIN_S",
    "WORKLOADS",
    "Hindsight",
    "LiveRun",
    "ServedFrame",
    "held_alarms",
    "held_ttfts",
    "hindsight",
    "hindsight_grid",
    "run_live",
    "score_run",
    "workload",
]
