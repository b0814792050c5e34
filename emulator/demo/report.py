"""The demo's report: `report.md` with three PNG charts and the per-phase verdict."""
from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
from matplotlib.ticker import MaxNLocator

from contracts.output_paths import replacing, write_output
from emulator.cluster.timeline import TIERS, DemoEvent, PhaseVerdict, Recorder, TimelinePoint
from simulator.capacity.curves import TierCurve
from simulator.capacity.plot import plot_curves
from simulator.capacity.table import curve_table

EVENT_STYLE = {
    "apply": ("tab:green", "-", "config applied"),
    "rollback": ("tab:red", "-", "rolled back"),
    "drift": ("tab:orange", "--", "drift detected"),
}
TIER_COLOURS = {"gpu": "tab:blue", "cpu": "tab:purple", "l2": "tab:brown", "cumulative": "black"}


def _legend_below(fig: plt.Figure, ax: plt.Axes, ncols: int) -> None:
    """The legend under the plot, outside the axes: it never covers a line."""
    handles, labels = ax.get_legend_handles_labels()
    if handles:
        fig.legend(handles, labels, loc="outside lower center", ncols=ncols, fontsize=9, frameon=False)


def _minutes(seconds: float) -> float:
    return seconds / 60.0


def _mark_events(ax: plt.Axes, events: Sequence[DemoEvent], phase_starts: Sequence[float]) -> None:
    seen: set[str] = set()
    for ev in events:
        style = EVENT_STYLE.get(ev.kind)
        if style is None:
            continue
        colour, ls, label = style
        ax.axvline(_minutes(ev.trace_s), color=colour, linestyle=ls, linewidth=1.4, alpha=0.85,
                   label=None if label in seen else label)
        seen.add(label)
    for i, start in enumerate(phase_starts[1:], start=1):
        ax.axvspan(_minutes(start), ax.get_xlim()[1], color="0.9", zorder=0,
                   label="shifted phase" if i == 1 else None)


def plot_ttft(points: Sequence[TimelinePoint], events: Sequence[DemoEvent], phase_starts: Sequence[float],
              path: Path) -> None:
    fig, ax = plt.subplots(figsize=(11, 5.4), dpi=110, layout="constrained")
    xs = [_minutes(p.trace_s) for p in points]
    ax.plot(xs, [p.stats.ttft_p95_s * 1000 for p in points], color="tab:blue", linewidth=2,
            label="TTFT p95 (fleet, sliding window)")
    agent = [(x, p.agent_ttft_p95_s * 1000) for x, p in zip(xs, points) if p.agent_ttft_p95_s is not None]
    if agent:
        ax.plot(*zip(*agent), color="tab:cyan", linewidth=1.2, linestyle=":",
                label="agent export: mean of per-pod p95 (from vLLM's histogram buckets)")
    if xs:
        ax.set_xlim(min(xs), max(xs))
    _mark_events(ax, events, phase_starts)
    ax.set_xlabel("emulated cluster time (minutes)")
    ax.set_ylabel("TTFT p95 (ms)")
    ax.set_ylim(bottom=0)
    ax.set_title("Time to first token, p95, with configuration changes and drift")
    ax.grid(alpha=0.3)
    _legend_below(fig, ax, ncols=2)
    with replacing(path) as tmp:
        fig.savefig(tmp)
    plt.close(fig)


def plot_hit_ratios(points: Sequence[TimelinePoint], events: Sequence[DemoEvent],
                    phase_starts: Sequence[float], path: Path) -> None:
    fig, ax = plt.subplots(figsize=(11, 5.4), dpi=110, layout="constrained")
    xs = [_minutes(p.trace_s) for p in points]
    for tier in TIERS:  # above the axes and unclipped: a tier at 0 stays a visible line
        ax.plot(xs, [p.stats.hit_ratio[tier] for p in points], color=TIER_COLOURS[tier], linewidth=1.6,
                label=f"{tier.upper()} hit ratio (of tokens reaching the tier)", zorder=4, clip_on=False)
    ax.plot(xs, [p.stats.cumulative_hit_ratio for p in points], color="black", linewidth=2.4,
            label="cumulative (share of prompt tokens from any tier)")
    if xs:
        ax.set_xlim(min(xs), max(xs))
    _mark_events(ax, events, phase_starts)
    ax.set_ylim(-0.03, 1.02)  # room below 0 so a line at 0 is not hidden by the x-axis
    ax.set_xlabel("emulated cluster time (minutes)")
    ax.set_ylabel("token hit ratio")
    ax.set_title("Per-tier KV-cache hit ratios (sliding window)")
    ax.grid(alpha=0.3)
    _legend_below(fig, ax, ncols=3)
    with replacing(path) as tmp:
        fig.savefig(tmp)
    plt.close(fig)


def label_levels(xs: Sequence[float], min_gap: float) -> list[int]:
    """A text row per label so that labels closer than `min_gap` stack instead of overlapping."""
    levels: list[int] = []
    for i, x in enumerate(xs):
        near = [levels[j] for j in range(i) if abs(x - xs[j]) < min_gap]
        levels.append(max(near) + 1 if near else 0)
    return levels


def plot_optuna_history(trials: Sequence[tuple[int, float | None, str]], path: Path,
                        baseline_s: float | None = None, marks: Sequence[tuple[int, str]] = ()) -> None:
    fig, ax = plt.subplots(figsize=(11, 5.4), dpi=110, layout="constrained")
    span = max([n for n, _v, _s in trials] + [n for n, _ in marks] + [1]) + 1
    for i, (n, label) in enumerate(marks):
        ax.axvline(n - 0.5, color="tab:orange", linestyle="--", linewidth=1.2,
                   label="new study (start, or drift)" if i == 0 else None)
    for (n, label), level in zip(marks, label_levels([n for n, _ in marks], span / 12), strict=True):
        ax.annotate(label, (n - 0.5, 1.0), xycoords=("data", "axes fraction"), xytext=(3, -12 - 11 * level),
                    textcoords="offset points", fontsize=8, color="tab:orange")
    colours = {"complete": "tab:blue", "rolled_back": "tab:red", "twin": "tab:gray"}
    for state, colour in colours.items():
        pts = [(n, v * 1000) for n, v, s in trials if s == state and v is not None and math.isfinite(v)]
        if pts:
            ax.scatter(*zip(*pts), color=colour, s=46, zorder=3, label={
                "complete": "live trial (kept or superseded)", "rolled_back": "live trial rolled back",
                "twin": "twin trial (warm start)"}[state])
    best, line = math.inf, []
    starts = sorted(n for n, _ in marks)
    for n, v, s in sorted(trials):
        if starts and n >= starts[0]:  # a new study: best-so-far starts over
            starts.pop(0)
            best = math.inf
        if v is not None and math.isfinite(v) and s in ("complete", "twin"):
            best = min(best, v * 1000)
        if math.isfinite(best):
            line.append((n, best))
    if line:
        ax.step(*zip(*line), where="post", color="black", linewidth=1.6, label="best so far")
    if baseline_s is not None and math.isfinite(baseline_s):  # from the shifted phase's study on only
        shift = sorted(n for n, _ in marks)[1] - 0.5 if len(marks) > 1 else -0.5
        ax.hlines(baseline_s * 1000, shift, span - 0.5, color="tab:green", linestyle=":",
                  label="default configuration on the shifted phase (twin replay)")
    if not trials:
        ax.text(0.5, 0.5, "no trials finished", ha="center", va="center", transform=ax.transAxes, fontsize=14)
    ax.set_xlabel("trial number")
    ax.set_ylabel("objective: TTFT p95 (ms)")
    finite = [v * 1000 for _, v, _ in trials if v is not None and math.isfinite(v)]
    if finite:  # keep outliers from flattening the interesting range
        ax.set_ylim(0, min(max(finite), 4 * sorted(finite)[len(finite) // 2]) * 1.08)
    ax.set_title("Optuna optimisation history")
    ax.grid(alpha=0.3)
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))  # trials are whole numbers
    _legend_below(fig, ax, ncols=3)
    with replacing(path) as tmp:
        fig.savefig(tmp)
    plt.close(fig)


def _fmt_ms(s: float) -> str:
    return "n/a" if not math.isfinite(s) else f"{s * 1000:.0f} ms"


def _fmt_ratio(r: float) -> str:
    return "n/a" if not math.isfinite(r) else f"{r:.3f}"


def verdict_lines(verdicts: Sequence[PhaseVerdict]) -> list[str]:
    """The verdict as a markdown table (also printed to the console)."""
    if not verdicts:
        return ["No verdict: the run stopped before a phase had requests to compare."]
    lines = [("| phase | requests | TTFT p95 default | TTFT p95 tuned | speed-up | cumulative hit default |"
             " cumulative hit tuned |"),
             "|---|---:|---:|---:|---:|---:|---:|"]
    for v in verdicts:
        lines.append(f"| {v.label} | {v.requests} | {_fmt_ms(v.default_ttft_p95_s)} | {_fmt_ms(v.tuned_ttft_p95_s)}"
                     f" | {v.ttft_speedup:.2f}x | {_fmt_ratio(v.default_hit_ratio)} | {_fmt_ratio(v.tuned_hit_ratio)} |")
    lines.append("")
    lines.append(f"Method: {verdicts[0].method}")
    return lines


def prediction_line(errors: Sequence[float]) -> str:
    """The twin's prediction error for the running configuration over the live windows."""
    if not errors:
        return "Twin prediction error: no live window was measured."
    mean = sum(errors) / len(errors)
    mae = sum(abs(e) for e in errors) / len(errors)
    return (f"Twin prediction error (TTFT p95 of the running configuration, twin vs measured, "
            f"`tierpilot_tuner_twin_prediction_error_ratio`): {len(errors)} live windows, mean {mean * 100:+.1f}%, "
            f"mean absolute {mae * 100:.1f}%, last {errors[-1] * 100:+.1f}%.")


def capacity_section(curves: Mapping[str, TierCurve], report_dir: Path, *, host_memory_gib: float) -> list[str]:
    """`## Capacity curves`: the CPU and L2 curves drawn, and as a table."""
    cap = {"cpu": host_memory_gib}
    plot_curves(curves, report_dir / "capacity_curves.png", tiers=("cpu", "l2"), cap_gib=cap)
    return ["## Capacity curves: what if the CPU buffer were N GiB", "",
            ("Hit ratio each tier would have had at each size, over every request served, at the final "
             "configuration (LRU tiers, from one pass over the block stream; the CPU buffer only sees what "
             "missed the GPU, so a buffer smaller than the GPU pool adds little). Dashed: the size in force."), "",
            "![Capacity curves](capacity_curves.png)", "", "```", *curve_table(curves, cap_gib=cap), "```", ""]


def write_report(report_dir: Path, recorder: Recorder, *, title_facts: dict[str, str],
                 phase_starts: Sequence[float], final_config: dict[str, object], partial: bool,
                 baseline_objective_s: float | None = None, sections: Sequence[str] = (),
                 headline: Sequence[str] = (), capacity_curves: Mapping[str, TierCurve] | None = None,
                 host_memory_gib: float = 0.0) -> Path:
    report_dir.mkdir(parents=True, exist_ok=True)
    points, events = list(recorder.timeline), list(recorder.events)
    plot_ttft(points, events, phase_starts, report_dir / "ttft_p95.png")
    plot_hit_ratios(points, events, phase_starts, report_dir / "hit_ratios.png")
    plot_optuna_history(recorder.trials, report_dir / "optuna_history.png", baseline_objective_s,
                        recorder.study_marks)
    out = ["# tierpilot demo report", ""]
    if partial:
        out += ["**Partial report: the demo was interrupted before the end.**", ""]
    out += [f"- {k}: {v}" for k, v in title_facts.items()]
    out += ["", "## Verdict: did tuning pay for itself?", ""] + list(headline or ["No scorecard."])
    out += ["", "### End-configuration replay", "",
            ("Not the verdict: what the configuration in force at the end of each phase gives from a cold start, "
            "without the cost of getting there."), ""] + verdict_lines(recorder.verdicts)
    out += ["", "## Final configuration", "", "```yaml"]
    out += [f"{k}: {v}" for k, v in final_config.items()] + ["```", ""]
    out += ["## Charts", "", "![TTFT p95 over time](ttft_p95.png)", "",
            "![Per-tier hit ratios over time](hit_ratios.png)", "", "![Optuna history](optuna_history.png)", ""]
    if capacity_curves:
        out += capacity_section(capacity_curves, report_dir, host_memory_gib=host_memory_gib)
    if sections:  # e.g. `## Agent accuracy`
        out += [*sections, ""]
    out += ["## Tuner and agent events", "", "| cluster time | kind | event |", "|---:|---|---|"]
    for ev in events:
        out.append(f"| {ev.trace_s / 60:.1f} min | {ev.kind} | {ev.message.replace('|', '/')} |")
    path = report_dir / "report.md"
    write_output(path, "\n".join(out) + "\n")
    return path
