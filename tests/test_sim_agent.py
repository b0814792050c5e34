"""The simulated-clock harness's tuner sees only what the agent collects (emulator/demo/sim_agent.py).

The emulated fleet serves a workload frame; an in-process agent scrapes what its pods expose and
indexes their block events. The agent's readings are checked against the fleet's truth, and the
tuner the harness builds is checked to take agent objects only (no frame anywhere in its inputs).
"""
from __future__ import annotations

import dataclasses
import inspect
import typing

import polars as pl
import pytest

from agent.runtime.fleet_robust import RobustFleet
from agent.runtime.paying_runtime import FittedHistory
from agent.runtime.tuning.build import TuningIO, build_tuning
from agent.runtime.tuning.workload import PreferRebuilt
from agent.runtime.tuning_bridge import StoreWindowSource
from emulator.demo import sim_run
from emulator.demo.deployment import MODEL_NAME, demo_deployment
from emulator.demo.sim_agent import SimAgent
from emulator.demo.workload import build_workload
from simulator.cluster import ClusterSpec

SPAN_S = 400.0


@pytest.fixture(scope="module")
def served():
    """400 s of the demo's first phase on 2 pods, scraped every 10 s by the in-process agent."""
    wl, cluster = build_workload(SPAN_S, 7), ClusterSpec(pods=2)
    dep = demo_deployment(2, 7)
    clock = [0.0]
    agent = SimAgent(dep.settings, model=MODEL_NAME, clock=lambda: clock[0], scrape_interval_s=10.0)
    fleet = sim_run.sim_fleet(wl, cluster, dep, agent, dry_run=False)
    t = 0.0
    while t <= SPAN_S:
        fleet.advance(t)
        clock[0] = t
        agent.scrape(t, fleet.snapshots())
        t += 10.0
    return wl, cluster, dep, agent, fleet


def test_the_agent_sees_the_requests_and_blocks_the_fleet_served(served) -> None:
    _wl, _cluster, _dep, agent, fleet = served
    now = SPAN_S
    truth = fleet.signals(now, 60.0)
    seen = agent.drift_signals()
    assert seen["prompt_tokens_mean"] == pytest.approx(truth["prompt_tokens_mean"], rel=0.05)
    assert seen["arrival_rate"] == pytest.approx(truth["arrival_rate"], rel=0.2)
    assert "reuse_ratio" in seen  # from the KV events and the scraped token counters
    # the planning workload is rebuilt from the block stream: every request served is in it
    assert agent.workload.kind == "rebuilt"
    frame = agent.workload.history(now, now)
    assert frame.height == pytest.approx(fleet.served, rel=0.02)
    # the fully cached requests arrive within the scraped counter's intervals: from its first sample,
    # even in a window reaching back before it
    window = agent.workload.rebuilt.window(now, now + 100.0)
    counts = agent.workload.rebuilt.counts(-100.0, now)
    first = min(iv[0] for c in counts.values() for iv in c.intervals)
    synth = window.requests.ts[window.requests.own == 0]  # a rebuilt request stored at least one block
    assert len(synth) == sum(window.synthesised.values()) > 0
    assert synth.min() >= first >= 0.0 and frame["timestamp_ms"].min() >= 0
    # the live window comes from the scraped TTFT histograms, not the served samples
    obs = agent.window_source.ttft_observations(now - 120.0, now)
    assert obs is not None and obs.samples is None and obs.buckets


def test_without_kv_events_the_planning_workload_is_the_fitted_fallback() -> None:
    dep = demo_deployment(2, 7)
    off = dep.settings.model_copy(update={"kv_events": dep.settings.kv_events.model_copy(update={"enabled": False})})
    agent = SimAgent(off, model=MODEL_NAME, clock=lambda: 0.0, scrape_interval_s=10.0)
    assert agent.kv is None and isinstance(agent.workload, FittedHistory) and agent.workload.kind == "fitted"


def test_the_harness_wiring_hands_the_tuner_agent_objects_only(served, monkeypatch) -> None:
    """`tuner_for` by default, as run_live calls it (see the test below)."""
    # structurally: neither the builder nor the harness's tuner wiring takes a workload frame
    for fn in (build_tuning, sim_run.tuner_for):
        hints = typing.get_type_hints(fn)
        assert all(h is not pl.DataFrame and "DemoWorkload" not in str(h) for h in hints.values()), fn
    frame_fields = [f.name for f in dataclasses.fields(TuningIO) if "DataFrame" in str(f.type)]
    assert frame_fields == ["trace"]  # only the operator's own trace file (tuner.warm_start.trace)
    assert "wl" not in inspect.signature(sim_run.tuner_for).parameters
    # and at run time: what the harness gives the builder comes from the agent
    _wl, cluster, dep, agent, fleet = served
    got: list[TuningIO] = []
    real = sim_run.build_tuning
    monkeypatch.setattr(sim_run, "build_tuning", lambda s, io: got.append(io) or real(s, io))
    sim_run.tuner_for(dep.settings, agent, fleet, cluster, dep, lambda: SPAN_S, dry_run=False)
    (io,) = got
    assert io.trace is None and io.workload is agent.workload and isinstance(io.workload, PreferRebuilt)
    # the agent's robust view of its store, as `tierpilot run` plans and judges on
    assert isinstance(io.window_source, StoreWindowSource) and io.window_source.store is agent.planning_store
    assert isinstance(agent.planning_store, RobustFleet) and agent.planning_store.store is agent.store
    assert io.latency_points.__self__ is agent  # type: ignore[attr-defined]
    assert io.actuator is fleet  # the fleet is only the actuator


class _Built(Exception):
    """Stops run_live once it has handed the builder its inputs."""


def _frames_in(obj, depth: int = 8, seen: set[int] | None = None) -> list[str]:
    """Where a polars frame (or a demo workload, which holds one) is reachable from `obj`: through
    attributes, dataclass fields, containers, partials, closures and bound methods."""
    seen = set() if seen is None else seen
    if id(obj) in seen or depth < 0 or isinstance(obj, (str, bytes, int, float, bool, type(None), type)):
        return []
    seen.add(id(obj))
    if isinstance(obj, (pl.DataFrame, pl.LazyFrame, pl.Series)) or type(obj).__name__ == "DemoWorkload":
        return [type(obj).__name__]
    children: list = []
    if isinstance(obj, dict):
        children = list(obj.values())
    elif isinstance(obj, (list, tuple, set, frozenset)):
        children = list(obj)[:64]
    else:
        children = list(getattr(obj, "__dict__", {}).values())
        children += [getattr(obj, n, None) for n in getattr(type(obj), "__slots__", ()) if isinstance(n, str)]
        children += [getattr(obj, n, None) for n in ("func", "args", "keywords", "__self__")]
        children += [c.cell_contents for c in (getattr(obj, "__closure__", None) or ()) if c.cell_contents is not c]
    return [f"{type(obj).__name__}>{hit}" for child in children for hit in _frames_in(child, depth - 1, seen)]


def _inputs_run_live_builds(monkeypatch, **kw) -> TuningIO:
    got: list[TuningIO] = []

    def capture(settings, io):
        got.append(io)
        raise _Built

    monkeypatch.setattr(sim_run, "build_tuning", capture)
    wl, cluster = build_workload(SPAN_S, 7), ClusterSpec(pods=2)
    with pytest.raises(_Built):
        sim_run.run_live(wl, cluster, 7, **kw)
    (io,) = got
    return io


def test_run_live_hands_the_tuner_no_workload_frame(monkeypatch) -> None:
    """By default the harness's tuner plans on the agent's workload: no frame in any of its inputs
    (the fleet, which serves the frame, is the actuator only)."""
    io = _inputs_run_live_builds(monkeypatch)
    assert isinstance(io.workload, PreferRebuilt)
    inputs = {f.name: getattr(io, f.name) for f in dataclasses.fields(TuningIO) if f.name != "actuator"}
    assert {name: hits for name, v in inputs.items() if (hits := _frames_in(v))} == {}
    # the walk finds a frame where there is one: the served-stream comparison hands it the frame
    served_io = _inputs_run_live_builds(monkeypatch, planning="served")
    assert _frames_in(served_io.workload)
