"""Noise or effect? The real-engine demo's verdict on two fleets served the same stream at once.

The two fleets share one machine's cores. Their TTFTs differ even when they run the same
configuration, and not request by request: a core busy with something else for ten seconds slows
every request of one fleet in those ten seconds. Resampling single requests treats those as
independent draws and calls the difference an effect (an A/A run read "0.84x, 90% interval
0.71-0.99x": SLOWER). So:

- a segment of paired requests is cut into a few long consecutive blocks (BLOCKS), each gives one
  log ratio, and the interval is Student's t over those few numbers: a slow stretch stays inside
  one block, and few blocks give a wide, honest interval (tests/test_engine_verdict.py: on
  synthetic A/A streams with such stretches, resampling requests calls an effect in most runs);
- the **noise floor** is measured on the run itself: the requests sent before the tuner's first
  change went to two fleets with the same configuration (an A/A segment), so their ratio and its
  interval are what noise alone does on this machine, fleet bias included;
- an **effect** is the ratio after the first change over the A/A ratio, stated only when its
  interval excludes 1. The fleets' bias drifts over a run, so the interval is a prediction
  interval: the after segment may sit where one more A/A block would (Student's t over the A/A
  blocks, plus the after segment's own error). On real A/A runs cut at a pretend change, the
  narrower interval of the two means alone stated an effect in 3 of 9 cuts, this one in none
  (docs/demo.md). When the tuner applied nothing, the whole run is A/A and the verdict says
  "no change, noise".

Ratios are held TTFT / tuned TTFT (geometric mean over blocks of the blocks' mean ratios): above
1, tuned is faster, and they are written that way ("1.12x faster", "1.19x slower"). Pure
functions.
"""
from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence

import numpy as np

from tuners.payoff import speed_text

BLOCKS = 4  # consecutive blocks per segment (more blocks, narrower intervals, more false effects)
MIN_BLOCK_REQUESTS = 8  # a block holds at least this many paired requests
MIN_BLOCKS = 3  # a segment with fewer blocks has no interval
LEVEL = 0.95  # two-sided


@dataclasses.dataclass(frozen=True)
class RatioInterval:
    """held / tuned over a segment, its LEVEL interval (nan when the segment has fewer than
    MIN_BLOCKS blocks) and each block's log ratio."""

    ratio: float
    low: float
    high: float
    requests: int
    blocks: int
    log_ratios: tuple[float, ...] = ()  # one per block

    @property
    def measured(self) -> bool:
        return math.isfinite(self.low) and math.isfinite(self.high)

    def excludes_one(self) -> bool:
        return self.measured and (self.low > 1.0 or self.high < 1.0)

    def text(self) -> str:
        if not self.measured:
            return f"{speed_text(self.ratio)} ({self.requests} requests: too few for an interval)"
        return (f"{speed_text(self.ratio)} ({LEVEL:.0%} interval {speed_text(self.low)} to {speed_text(self.high)}, "
                f"{self.requests} requests in {self.blocks} blocks)")


def _t_quantile(df: float) -> float:
    from scipy import stats

    return float(stats.t.ppf(1 - (1 - LEVEL) / 2, df))


def block_ratio(tuned: Sequence[float], held: Sequence[float], *, blocks: int = BLOCKS) -> RatioInterval:
    """held / tuned of paired requests in sending order, with a t interval over consecutive blocks."""
    t, h = np.asarray(tuned, float), np.asarray(held, float)
    if len(t) != len(h):
        raise ValueError(f"block_ratio: {len(t)} tuned but {len(h)} held latencies (they are paired)")
    n = len(t)
    k = min(blocks, n // MIN_BLOCK_REQUESTS)
    if k < MIN_BLOCKS:
        ratio = float(h.sum() / t.sum()) if n and t.sum() > 0 else math.nan
        return RatioInterval(ratio, math.nan, math.nan, n, max(k, 0))
    edges = np.linspace(0, n, k + 1).astype(int)[:-1]
    logs = np.log(np.add.reduceat(h, edges) / np.add.reduceat(t, edges))
    mean, half = float(logs.mean()), _t_quantile(k - 1) * float(logs.std(ddof=1)) / math.sqrt(k)
    return RatioInterval(math.exp(mean), math.exp(mean - half), math.exp(mean + half), n, k,
                         tuple(float(x) for x in logs))


@dataclasses.dataclass(frozen=True)
class PairedVerdict:
    """aa: the segment before the first change (the whole run when nothing was applied), the noise
    floor. after: from the first change on (None when nothing was applied). effect: after / aa,
    with its prediction interval; stated only when that interval excludes 1."""

    changed_at_s: float | None
    aa: RatioInterval
    after: RatioInterval | None = None
    effect: float = math.nan
    effect_low: float = math.nan
    effect_high: float = math.nan

    @property
    def applied(self) -> bool:
        return self.changed_at_s is not None

    @property
    def stated(self) -> bool:
        """An effect outside the noise floor."""
        return (self.after is not None and math.isfinite(self.effect_low) and math.isfinite(self.effect_high)
                and (self.effect_low > 1.0 or self.effect_high < 1.0))

    def sentence(self) -> str:
        """One sentence answering "did tuning pay for itself?"."""
        if not self.applied:
            return ("No change, noise: the tuner applied nothing, so both fleets ran the same configuration all "
                    f"along; their difference, tuned {self.aa.text()}, is this machine's noise floor, not an effect.")
        assert self.after is not None
        at = f"{self.changed_at_s:.0f} s"
        if not (self.aa.measured and self.after.measured):
            few = self.aa if not self.aa.measured else self.after
            side = "before" if few is self.aa else "after"
            return (f"Cannot tell: the tuner changed the configuration at {at}, but only {few.requests} requests were "
                    f"sent {side} it, too few to separate an effect from noise.")
        effect = (f"{speed_text(self.effect)} ({LEVEL:.0%} interval {speed_text(self.effect_low)} to "
                  f"{speed_text(self.effect_high)})")
        floor = f"the noise floor measured before it with both fleets alike: tuned {self.aa.text()}"
        if self.stated:
            word = "Yes" if self.effect > 1 else "No, it cost"
            return (f"{word}: from its first change at {at} on, tuned served {effect} relative to held, beyond "
                    f"{floor}.")
        return (f"No effect beyond noise: from its first change at {at} on, tuned moved {effect} relative to "
                f"held, inside {floor}.")


def paired_verdict(sent_s: Sequence[float], tuned: Sequence[float], held: Sequence[float],
                   changed_at_s: float | None) -> PairedVerdict:
    """The verdict on paired requests (request i of both passes: when it was sent, and its TTFT in
    each), given when the tuner first changed the tuned fleet's configuration (None: never)."""
    order = np.argsort(np.asarray(sent_s, float), kind="stable")
    s = np.asarray(sent_s, float)[order]
    t, h = np.asarray(tuned, float)[order], np.asarray(held, float)[order]
    if changed_at_s is None:
        return PairedVerdict(None, block_ratio(t, h))
    cut = int(np.searchsorted(s, changed_at_s, side="left"))
    aa, after = block_ratio(t[:cut], h[:cut]), block_ratio(t[cut:], h[cut:])
    if not (aa.measured and after.measured):
        return PairedVerdict(changed_at_s, aa, after)
    a, b = np.asarray(aa.log_ratios), np.asarray(after.log_ratios)
    # the fleets' bias drifts: after the change it may differ from the A/A segment's mean by as much
    # as one more A/A block does (a prediction interval), on top of the after segment's own error
    se = math.sqrt(a.var(ddof=1) * (1 + 1 / len(a)) + b.var(ddof=1) / len(b))
    diff, half = float(b.mean() - a.mean()), _t_quantile(len(a) - 1) * se
    return PairedVerdict(changed_at_s, aa, after, math.exp(diff), math.exp(diff - half), math.exp(diff + half))


__all__ = ["LEVEL", "PairedVerdict", "RatioInterval", "block_ratio", "paired_verdict", "speed_text"]
