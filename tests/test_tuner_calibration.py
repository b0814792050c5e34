"""Fitting the twin's prefill speed to what the fleet served (tuners/calibration.py)."""
from __future__ import annotations

import numpy as np
import pytest

from emulator.cluster.twin_fleet import TwinFleet
from emulator.demo.workload import build_workload
from simulator.cluster import ClusterSpec
from simulator.profile import get_profile
from simulator.records import iter_requests
from tuners.calibration import calibrated_profile, fit_prefill_latency


def test_fit_recovers_a_hand_made_line() -> None:
    rng = np.random.default_rng(1)
    x = rng.uniform(200, 4000, 40)
    y = 0.1 + 0.0003 * x + 0.002 * rng.standard_normal(40)
    fit = fit_prefill_latency([(30.0, a, b) for a, b in zip(x, y)])
    assert fit is not None and fit.windows == 40 and fit.r2 > 0.99
    assert fit.overhead_s == pytest.approx(0.1, abs=0.005)
    assert fit.prefill_s_per_token == pytest.approx(0.0003, rel=0.02)


def test_no_fit_from_too_little_or_flat_or_unphysical_data() -> None:
    assert fit_prefill_latency([(10.0, 1000.0, 0.4)] * 3) is None  # too few windows
    assert fit_prefill_latency([(10.0, 1000.0, 0.4 + 0.01 * i) for i in range(10)]) is None  # no spread
    xs = np.linspace(500, 3000, 10)
    assert fit_prefill_latency([(10.0, x, 1.0 - 0.0002 * x) for x in xs]) is None  # faster with more work


def test_fit_on_the_twin_fleet_finds_its_prefill_speed_and_only_that_is_applied() -> None:
    wl, cluster = build_workload(600.0, 7), ClusterSpec(pods=4)
    fleet = TwinFleet(list(iter_requests(wl.frame)), cluster)
    fleet.advance(200.0)
    fit = fit_prefill_latency(fleet.latency_points(0.0, 200.0))
    truth = get_profile(None).latency
    assert fit is not None
    assert fit.prefill_s_per_token == pytest.approx(truth.prefill_s_per_token, rel=0.15)
    prof = calibrated_profile(cluster.hardware, fit)
    assert prof.latency.prefill_s_per_token == fit.prefill_s_per_token
    assert prof.latency.request_overhead_s == truth.request_overhead_s  # the intercept is reported only
    assert calibrated_profile(cluster.hardware, None) is cluster.hardware
