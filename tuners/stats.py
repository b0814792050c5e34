"""Is a trial statistically worse than the last good configuration?

Two tests, both on TTFT observations over an evaluation window (raw samples, or per-bucket
counts from the `vllm:time_to_first_token_seconds` histogram):

- `mann_whitney_worse`: one-sided Mann-Whitney U (candidate stochastically larger). On bucket
  counts the buckets are ordered categories and the statistic is computed from counts with the
  tie-corrected normal approximation, so no samples are invented.
- `bootstrap_quantile_worse`: bootstrap confidence interval of the relative change of a TTFT
  quantile (p95 by default). Samples are resampled; bucket counts are resampled multinomially
  and the quantile is interpolated inside buckets as PromQL's `histogram_quantile` does.

A verdict is "worse" only when the test is significant AND the quantile rose by at least
`min_rel_effect` (statistically and practically worse). Too few observations -> inconclusive.
"""
from __future__ import annotations

import dataclasses
import math
from typing import Literal

import numpy as np

from tuners.objective import TtftObservations

Method = Literal["mannwhitney", "bootstrap"]
METHODS: tuple[str, ...] = ("mannwhitney", "bootstrap")


@dataclasses.dataclass(frozen=True, kw_only=True)
class RegressionSettings:
    """method: mannwhitney | bootstrap. alpha: one-sided significance level.
    min_rel_effect: the quantile must also rise by this fraction to count as worse.
    quantile: the quantile compared (0.95 for the TTFT p95 objective).
    min_samples: fewer observations on either side -> inconclusive. n_boot: bootstrap rounds."""

    method: str
    alpha: float
    min_rel_effect: float
    quantile: float
    min_samples: int
    n_boot: int

    def __post_init__(self) -> None:
        if self.method not in METHODS:
            raise ValueError(f"regression.method: invalid value {self.method!r}; valid: {', '.join(METHODS)}")
        if not 0 < self.alpha < 1 or not 0 < self.quantile < 1:
            raise ValueError("regression.alpha and regression.quantile must be in (0, 1)")


@dataclasses.dataclass(frozen=True)
class Verdict:
    """The outcome of one regression test."""

    worse: bool
    conclusive: bool
    method: str
    statistic: float  # p-value (mannwhitney) or CI lower bound of the relative change (bootstrap)
    candidate_q: float
    baseline_q: float
    n_candidate: int
    n_baseline: int
    reason: str

    @property
    def rel_change(self) -> float:
        return self.candidate_q / self.baseline_q - 1.0 if self.baseline_q > 0 else math.nan


def judge(candidate: TtftObservations, baseline: TtftObservations,
          settings: RegressionSettings, *, seed: int = 0) -> Verdict:
    """Run the configured test. Both sides must use the same form (samples or the same buckets)."""
    n_c, n_b = candidate.count, baseline.count
    q_c, q_b = candidate.quantile(settings.quantile), baseline.quantile(settings.quantile)
    if n_c < settings.min_samples or n_b < settings.min_samples:
        return Verdict(False, False, settings.method, math.nan, q_c, q_b, n_c, n_b,
                       f"inconclusive: {n_c} candidate / {n_b} baseline observations, "
                       f"need {settings.min_samples} each")
    practical = q_b > 0 and q_c >= (1.0 + settings.min_rel_effect) * q_b
    if settings.method == "mannwhitney":
        p = mann_whitney_worse(candidate, baseline)
        worse = p < settings.alpha and practical
        larger = p < settings.alpha
        test = (f"the TTFTs as a whole are {'' if larger else 'not significantly '}larger (one-sided Mann-Whitney "
                f"p = {p:.2g}, {'<' if larger else '>='} {settings.alpha:g})")
        if larger and not practical:
            test += f", but the p{settings.quantile * 100:g} did not rise by {settings.min_rel_effect:.0%}"
        why = _sentence(settings.quantile, q_b, q_c, worse, test)
        return Verdict(worse, True, "mannwhitney", p, q_c, q_b, n_c, n_b, why)
    low = bootstrap_quantile_worse(candidate, baseline, q=settings.quantile, alpha=settings.alpha,
                                   n_boot=settings.n_boot, seed=seed)
    worse = low > settings.min_rel_effect
    why = _sentence(settings.quantile, q_b, q_c, worse,
                    f"the bootstrap {100 * (1 - settings.alpha):g}% lower bound of its change is {low:+.1%}, "
                    f"{'above' if worse else 'not above'} the {settings.min_rel_effect:+.0%} threshold")
    return Verdict(worse, True, "bootstrap", low, q_c, q_b, n_c, n_b, why)


def _sentence(q: float, before_s: float, after_s: float, worse: bool, test: str) -> str:
    """A verdict as a plain sentence: what moved, what the test says, and the conclusion."""
    moved = "rose" if after_s > before_s else "fell" if after_s < before_s else "stayed"
    change = f"from {before_s:.3g} s to {after_s:.3g} s" if moved != "stayed" else f"at {before_s:.3g} s"
    return f"TTFT p{q * 100:g} {moved} {change}; {test}: {'a regression' if worse else 'not a regression'}"


# -- Mann-Whitney --------------------------------------------------------------------------
def mann_whitney_worse(candidate: TtftObservations, baseline: TtftObservations) -> float:
    """One-sided p-value of H1: candidate TTFTs are stochastically larger than baseline's."""
    if candidate.samples is not None and baseline.samples is not None:
        from scipy import stats as sps  # 2 s to import: only when a decision is made

        res = sps.mannwhitneyu(np.asarray(candidate.samples), np.asarray(baseline.samples),
                               alternative="greater", method="asymptotic")
        return float(res.pvalue)
    a, b = _aligned_counts(candidate, baseline)
    return mann_whitney_counts(a, b)


def mann_whitney_counts(a: np.ndarray, b: np.ndarray) -> float:
    """One-sided (a > b) Mann-Whitney p-value from counts over the same ordered categories."""
    a, b = np.asarray(a, float), np.asarray(b, float)
    n1, n2 = a.sum(), b.sum()
    if n1 == 0 or n2 == 0:
        return 1.0
    below_b = np.concatenate([[0.0], np.cumsum(b)[:-1]])
    u = float(np.sum(a * (below_b + 0.5 * b)))
    n = n1 + n2
    t = a + b
    tie = float(np.sum(t ** 3 - t))
    var = n1 * n2 / 12.0 * ((n + 1) - tie / (n * (n - 1)))
    if var <= 0:
        return 1.0
    z = (u - n1 * n2 / 2.0 - 0.5) / math.sqrt(var)
    from scipy import stats as sps

    return float(sps.norm.sf(z))


# -- bootstrap -------------------------------------------------------------------------------
def bootstrap_quantile_worse(candidate: TtftObservations, baseline: TtftObservations, *, q: float = 0.95,
                             alpha: float = 0.05, n_boot: int = 2000, seed: int = 0) -> float:
    """Lower bound of the one-sided (1 - alpha) bootstrap CI of q_candidate / q_baseline - 1."""
    rng = np.random.default_rng(seed)
    if candidate.samples is not None and baseline.samples is not None:
        qc = _boot_sample_quantiles(np.asarray(candidate.samples, float), q, n_boot, rng)
        qb = _boot_sample_quantiles(np.asarray(baseline.samples, float), q, n_boot, rng)
    else:
        a, b = _aligned_counts(candidate, baseline)
        bounds = np.asarray([le for le, _ in (candidate.buckets or baseline.buckets or ())], float)
        qc = _boot_bucket_quantiles(bounds, a, q, n_boot, rng)
        qb = _boot_bucket_quantiles(bounds, b, q, n_boot, rng)
    with np.errstate(divide="ignore", invalid="ignore"):
        rel = np.where(qb > 0, qc / qb - 1.0, 0.0)
    return float(np.quantile(rel, alpha))


def _boot_sample_quantiles(x: np.ndarray, q: float, n_boot: int, rng: np.random.Generator) -> np.ndarray:
    idx = rng.integers(0, len(x), size=(n_boot, len(x)))
    return np.quantile(x[idx], q, axis=1)


def _boot_bucket_quantiles(bounds: np.ndarray, counts: np.ndarray, q: float, n_boot: int,
                           rng: np.random.Generator) -> np.ndarray:
    n = int(counts.sum() + 0.5)
    draws = rng.multinomial(n, counts / counts.sum(), size=n_boot).astype(float)
    return bucket_quantiles(bounds, draws, q)


def bucket_quantiles(bounds: np.ndarray, counts: np.ndarray, q: float) -> np.ndarray:
    """Vectorised `bucket_quantile` over rows of per-bucket counts (same interpolation)."""
    counts = np.atleast_2d(counts)
    cum = np.cumsum(counts, axis=1)
    rank = q * cum[:, -1:]
    idx = np.argmax(cum >= rank - 1e-12, axis=1)
    finite = np.where(np.isinf(bounds), np.nan, bounds)
    lowers = np.concatenate([[0.0], finite[:-1]])
    lowers = np.where(np.isnan(lowers), 0.0, lowers)
    lo = lowers[idx]
    hi = finite[idx]
    prev = np.take_along_axis(cum, idx[:, None], axis=1)[:, 0] - counts[np.arange(len(idx)), idx]
    inside = counts[np.arange(len(idx)), idx]
    with np.errstate(divide="ignore", invalid="ignore"):
        frac = np.where(inside > 0, (rank[:, 0] - prev) / inside, 0.0)
    return np.where(np.isnan(hi), lo, lo + (np.nan_to_num(hi) - lo) * frac)


def _aligned_counts(candidate: TtftObservations, baseline: TtftObservations) -> tuple[np.ndarray, np.ndarray]:
    if candidate.buckets is None or baseline.buckets is None:
        raise ValueError("regression test: both windows need samples, or both need histogram buckets")
    bc = [le for le, _ in candidate.buckets]
    bb = [le for le, _ in baseline.buckets]
    if bc != bb:
        raise ValueError(f"regression test: bucket bounds differ between windows ({bc} vs {bb})")
    return (np.asarray([c for _, c in candidate.buckets], float),
            np.asarray([c for _, c in baseline.buckets], float))


def scale_observations(obs: TtftObservations | None, factor: float) -> TtftObservations | None:
    """The observations as if every TTFT were `factor` times longer. Samples are multiplied;
    bucket counts are re-binned onto the same bounds (cumulative counts interpolated linearly at
    bound / factor), so they still align with other windows of the same histogram."""
    if obs is None or factor == 1.0 or not (factor > 0 and math.isfinite(factor)):
        return obs
    if obs.samples is not None:
        return TtftObservations(samples=tuple(x * factor for x in obs.samples))
    bounds = np.array([b for b, _ in obs.buckets or ()], dtype=float)
    counts = np.array([c for _, c in obs.buckets or ()], dtype=float)
    if bounds.size == 0:
        return obs
    finite = np.isfinite(bounds)
    cum = np.cumsum(counts)
    xs = np.concatenate([[0.0], bounds[finite]])
    ys = np.concatenate([[0.0], cum[finite]])
    scaled = np.where(finite, np.interp(np.where(finite, bounds, 0.0) / factor, xs, ys), cum[-1])
    scaled = np.maximum.accumulate(np.minimum(scaled, cum[-1]))
    scaled[-1] = cum[-1] if not finite[-1] else scaled[-1]
    per_bucket = np.diff(np.concatenate([[0.0], scaled]))
    return TtftObservations(buckets=tuple(zip(bounds.tolist(), np.maximum(per_bucket, 0.0).tolist())))
