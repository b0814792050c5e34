"""Regression tests on TTFT samples and histogram buckets: exact values on small inputs."""
from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import stats as sps

from tests.support.tuner_settings import regression_settings
from tuners.objective import TtftObservations, bucket_quantile
from tuners.stats import (
    bucket_quantiles,
    judge,
    mann_whitney_counts,
)

BUCKETS = (0.1, 0.25, 0.5, 1.0, math.inf)


def test_bucket_quantile_interpolates_like_promql() -> None:
    b = ((0.1, 10.0), (0.5, 10.0), (math.inf, 0.0))
    assert bucket_quantile(b, 0.5) == pytest.approx(0.1)
    assert bucket_quantile(b, 0.75) == pytest.approx(0.3)
    assert bucket_quantile(((0.1, 0.0), (math.inf, 4.0)), 0.9) == 0.1  # +Inf bucket -> its lower bound
    rows = np.array([[10.0, 10.0, 0.0], [0.0, 20.0, 0.0]])
    got = bucket_quantiles(np.array([0.1, 0.5, math.inf]), rows, 0.75)
    assert got.tolist() == pytest.approx([0.3, 0.1 + 0.4 * 0.75])


def test_cumulative_bucket_deltas() -> None:
    obs = TtftObservations.from_cumulative([0.1, 0.5, math.inf], before=[1, 3, 4], after=[4, 10, 12])
    assert obs.buckets == ((0.1, 3.0), (0.5, 4.0), (math.inf, 1.0))
    assert obs.count == 8


def test_mann_whitney_from_counts_matches_scipy_on_the_expanded_data() -> None:
    a = np.array([1, 4, 6, 2, 0])
    b = np.array([5, 6, 2, 1, 1])
    xa = np.repeat(np.arange(5), a)
    xb = np.repeat(np.arange(5), b)
    want = sps.mannwhitneyu(xa, xb, alternative="greater", method="asymptotic", use_continuity=True).pvalue
    assert mann_whitney_counts(a, b) == pytest.approx(want, rel=1e-9)


def _lognormal(median: float, n: int, seed: int) -> tuple[float, ...]:
    rng = np.random.default_rng(seed)
    return tuple(np.exp(np.log(median) + 0.3 * rng.standard_normal(n)).tolist())


def _binned(samples: tuple[float, ...]) -> TtftObservations:
    idx = np.searchsorted(np.asarray(BUCKETS), samples, side="left")
    counts = np.bincount(idx, minlength=len(BUCKETS)).astype(float)
    return TtftObservations(buckets=tuple(zip(BUCKETS, counts.tolist(), strict=True)))


@pytest.mark.parametrize("method", ["mannwhitney", "bootstrap"])
@pytest.mark.parametrize("form", ["samples", "buckets"])
def test_a_real_regression_is_worse_and_noise_is_not(method: str, form: str) -> None:
    settings = regression_settings(method=method, n_boot=500)
    base = _lognormal(0.2, 300, seed=1)
    same = _lognormal(0.2, 300, seed=2)
    slower = _lognormal(0.32, 300, seed=3)
    wrap = (lambda s: TtftObservations(samples=s)) if form == "samples" else _binned
    assert judge(wrap(slower), wrap(base), settings).worse
    assert not judge(wrap(same), wrap(base), settings).worse
    faster = _lognormal(0.12, 300, seed=4)
    assert not judge(wrap(faster), wrap(base), settings).worse


def test_tiny_windows_are_inconclusive_not_worse() -> None:
    v = judge(TtftObservations(samples=(9.0,) * 5), TtftObservations(samples=(0.1,) * 100), regression_settings())
    assert not v.worse and not v.conclusive
    assert "need 30 each" in v.reason


def test_significant_but_negligible_change_is_not_a_regression() -> None:
    # 2% slower with a huge sample: significant, but below the 5% practical threshold.
    base = _lognormal(0.2, 20000, seed=5)
    bit_slower = tuple(x * 1.02 for x in _lognormal(0.2, 20000, seed=6))
    v = judge(TtftObservations(samples=bit_slower), TtftObservations(samples=base), regression_settings())
    assert not v.worse


def test_mixed_forms_are_refused() -> None:
    with pytest.raises(ValueError, match="both windows need samples, or both need histogram buckets"):
        judge(TtftObservations(samples=(0.1,) * 40), _binned((0.1,) * 40), regression_settings())
