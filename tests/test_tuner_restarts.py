"""Seeded runs of the demo's tuner on the simulated-clock harness (emulator/demo/sim_run.py):
where a restart pays (a fleet started on 1,024-token chunks) one is applied and tuned beats held;
where no phase lasts long enough to repay one (8-minute phases), none is applied."""
from __future__ import annotations

import logging

import pytest

from emulator.demo.scenarios import scenario
from emulator.demo.sim_run import held_ttfts, run_live
from tuners.payoff import TtftSummary


def _run(name: str, seed: int, **kw):
    logging.disable(logging.WARNING)
    try:
        sc = scenario(name, seed, **kw)
        held = held_ttfts(sc.workload, sc.cluster, sc.deployment.start)
        run = run_live(sc.workload, sc.cluster, seed, deployment=sc.deployment)
        return sc, held, run
    finally:
        logging.disable(logging.NOTSET)


def _pooled(ttfts):
    import numpy as np

    return TtftSummary.of(np.concatenate([v for v in ttfts.values() if len(v)]))


@pytest.fixture(scope="module")
def restart_pays():
    return _run("chunk", 7, phase_s=1500.0)


@pytest.fixture(scope="module")
def short_phases():
    return _run("short", 7, short_phases=4)


def test_a_restart_that_pays_is_applied_and_tuned_beats_held(restart_pays) -> None:
    _sc, held, run = restart_pays
    assert run.restarts_applied, [p["priced"] for p in run.plans]
    assert run.end_knobs[-1].chunk_tokens <= 512
    h, t = _pooled(held), _pooled(run.ttft)
    assert t.p95_s < h.p95_s and t.mean_s < h.mean_s * 0.97, (h, t)
    # the decision a person can check: gain per hour, transition cost, payback, verdict
    applied = [d for p in run.plans for d in p["priced"] if d["restart"] and d["verdict"] == "apply"]
    assert applied and all(d["gain_per_hour_s"] > 0 and d["payback_s"] is not None for d in applied)


def test_no_restart_on_phases_too_short_to_repay_one(short_phases) -> None:
    _sc, held, run = short_phases
    assert not run.restarts_applied, run.restarts_applied
    declined = [d for p in run.plans for d in p["priced"] if d["restart"]]
    assert declined and all(d["verdict"] == "decline" and d["reason"] for d in declined)
    assert len(run.alarms) >= 2  # the shifts were seen, so the horizon knows phases are short
    h, t = _pooled(held), _pooled(run.ttft)
    assert t.p95_s <= h.p95_s * 1.01 and t.mean_s <= h.mean_s * 1.01, (h, t)
