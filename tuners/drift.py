"""Online change-point detection over the workload signals the agent computes.

Signals (any subset, one value per drift check): `reuse_ratio` (the workload's own prefix
overlap, from KV events), `prompt_tokens_mean` / `long_prompt_fraction` (prompt-length mix),
`hit_ratio` (cumulative hit ratio of the cache) and `arrival_rate` (requests/s).

Each signal gets its own two-sided detector, either Page-Hinkley (default) or CUSUM. A detector
first learns the signal's level and noise over `warmup` points (median and MAD, so a stray
outlier does not poison it), then accumulates standardised deviations; it alarms when the
cumulative deviation exceeds `threshold` noise units. There is no fixed threshold on the signal
itself: a noisy signal needs a larger shift to alarm than a quiet one.

After an alarm every detector re-learns the new regime. The hit ratio depends on the cache
configuration, so the controller calls `reset(config_dependent)` after each change it makes;
otherwise the tuner's own actuations would look like drift.
"""
from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping

import numpy as np

from tuners.logline import log_event

SIGNALS: tuple[str, ...] = ("reuse_ratio", "prompt_tokens_mean", "long_prompt_fraction", "hit_ratio",
                            "arrival_rate")
CONFIG_DEPENDENT: tuple[str, ...] = ("hit_ratio",)
METHODS: tuple[str, ...] = ("page_hinkley", "cusum")


@dataclasses.dataclass(frozen=True, kw_only=True)
class DriftSettings:
    """method: page_hinkley | cusum. warmup: points to learn level and noise.
    delta: drift allowance per point, in noise units (shifts smaller than this are ignored).
    threshold: alarm when the cumulative deviation exceeds this many noise units.
    min_rel_sigma: noise floor as a fraction of the level (a constant signal still needs a
    real shift to alarm). track: after warm-up the reference level follows the signal with this
    weight per point (an exponential average, memory ~1/track points), so a slow trend (a cache
    of documents filling up, sessions lengthening) is absorbed while a step still alarms; 0 = a
    fixed level. refractory: points ignored after an alarm before the new regime's warm-up starts
    (the signal's own window still mixes the old and new regimes). min_rel_shift: an alarm also
    needs the median of the last `confirm` points to differ from the warm-up level by this share
    of it (a shift too small to matter to the cache is not a new regime); 0 = no such check.
    confirm: points in that median."""

    method: str
    warmup: int
    delta: float
    threshold: float
    min_rel_sigma: float
    track: float
    refractory: int
    min_rel_shift: float
    confirm: int

    def __post_init__(self) -> None:
        if self.method not in METHODS:
            raise ValueError(f"drift.method: invalid value {self.method!r}; valid: {', '.join(METHODS)}")
        if self.warmup < 3:
            raise ValueError(f"drift.warmup: need >= 3 points, got {self.warmup}")
        if self.delta < 0 or self.threshold <= 0:
            raise ValueError("drift.delta must be >= 0 and drift.threshold > 0")
        if not 0.0 <= self.track < 1.0 or self.refractory < 0 or self.min_rel_shift < 0 or self.confirm < 1:
            raise ValueError("drift.track must be in [0, 1); refractory, min_rel_shift >= 0; confirm >= 1")


@dataclasses.dataclass(frozen=True)
class DriftEvent:
    """A detected change point."""

    signal: str
    direction: str  # "up" | "down"
    at: float  # time of the alarm (the caller's clock)
    index: int  # points seen by that detector since its last reset
    level_before: float
    level_recent: float
    score: float  # cumulative deviation at the alarm, in noise units


class SignalDetector:
    """Two-sided Page-Hinkley / CUSUM over one signal, with a robust warm-up."""

    def __init__(self, name: str, settings: DriftSettings) -> None:
        self.name = name
        self.settings = settings
        self.reset()

    def reset(self, *, refractory: bool = False) -> None:
        self._skip = self.settings.refractory if refractory else 0
        self._warm: list[float] = []
        self._mu = self._mu0 = math.nan
        self._sigma = math.nan
        self._n = 0
        self._sum_z = 0.0
        self._up = 0.0  # CUSUM: max(0, ...) sums; Page-Hinkley: m_t - min m (up), max m - m_t (down)
        self._down = 0.0
        self._m_up = 0.0
        self._m_up_min = 0.0
        self._m_down = 0.0
        self._m_down_max = 0.0
        self._recent: list[float] = []

    @property
    def warm(self) -> bool:
        return not math.isnan(self._mu)

    def update(self, x: float) -> tuple[str, float] | None:
        """Feed one point; returns (direction, score) on an alarm."""
        if not math.isfinite(x):
            return None
        s = self.settings
        if self._skip > 0:
            self._skip -= 1
            return None
        self._recent = (self._recent + [x])[-s.warmup:]
        if not self.warm:
            self._warm.append(x)
            if len(self._warm) >= s.warmup:
                arr = np.asarray(self._warm)
                self._mu = self._mu0 = float(np.median(arr))
                mad = float(np.median(np.abs(arr - self._mu))) * 1.4826
                self._sigma = max(mad, float(np.std(arr)) * 0.5, abs(self._mu) * s.min_rel_sigma, 1e-12)
            return None
        z = (x - self._mu) / self._sigma
        self._mu += s.track * (x - self._mu)
        self._n += 1
        if s.method == "cusum":
            self._up = max(0.0, self._up + z - s.delta)
            self._down = max(0.0, self._down - z - s.delta)
        else:
            # Page-Hinkley around the running mean of the standardised signal since warm-up.
            self._sum_z += z
            mean = self._sum_z / self._n
            self._m_up += z - mean - s.delta
            self._m_up_min = min(self._m_up_min, self._m_up)
            self._m_down += z - mean + s.delta
            self._m_down_max = max(self._m_down_max, self._m_down)
            self._up = self._m_up - self._m_up_min
            self._down = self._m_down_max - self._m_down
        hit = ("up", self._up) if self._up > s.threshold else ("down", self._down) if self._down > s.threshold else None
        if hit is not None and s.min_rel_shift > 0:
            moved = abs(float(np.median(self._recent[-s.confirm:])) - self._mu0)
            if moved < s.min_rel_shift * max(abs(self._mu0), 1e-12):
                return None  # statistically a change, too small to be a new regime: keep watching
        if hit is not None:
            self.reset(refractory=True)  # an alarm ends this regime: learn the new level before alarming again
        return hit

    @property
    def level(self) -> float:
        return self._mu

    @property
    def recent_level(self) -> float:
        return float(np.median(self._recent)) if self._recent else math.nan

    @property
    def points(self) -> int:
        return self._n


class DriftDetector:
    """One `SignalDetector` per workload signal; alarms on the first signal that changes."""

    def __init__(self, settings: DriftSettings, signals: tuple[str, ...] = SIGNALS) -> None:
        self.settings = settings
        self.detectors = {name: SignalDetector(name, settings) for name in signals}

    def update(self, signals: Mapping[str, float], now: float) -> DriftEvent | None:
        """Feed one observation of the signals (missing/NaN ones are skipped)."""
        event: DriftEvent | None = None
        for name, det in self.detectors.items():
            if name not in signals or signals[name] is None:
                continue
            hit = det.update(float(signals[name]))
            if hit is not None and event is None:
                direction, score = hit
                event = DriftEvent(name, direction, now, det.points, det.level, det.recent_level, score)
        if event is not None:
            log_event("drift", signal=event.signal, direction=event.direction, at=event.at,
                      level_before=event.level_before, level_recent=event.level_recent, score=event.score)
            for det in self.detectors.values():
                det.reset(refractory=True)
        return event

    def reset(self, names: tuple[str, ...] | None = None) -> None:
        """Re-learn the given signals (all by default)."""
        for name, det in self.detectors.items():
            if names is None or name in names:
                det.reset()


def workload_signals(frame: object, window_s: float, *, long_prompt_tokens: int = 2048) -> list[dict[str, float]]:
    """Per-window workload signals of a workload frame (twin / benchmark use; the live agent
    computes the same signals from KV events): reuse ratio (share of prompt blocks already seen
    earlier in the workload), mean prompt tokens, share of long prompts, arrival rate (req/s).
    Each dict also carries `t` (window start, seconds)."""
    import polars as pl

    f = frame if isinstance(frame, pl.DataFrame) else pl.DataFrame(frame)
    f = f.sort("timestamp_ms")
    flat = f["hash_ids"].explode()
    first = flat.is_first_distinct().cast(pl.Int64)
    lens = f["hash_ids"].list.len().to_numpy()
    offsets = np.concatenate([[0], np.cumsum(lens)]).astype(np.int64)
    cum = np.concatenate([[0], np.cumsum(first.to_numpy())])
    new_blocks = cum[offsets[1:]] - cum[offsets[:-1]]
    t = f["timestamp_ms"].to_numpy() / 1000.0
    t0 = float(t.min())
    win = ((t - t0) // window_s).astype(int)
    prompts = f["input_length"].to_numpy()
    out: list[dict[str, float]] = []
    for w in range(int(win.max()) + 1):
        m = win == w
        n = int(m.sum())
        if n == 0:
            out.append({"t": t0 + w * window_s, "arrival_rate": 0.0})
            continue
        blocks = float(lens[m].sum())
        out.append({
            "t": t0 + w * window_s,
            "reuse_ratio": 1.0 - float(new_blocks[m].sum()) / blocks if blocks else 0.0,
            "prompt_tokens_mean": float(prompts[m].mean()),
            "long_prompt_fraction": float((prompts[m] >= long_prompt_tokens).mean()),
            "arrival_rate": n / window_s,
        })
    return out
