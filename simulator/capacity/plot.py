"""Capacity curves drawn with matplotlib: hit ratio against GiB per tier, the size in force marked."""
from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import numpy as np

from contracts.output_paths import replacing
from simulator.capacity.curves import TierCurve

COLORS = {"gpu": "#2b7bba", "cpu": "#e08214", "l2": "#4daf4a"}
LABELS = {"gpu": "GPU (GiB per pod)", "cpu": "CPU buffer (GiB per pod)", "l2": "L2 pool (GiB, fleet)"}


def draw_curves(axes: Sequence[plt.Axes], curves: Mapping[str, TierCurve], tiers: Sequence[str], *,
                cap_gib: Mapping[str, float] | None = None,
                candidates: Mapping[str, Sequence[float]] | None = None) -> None:
    """One axis per tier: the hit ratio at every size from 0 to the useful maximum (or the cap)."""
    caps, cands = cap_gib or {}, candidates or {}
    for ax, tier in zip(axes, tiers, strict=True):
        curve = curves[tier]
        top = max(curve.max_useful_gib * 1.15, curve.current_gib * 1.2, 1.0)
        if tier in caps:
            top = min(top, caps[tier]) if caps[tier] > 0 else top
        xs = np.linspace(0.0, top, 200)
        ax.plot(xs, [curve.hit_ratio(x) for x in xs], color=COLORS[tier], lw=1.8)
        now = curve.current_gib
        ax.axvline(now, color="#555555", ls="--", lw=1.0)
        right = now > 0.55 * top  # the label goes on the side with room, never past the axes
        ax.annotate(f"now {now:g} GiB: {curve.hit_ratio(now):.3f}", (now, curve.hit_ratio(now)),
                    xytext=(-4 if right else 4, 8), textcoords="offset points", fontsize=8,
                    ha="right" if right else "left")
        for g in cands.get(tier, ()):
            ax.plot([g], [curve.hit_ratio(g)], "o", color="black", ms=4)
            ax.annotate(f"{g:g}", (g, curve.hit_ratio(g)), xytext=(3, -12), textcoords="offset points", fontsize=7)
        ax.set_xlabel(LABELS[tier])
        ax.set_ylabel("hit ratio (hits / tokens reaching it)")
        ax.set_ylim(-0.02, max(0.05, min(1.0, max(curve.hit_ratio(top), curve.hit_ratio(now)) * 1.25 + 0.01)))
        ax.set_xlim(0, top)
        ax.grid(alpha=0.3)
        ax.set_title(f"{tier.upper()}: what if it held N GiB" + (" (sampled)" if curve.sample_rate < 1 else ""),
                     fontsize=10)


def plot_curves(curves: Mapping[str, TierCurve], path: str | Path, *, tiers: Sequence[str] = ("cpu", "l2", "gpu"),
                cap_gib: Mapping[str, float] | None = None,
                candidates: Mapping[str, Sequence[float]] | None = None, title: str = "") -> Path:
    """One PNG with a panel per tier; returns the path."""
    tiers = [t for t in tiers if t in curves]
    fig, axes = plt.subplots(1, len(tiers), figsize=(4.2 * len(tiers), 3.6), constrained_layout=True, squeeze=False)
    draw_curves(list(axes[0]), curves, tiers, cap_gib=cap_gib, candidates=candidates)
    fig.suptitle(title or "Hit ratio versus capacity over the whole run (LRU; dashed: the size in force)",
                 fontsize=11)
    out = Path(path)
    with replacing(out) as tmp:
        fig.savefig(tmp, dpi=110)
    plt.close(fig)
    return out
