"""`tierpilot replay --plot`: per-tier hit ratio and TTFT over trace time, as one PNG."""
from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

import matplotlib
import matplotlib.ticker

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import polars as pl

from contracts.output_paths import replacing
from simulator.capacity.curves import TierCurve
from simulator.capacity.plot import draw_curves
from simulator.replay import ReplayResult

_COLORS = {"gpu": "#2b7bba", "cpu": "#e08214", "l2": "#4daf4a", "all": "#333333"}


def plot_replay(result: ReplayResult, path: str | Path, *, title: str = "",
                curves: Mapping[str, TierCurve] | None = None, cap_gib: Mapping[str, float] | None = None) -> Path:
    """Draw hit ratios (top) and TTFT p50/p95 (middle) per time bucket, and with `curves` the
    hit ratio versus capacity of the CPU and L2 tiers (bottom); return the path."""
    tl = result.timeline()
    minutes = (tl["time_s"] / 60.0).to_list()
    if curves:
        fig = plt.figure(figsize=(11, 10.5), constrained_layout=True)
        grid = fig.add_gridspec(3, 2, height_ratios=(1, 1, 0.95))
        ax1 = fig.add_subplot(grid[0, :])
        ax2 = fig.add_subplot(grid[1, :], sharex=ax1)
        draw_curves([fig.add_subplot(grid[2, 0]), fig.add_subplot(grid[2, 1])], curves, ("cpu", "l2"),
                    cap_gib=cap_gib)
    else:
        fig, (ax1, ax2) = plt.subplots(2, 1, figsize=(11, 7), sharex=True, constrained_layout=True)
    for tier in ("gpu", "cpu", "l2"):
        col = tl[f"{tier}_hit_ratio"]
        if col.null_count() < len(col):  # the tier is enabled
            never = not (col.fill_null(0.0) > 0).any()
            # zorder above the axes and no clipping: a tier that never hits is a visible line at 0
            ax1.plot(minutes, col.to_list(), label=f"{tier.upper()} hits / tokens reaching it"
                     + (" (0 throughout)" if never else ""), color=_COLORS[tier], lw=2.4 if never else 1.6,
                     zorder=4, clip_on=False)
    ax1.plot(minutes, tl["hit_ratio"].to_list(), label="all tiers: hits / prompt tokens", color=_COLORS["all"],
             lw=2.2, ls="--")
    ax1.set_ylim(-0.04, 1.02)  # room below 0 so a line at 0 is not hidden by the x-axis
    ax1.set_ylabel("token hit ratio")
    ax1.grid(alpha=0.3)
    phases = result.requests.group_by("phase").agg(pl.col("time_s").min()).sort("phase")
    for i, start in enumerate(phases["time_s"].to_list()[1:]):
        for ax in (ax1, ax2):  # named in ax1's legend, never written over the data
            ax.axvline(start / 60.0, color="red", ls=":", lw=1.2, label="phase change" if ax is ax1 and i == 0 else None)
    ax1.legend(loc="lower left", bbox_to_anchor=(0.0, 1.0), fontsize=9, ncols=3, frameon=False)
    ax2.plot(minutes, tl["ttft_p50_s"].to_list(), label="TTFT p50", color="#7b3294", lw=1.6)
    ax2.plot(minutes, tl["ttft_p95_s"].to_list(), label="TTFT p95", color="#c2a5cf", lw=1.6)
    ax2.set_yscale("log")
    ax2.yaxis.set_major_locator(matplotlib.ticker.LogLocator(subs=(1.0, 2.0, 5.0)))
    ax2.yaxis.set_major_formatter(matplotlib.ticker.FuncFormatter(lambda v, _: f"{v:g}"))
    ax2.yaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())
    ax2.set_ylabel("TTFT (s, log scale)")
    ax2.set_xlabel("trace time (minutes)")
    ax2.grid(alpha=0.3, which="both")
    ax2.legend(loc="lower left", bbox_to_anchor=(0.0, 1.0), fontsize=9, ncols=2, frameon=False)
    s = result.summary()
    k = result.knobs
    fig.suptitle(
        title or f"{s['requests']:,} requests on {result.cluster.pods} pods: hit ratio {s['hit_ratio']:.3f}, "
        f"TTFT p50 {s['ttft_p50_s']:.3g} s / p95 {s['ttft_p95_s']:.3g} s\n"
        f"chunk {k.chunk_tokens}, router {k.router}, CPU {k.cpu_eviction}, L2 {k.l2_eviction}",
        fontsize=11,
    )
    out = Path(path)
    with replacing(out) as tmp:
        fig.savefig(tmp, dpi=110)
    plt.close(fig)
    return out
