"""Change-point detection: synthetic shifts are found fast, stationary input raises no alarm."""
from __future__ import annotations

import numpy as np
import pytest

from simulator.synthetic import synthetic
from tests.support.tuner_settings import drift_settings
from tuners.drift import DriftDetector, SignalDetector, workload_signals


def series(seed: int, n: int, shift_at: int | None = None, delta: float = 0.0, level: float = 0.5,
           sigma: float = 0.03) -> np.ndarray:
    rng = np.random.default_rng(seed)
    x = level + sigma * rng.standard_normal(n)
    if shift_at is not None:
        x[shift_at:] += delta
    return x


def first_alarm(det: SignalDetector, xs: np.ndarray) -> tuple[int, str] | None:
    for i, x in enumerate(xs):
        hit = det.update(float(x))
        if hit:
            return i, hit[0]
    return None


@pytest.mark.parametrize("method", ["page_hinkley", "cusum"])
@pytest.mark.parametrize(("delta", "direction"), [(-0.12, "down"), (0.09, "up")])
def test_level_shifts_are_detected_quickly_in_the_right_direction(method: str, delta: float, direction: str) -> None:
    for seed in range(5):
        det = SignalDetector("reuse_ratio", drift_settings(method=method))
        got = first_alarm(det, series(seed, 200, shift_at=100, delta=delta))
        assert got is not None
        at, d = got
        assert d == direction
        assert 100 <= at <= 110, f"seed {seed}: alarm at {at}"


def test_page_hinkley_stays_quiet_on_stationary_noise() -> None:
    alarms = 0
    for seed in range(10):
        det = SignalDetector("reuse_ratio", drift_settings())
        alarms += first_alarm(det, series(100 + seed, 500)) is not None
    assert alarms == 0


def test_a_constant_signal_needs_a_real_shift() -> None:
    det = SignalDetector("arrival_rate", drift_settings(warmup=5, min_rel_sigma=0.02))
    assert first_alarm(det, np.full(300, 4.0)) is None
    assert first_alarm(det, np.full(50, 4.0 * 1.01)) is None  # 1% is within the noise floor
    got = first_alarm(det, np.full(50, 3.0))
    assert got is not None and got[1] == "down"


def test_detector_skips_missing_values_and_resets_only_what_it_is_told() -> None:
    d = DriftDetector(drift_settings(warmup=3), signals=("reuse_ratio", "hit_ratio"))
    for t in range(3):
        assert d.update({"reuse_ratio": 0.5, "hit_ratio": float("nan")}, t) is None
    assert d.detectors["reuse_ratio"].warm and not d.detectors["hit_ratio"].warm
    d.reset(("hit_ratio",))
    assert d.detectors["reuse_ratio"].warm


def test_bad_settings_are_clear_errors() -> None:
    with pytest.raises(ValueError, match="drift.method: invalid value 'bocpd'; valid: page_hinkley, cusum"):
        drift_settings(method="bocpd")


@pytest.mark.parametrize("seed", [1, 2])
def test_twin_workloads_shift_is_found_and_stationary_presets_are_quiet(seed: int) -> None:
    shift = workload_signals(synthetic("shift", seed=seed), 10.0)  # rag for 300 s, then sessions
    det = DriftDetector(drift_settings())
    events = [e for s in shift if (e := det.update(s, s["t"]))]
    assert len(events) == 1
    assert 300 <= events[0].at <= 330
    for preset in ("rag", "sessions", "short"):
        quiet = DriftDetector(drift_settings())
        alarms = [e for s in workload_signals(synthetic(preset, seed=seed), 10.0) if (e := quiet.update(s, s["t"]))]
        assert alarms == []


def test_workload_signals_on_a_hand_built_frame() -> None:
    import polars as pl

    frame = pl.DataFrame({"timestamp_ms": [0, 500, 1500], "input_length": [1024, 1536, 3000],
                          "hash_ids": [[1, 2], [1, 2, 3], [9, 10, 11, 12, 13, 14]]})
    w0, w1 = workload_signals(frame, 1.0)
    assert w0 == {"t": 0.0, "reuse_ratio": 2 / 5, "prompt_tokens_mean": 1280.0, "long_prompt_fraction": 0.0,
                  "arrival_rate": 2.0}
    assert w1["reuse_ratio"] == 0.0 and w1["long_prompt_fraction"] == 1.0
