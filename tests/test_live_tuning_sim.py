"""The benchmark's loop (emulator/demo/sim_run.py): the demo's real tuner against the twin on a
simulated clock, scored by the honest measure. Seeded: tuned is never worse than held."""
from __future__ import annotations

import logging

import pytest

from emulator.demo.deployment import demo_deployment
from emulator.demo.sim_run import held_alarms, held_ttfts, hindsight, run_live, score_run
from emulator.demo.workload import build_workload
from simulator.cluster import ClusterSpec
from tuners.payoff import WHOLE_RUN


@pytest.fixture(scope="module")
def scored():
    logging.disable(logging.WARNING)
    try:
        wl, cluster = build_workload(1500.0, 7), ClusterSpec(pods=4)
        held = held_ttfts(wl, cluster)
        run = run_live(wl, cluster, 7)
        hind = hindsight(wl, cluster, [], extra=run.end_knobs)
        return wl, run, score_run(wl, held, run, hind)
    finally:
        logging.disable(logging.NOTSET)


def test_tuned_is_never_worse_than_held_on_the_demo_workload(scored) -> None:
    _wl, _run, scores = scored
    whole = next(s for s in scores if s.label == WHOLE_RUN)
    assert whole.speedup_p95 >= 1.0 and whole.speedup_mean >= 1.0, whole
    for s in scores:
        assert s.speedup_p95 >= 0.98 and s.speedup_mean >= 0.98, s
    # and it did something: the hot router change, judged live and kept
    assert whole.actions.applies >= 1 and whole.actions.rollbacks == 0
    assert whole.speedup_mean > 1.03


def test_drift_finds_the_shift_once_and_not_the_tuners_own_changes(scored) -> None:
    wl, run, _scores = scored
    assert len(run.alarms) == 1 and run.detection_delays_s[0] <= 120.0
    alarms, _counts, delays = held_alarms(wl, run, demo_deployment(4, 7))
    assert len(alarms) == 1 and delays[0] <= 120.0
    assert run.prediction_errors  # the twin's prediction was checked against every live window
