"""bench/tuning.py's drift-detection figures: the detector's false alarms on stationary synthetic
workloads, its detection delay on the `shift` preset, and on Gaussian level shifts of 2/3/4 sigma
(Page-Hinkley and CUSUM)."""
from __future__ import annotations

import statistics
from typing import Any

import numpy as np

from agent.runtime.tuning.schema import defaults
from simulator.synthetic import synthetic
from tuners.drift import DriftDetector, DriftSettings, SignalDetector, workload_signals

# the detector measured bare: the schema's settings with a fixed level, no refractory period and no
# minimum shift (the agent's tracking and refractory are measured by bench/live_tuning.py)
BARE_DRIFT = {"track": 0.0, "refractory": 0, "min_rel_shift": 0.0}


def bare_drift(**kw: Any) -> DriftSettings:
    return defaults(DriftSettings, **{**BARE_DRIFT, **kw})


def drift_figures(seeds: int) -> None:
    print("\n== drift detection (Page-Hinkley, warm-up 20, delta 0.5, threshold 16 noise units) ==")
    windows = alarms = 0
    for preset in ("rag", "sessions", "short"):
        for seed in range(1, seeds + 1):
            sig = workload_signals(synthetic(preset, seed=seed, duration_s=1200.0), 10.0)
            det = DriftDetector(bare_drift())
            alarms += sum(1 for s in sig if det.update(s, s["t"]))
            windows += len(sig)
    print(f"stationary presets (rag, sessions, short; {seeds} seeds, 20 min, 10 s windows): "
          f"{alarms} false alarms in {windows} windows ({1000 * alarms / windows:.2f} per 1,000 windows)")
    delays = []
    for seed in range(1, seeds + 1):
        wl = synthetic("shift", seed=seed, duration_s=1200.0)
        sig = workload_signals(wl, 10.0)
        change = 600.0 + sig[0]["t"]
        det = DriftDetector(bare_drift())
        hits = [(e.at, e.signal) for s in sig if (e := det.update(s, s["t"]))]
        after = [h for h in hits if h[0] >= change]
        delays.append(after[0][0] - change if after else float("nan"))
        early = len(hits) - len(after)
        print(f"  shift preset seed {seed}: change at {change:.0f} s, alarm(s) {hits}, false before change: {early}")
    print(f"shift preset detection delay: mean {np.nanmean(delays):.1f} s (windows of 10 s), "
          f"max {np.nanmax(delays):.1f} s, missed {sum(np.isnan(delays))}/{len(delays)}")
    n, runs = 1000, 40
    for method in ("page_hinkley", "cusum"):
        fa = 0
        for s in range(runs):  # a detector re-learns after each alarm, so every alarm counts
            rng = np.random.default_rng(s)
            det1 = SignalDetector("x", bare_drift(method=method))
            fa += sum(1 for v in 0.5 + 0.03 * rng.standard_normal(n) if det1.update(float(v)))
        parts = []
        for k in (2, 3, 4):
            ds = []
            for s in range(runs):
                rng = np.random.default_rng(1000 + s)
                x = 0.5 + 0.03 * rng.standard_normal(300)
                x[100:] -= 0.03 * k
                det1 = SignalDetector("x", bare_drift(method=method))
                i = next((i for i, v in enumerate(x) if det1.update(float(v))), None)
                if i is not None and i >= 100:
                    ds.append(i - 100)
            parts.append(f"{k} sigma: {statistics.mean(ds):.1f} pts ({len(ds)}/{runs} found)")
        print(f"gaussian, {method}: {1000 * fa / (runs * n):.3f} false alarms per 1,000 points; delay "
              + "; ".join(parts))
