"""The demo report's charts: legends sit outside the plotted area (they never cover data), and the
optuna history labels whole trial numbers only."""
from __future__ import annotations

import pytest
from matplotlib.transforms import Bbox

from emulator.cluster.timeline import DemoEvent, Recorder, Served, TimelinePoint
from emulator.demo import report
from tests.support.tuner_settings import regression_settings


@pytest.fixture
def figures(monkeypatch):
    kept = []
    close = report.plt.close
    monkeypatch.setattr(report.plt, "close", lambda fig: kept.append(fig))
    yield kept
    for fig in kept:
        close(fig)


def _timeline():
    rec = Recorder()
    for i in range(40):
        rec.add_served(Served(i * 10, "vllm-0", 1000, 400 + 10 * i, 100, 100, 0.2 + 0.01 * i, phase=int(i >= 20)))
        rec.add_point(TimelinePoint(i, i * 10.0, int(i >= 20), rec.window(i * 10.0), agent_ttft_p95_s=0.25))
    events = [DemoEvent(5, 50.0, "apply", "chunk"), DemoEvent(12, 220.0, "drift", "x"),
              DemoEvent(15, 300.0, "rollback", "y")]
    return list(rec.timeline), events


def _legend_clear_of_axes(fig) -> None:
    fig.canvas.draw()
    legends = fig.legends + [a.get_legend() for a in fig.axes if a.get_legend() is not None]
    assert legends
    renderer = fig.canvas.get_renderer()
    for legend in legends:
        box = legend.get_window_extent(renderer)
        for ax in fig.axes:
            assert not Bbox.intersection(box, ax.get_window_extent(renderer)), "legend over the plot"


def test_ttft_and_hit_ratio_legends_do_not_cover_data(figures, tmp_path):
    points, events = _timeline()
    report.plot_ttft(points, events, [0.0, 200.0], tmp_path / "ttft_p95.png")
    report.plot_hit_ratios(points, events, [0.0, 200.0], tmp_path / "hit_ratios.png")
    assert len(figures) == 2
    for fig in figures:
        _legend_clear_of_axes(fig)


def test_optuna_history_has_whole_trial_ticks(figures, tmp_path):
    trials = [(n, 0.3 + 0.01 * n, "twin" if n < 5 else "complete") for n in range(9)]
    report.plot_optuna_history(trials, tmp_path / "optuna_history.png", 0.4, marks=[(0, "study 0"), (5, "study 1")])
    fig = figures[0]
    fig.canvas.draw()
    ticks = [t for t in fig.axes[0].get_xticks() if fig.axes[0].get_xlim()[0] <= t <= fig.axes[0].get_xlim()[1]]
    assert ticks and all(float(t).is_integer() for t in ticks), ticks
    _legend_clear_of_axes(fig)


def test_verdict_table_has_units_and_a_trial_verdict_reads_as_a_sentence():
    from tuners.payoff import score_phases, scorecard_lines
    from tuners.stats import TtftObservations, judge

    header = scorecard_lines(score_phases(["p1"], {0: [1.0]}, {0: [1.0]}, {0: [1.0]}))[0]
    for col in ("TTFT p95 (ms): held / tuned / hindsight", "TTFT mean (ms): held / tuned / hindsight",
                "tuned vs held: p95; mean", "hindsight's gain captured: p95 / mean"):
        assert col in header, header
    assert header.count("|") <= 9, header  # eight columns, not fifteen
    same = TtftObservations(samples=tuple(0.5 + 0.001 * i for i in range(200)))
    verdict = judge(same, same, regression_settings(method="mannwhitney"))
    assert verdict.reason.startswith("TTFT p95 stayed at 0.689 s; the TTFTs as a whole are not significantly "
                                     "larger (one-sided Mann-Whitney p = 0.5, >= 0.05): not a regression"), verdict.reason
    slower = TtftObservations(samples=tuple(0.6 + 0.001 * i for i in range(200)))
    worse = judge(slower, same, regression_settings(method="mannwhitney"))
    assert worse.worse and worse.reason.startswith("TTFT p95 rose from 0.689 s to 0.789 s; the TTFTs as a whole are "
                                                   "larger (one-sided Mann-Whitney p = "), worse.reason
    assert worse.reason.endswith(": a regression")
    assert "p=0.9" not in verdict.reason and "alpha" not in verdict.reason


def test_tune_says_why_the_cpu_tier_scores_no_hits_when_it_drops_it():
    from click.testing import CliRunner

    from agent.cli import main
    from contracts.knobs import DEFAULT_KNOBS
    from simulator.cluster import ClusterSpec
    from tuners.cli import cpu_tier_note

    cluster = ClusterSpec(pods=2)
    caps = cluster.capacities(DEFAULT_KNOBS)
    assert caps.cpu_tokens < caps.gpu_tokens  # LMCache's 5 GiB default against the profile's GPU pool
    note = cpu_tier_note(DEFAULT_KNOBS.replace(cpu_gib=0.0), DEFAULT_KNOBS, cluster)
    assert note and f"{caps.cpu_tokens:,} tokens per pod" in note and "write-through" in note
    assert cpu_tier_note(DEFAULT_KNOBS, DEFAULT_KNOBS, cluster) is None  # kept: nothing to explain
    big = ClusterSpec(pods=2, gpu_tokens=caps.cpu_tokens // 2)
    assert cpu_tier_note(DEFAULT_KNOBS.replace(cpu_gib=0.0), DEFAULT_KNOBS, big) is None
    # the claim holds in the twin: with the defaults the CPU tier serves no token
    import json
    out = CliRunner().invoke(main, ["replay", "--pods", "2", "--duration", "120", "--rate", "4", "--format", "json"])
    assert json.loads(out.output)["tiers"]["cpu"]["hit_tokens"] == 0


def _keep_figures(monkeypatch, module) -> list:
    kept: list = []
    monkeypatch.setattr(module.plt, "close", lambda fig: kept.append(fig))
    return kept


def test_replay_legend_fits_and_the_phase_change_is_named_in_it_not_on_the_data(monkeypatch, tmp_path):
    from contracts.knobs import Knobs
    from simulator import plot as replay_plot
    from simulator.cluster import ClusterSpec
    from simulator.replay import replay
    from simulator.synthetic import generate, preset_phases

    kept = _keep_figures(monkeypatch, replay_plot)
    result = replay(generate(preset_phases("shift", duration_s=240.0), seed=1), ClusterSpec(pods=2), Knobs())
    replay_plot.plot_replay(result, tmp_path / "replay.png")
    fig = kept[0]
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    whole = fig.bbox
    for ax in fig.axes:
        legend = ax.get_legend()
        if legend is not None:  # the whole legend on the canvas, not cut at the right edge
            box = legend.get_window_extent(renderer)
            assert box.x0 >= whole.x0 and box.x1 <= whole.x1, (box, whole)
        assert not any("phase change" in t.get_text() for t in ax.texts)
    labels = fig.axes[0].get_legend_handles_labels()[1]
    assert "phase change" in labels, labels
    replay_plot.plt.close(fig)


def test_capacity_annotation_stays_inside_its_axes(monkeypatch, tmp_path):
    from contracts.knobs import Knobs
    from simulator.capacity import plot as curve_plot
    from simulator.capacity.curves import tier_curves
    from simulator.cluster import ClusterSpec
    from simulator.synthetic import generate, preset_phases

    kept = _keep_figures(monkeypatch, curve_plot)
    curves = tier_curves(generate(preset_phases("shift", duration_s=240.0), seed=1), ClusterSpec(pods=2), Knobs())
    curve_plot.plot_curves(curves, tmp_path / "curves.png", cap_gib={"cpu": 32.0})
    fig = kept[0]
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    for ax in fig.axes:
        inside = ax.get_window_extent(renderer)
        for text in ax.texts:
            box = text.get_window_extent(renderer)
            assert inside.x0 <= box.x0 and box.x1 <= inside.x1, (text.get_text(), box, inside)
    curve_plot.plt.close(fig)


def test_optuna_study_labels_do_not_overlap_and_the_shifted_default_starts_at_the_shift(figures, tmp_path):
    trials = [(i, 0.5, "twin") for i in range(24)] + [(i, 0.4, "twin") for i in range(26, 40)]
    report.plot_optuna_history(trials, tmp_path / "h.png", baseline_s=0.55,
                               marks=[(0, "study 0"), (25, "study 1"), (26, "study 2")])
    fig = figures[0]
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    ax = fig.axes[0]
    boxes = [t.get_window_extent(renderer) for t in ax.texts if t.get_text().startswith("study")]
    assert len(boxes) == 3
    for i, a in enumerate(boxes):
        for b in boxes[i + 1:]:
            assert not Bbox.intersection(a, b), "study labels overlap"
    (default,) = [c for c in ax.collections if c.get_label().startswith("default configuration")]
    (segment,) = default.get_segments()
    assert segment[0][0] == 24.5 and segment[0][1] == 550.0  # from the shifted phase's study on


def test_hit_ratio_chart_shows_a_tier_at_zero(figures, tmp_path):
    points, events = _timeline()
    report.plot_hit_ratios(points, events, [0.0, 200.0], tmp_path / "hit_ratios.png")
    ax = figures[0].axes[0]
    assert ax.get_ylim()[0] < 0
    cpu = next(line for line in ax.get_lines() if line.get_label().startswith("CPU"))
    assert not cpu.get_clip_on() and cpu.get_zorder() > 2
