"""The real-engine demo's charts, like the emulated demo's: TTFT and the client's hit ratio of both
passes over the stream, with the shifted phase shaded and every configuration change marked."""
from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import numpy as np

from contracts.output_paths import replacing
from emulator.engines.client import Completion

PASS_COLOURS = {"tuned": "tab:blue", "held": "tab:gray"}
BIN_S = 10.0  # requests are grouped by the second they were sent, in windows this long


def windowed(completions: Sequence[Completion], window_s: float = BIN_S) -> dict[str, np.ndarray]:
    """Per window of sending time (those with a request): its middle (s), TTFT p95 and mean (ms),
    and cached / prompt tokens at the client. Pure."""
    ok = [c for c in completions if c.ok]
    if not ok:
        return {k: np.empty(0) for k in ("t", "p95_ms", "mean_ms", "hit")}
    sent = np.asarray([c.sent_s for c in ok])
    lat = np.asarray([c.latency_s for c in ok]) * 1000
    prompt = np.asarray([c.prompt_tokens for c in ok], float)
    cached = np.asarray([c.cached_tokens or 0 for c in ok], float)
    idx = np.floor(sent / window_s).astype(int)
    out: dict[str, list[float]] = {"t": [], "p95_ms": [], "mean_ms": [], "hit": []}
    for w in np.unique(idx):
        m = idx == w
        out["t"].append((w + 0.5) * window_s)
        out["p95_ms"].append(float(np.quantile(lat[m], 0.95)))
        out["mean_ms"].append(float(lat[m].mean()))
        out["hit"].append(float(cached[m].sum() / prompt[m].sum()) if prompt[m].sum() else float("nan"))
    return {k: np.asarray(v) for k, v in out.items()}


def _marks(ax: plt.Axes, phase_starts: Sequence[float], changes: Sequence[float], end_s: float) -> None:
    for i, start in enumerate(phase_starts[1:], start=1):
        ax.axvspan(start, end_s, color="0.92", zorder=0, label="shifted phase" if i == 1 else None)
    for i, t in enumerate(changes):
        ax.axvline(t, color="tab:green", linewidth=1.4, label="configuration changed (tuned fleet)" if i == 0 else None)


def _finish(fig: plt.Figure, ax: plt.Axes, path: Path, ncols: int) -> None:
    handles, labels = ax.get_legend_handles_labels()
    if handles:
        fig.legend(handles, labels, loc="outside lower center", ncols=ncols, fontsize=9, frameon=False)
    ax.grid(alpha=0.3)
    with replacing(path) as tmp:
        fig.savefig(tmp)
    plt.close(fig)


def plot_engine_ttft(passes: dict[str, Sequence[Completion]], phase_starts: Sequence[float],
                     changes: Sequence[float], end_s: float, path: Path) -> None:
    fig, ax = plt.subplots(figsize=(11, 5.4), dpi=110, layout="constrained")
    for name, comps in passes.items():
        w = windowed(comps)
        colour = PASS_COLOURS.get(name, "tab:orange")
        ax.plot(w["t"], w["p95_ms"], color=colour, linewidth=2, label=f"{name}: TTFT p95")
        ax.plot(w["t"], w["mean_ms"], color=colour, linewidth=1.2, linestyle=":", label=f"{name}: TTFT mean")
    ax.set_xlim(0, end_s)
    _marks(ax, phase_starts, changes, end_s)
    ax.set_ylim(bottom=0)
    ax.set_xlabel(f"seconds into the stream (windows of {BIN_S:g} s by sending time)")
    ax.set_ylabel("TTFT at the client (ms)")
    ax.set_title("Time to first token of both passes, request by request as the client saw it")
    _finish(fig, ax, path, ncols=3)


def plot_engine_hit_ratios(passes: dict[str, Sequence[Completion]], phase_starts: Sequence[float],
                           changes: Sequence[float], end_s: float, path: Path) -> None:
    fig, ax = plt.subplots(figsize=(11, 5.4), dpi=110, layout="constrained")
    for name, comps in passes.items():
        w = windowed(comps)
        ax.plot(w["t"], w["hit"], color=PASS_COLOURS.get(name, "tab:orange"), linewidth=2, clip_on=False,
                label=f"{name}: cached / prompt tokens at the client")
    ax.set_xlim(0, end_s)
    _marks(ax, phase_starts, changes, end_s)
    ax.set_ylim(-0.02, 1.02)  # a ratio at 0 stays visible above the axis
    ax.set_xlabel(f"seconds into the stream (windows of {BIN_S:g} s by sending time)")
    ax.set_ylabel("GPU prefix-cache hit ratio (tokens)")
    ax.set_title("Prefix-cache hits of both passes (vLLM's cached_tokens per request)")
    _finish(fig, ax, path, ncols=2)


__all__ = ["plot_engine_hit_ratios", "plot_engine_ttft", "windowed"]
