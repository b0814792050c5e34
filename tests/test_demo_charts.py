"""The demo report's charts: legends sit outside the plotted area (they never cover data), and the
optuna history labels whole trial numbers only."""
from __future__ import annotations

import pytest
from matplotlib.transforms import Bbox

from emulator.cluster.timeline import DemoEvent, Recorder, Served, TimelinePoint
from emulator.demo import report


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
    from tuners.stats import RegressionSettings, TtftObservations, judge

    header = scorecard_lines(score_phases(["p1"], {0: [1.0]}, {0: [1.0]}, {0: [1.0]}))[0]
    for col in ("TTFT p95 (ms): held / tuned / hindsight", "TTFT mean (ms): held / tuned / hindsight",
                "tuned vs held: p95; mean", "hindsight's gain captured: p95 / mean"):
        assert col in header, header
    assert header.count("|") <= 9, header  # eight columns, not fifteen
    same = TtftObservations(samples=tuple(0.5 + 0.001 * i for i in range(200)))
    verdict = judge(same, same, RegressionSettings(method="mannwhitney"))
    assert verdict.reason.startswith("TTFT p95 stayed at 0.689 s; the TTFTs as a whole are not significantly "
                                     "larger (one-sided Mann-Whitney p = 0.5, >= 0.05): not a regression"), verdict.reason
    slower = TtftObservations(samples=tuple(0.6 + 0.001 * i for i in range(200)))
    worse = judge(slower, same, RegressionSettings(method="mannwhitney"))
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
