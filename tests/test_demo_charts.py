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
    for col in ("TTFT p95 held (ms)", "TTFT mean tuned (ms)", "p95 / mean (x)", "captured gain p95 / mean (%)"):
        assert col in header, header
    same = TtftObservations(samples=tuple(0.5 + 0.001 * i for i in range(200)))
    verdict = judge(same, same, RegressionSettings(method="mannwhitney"))
    assert verdict.reason.startswith("TTFT p95 stayed at 0.689 s; no evidence of a regression (a one-sided "
                                     "Mann-Whitney test gives p = "), verdict.reason
    assert "p=0.9" not in verdict.reason and "alpha" not in verdict.reason
