"""The real-engine verdict tells noise from effect: on synthetic paired streams whose two fleets
have slow stretches of their own (a busy core slows a fleet for many requests in a row), A/A runs
rarely state an effect, a real 2x change is found, and nothing applied reads "no change, noise".
Resampling single requests (the verdict's former statistic) calls that A/A noise an effect."""
from __future__ import annotations

import math

import numpy as np
import pytest

from emulator.demo.paired_verdict import block_ratio, paired_verdict
from tuners.payoff import speed_text

N, SPAN_S = 600, 150.0
SEEDS = range(120)


def _ar1(rng: np.random.Generator, n: int, phi: float, sd: float) -> np.ndarray:
    """A stationary AR(1) series: x[i] = phi x[i-1] + shock."""
    from scipy.signal import lfilter

    shocks = rng.normal(0, sd * math.sqrt(1 - phi**2), n)
    shocks[0] = rng.normal(0, sd)
    return lfilter([1.0], [1.0, -phi], shocks)


def stream(seed: int, *, effect: float = 1.0, change_at: float = SPAN_S / 2):
    """Paired TTFTs: the same request sizes, a load both fleets share, a slow-stretch process per
    fleet and per-request noise; from `change_at` on the tuned fleet is `effect` times faster."""
    rng = np.random.default_rng(seed)
    size = rng.lognormal(-2.5, 0.5, N)
    shared = _ar1(rng, N, 0.98, 0.2)
    tuned = size * np.exp(shared + _ar1(rng, N, 0.97, 0.15) + rng.normal(0, 0.3, N))
    held = size * np.exp(shared + _ar1(rng, N, 0.97, 0.15) + rng.normal(0, 0.3, N))
    sent = np.linspace(0.0, SPAN_S, N)
    tuned[sent >= change_at] /= effect
    return sent, tuned, held


def per_request_bootstrap(tuned: np.ndarray, held: np.ndarray, rounds: int = 400) -> tuple[float, float]:
    """The former statistic: a 90% interval of held mean / tuned mean, resampling single requests."""
    idx = np.random.default_rng(0).integers(0, len(tuned), (rounds, len(tuned)))
    ratios = held[idx].mean(axis=1) / tuned[idx].mean(axis=1)
    return float(np.quantile(ratios, 0.05)), float(np.quantile(ratios, 0.95))


def test_resampling_single_requests_calls_aa_noise_an_effect():
    flagged = 0
    for seed in SEEDS:
        _, t, h = stream(seed)
        lo, hi = per_request_bootstrap(t, h)
        flagged += lo > 1 or hi < 1
    assert flagged / len(SEEDS) > 0.4  # the finding: most A/A runs "show" an effect


def test_aa_runs_rarely_state_an_effect_and_never_when_nothing_was_applied():
    stated = 0
    for seed in SEEDS:
        sent, t, h = stream(seed)
        idle = paired_verdict(sent, t, h, None)
        assert not idle.stated and idle.sentence().startswith("No change, noise: the tuner applied nothing")
        stated += paired_verdict(sent, t, h, SPAN_S / 2).stated  # a change that changed nothing
    assert stated / len(SEEDS) <= 0.05


@pytest.mark.parametrize("effect, word", [(2.0, "Yes"), (1 / 2.0, "No, it cost")])
def test_a_real_change_is_found_and_named_in_its_direction(effect, word):
    found = 0
    for seed in SEEDS:
        sent, t, h = stream(seed, effect=effect)
        v = paired_verdict(sent, t, h, SPAN_S / 2)
        if v.stated:
            found += 1
            assert (v.effect > 1) == (effect > 1) and v.sentence().startswith(word + ":"), v.sentence()
    assert found / len(SEEDS) >= 0.6  # the price of a noise floor that holds on real A/A runs


def test_a_fleet_bias_is_not_an_effect():
    """One fleet slower all along (its cores busier): the A/A segment measures it, the effect is
    relative to it."""
    sent, t, h = stream(3)
    v = paired_verdict(sent, t * 1.3, h, SPAN_S / 2)
    assert v.aa.ratio < 0.85 and abs(math.log(v.effect)) < 0.2 and not v.stated


def test_too_few_requests_before_the_change_cannot_tell():
    sent, t, h = stream(5)
    v = paired_verdict(sent, t, h, sent[10])
    assert not v.stated and v.sentence().startswith("Cannot tell: the tuner changed the configuration at 3 s, but "
                                                    "only 10 requests were sent before it")
    assert not block_ratio(t[:10], h[:10]).measured


def test_ratios_read_as_faster_or_slower():
    assert speed_text(1.12) == "1.12x faster"
    assert speed_text(1 / 1.19) == "1.19x slower"
    assert speed_text(1.0) == "same speed" and speed_text(math.nan) == "n/a"
    sent, t, h = stream(1)
    text = paired_verdict(sent, t, h, SPAN_S / 2).sentence()
    assert "x faster" in text or "x slower" in text
    assert "+" not in text and "held/tuned" not in text
