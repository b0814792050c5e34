"""The honest measure's arithmetic on hand-made series (tuners/payoff.py)."""
from __future__ import annotations

import math

import pytest

from tuners.payoff import (
    WHOLE_RUN,
    ActionCounts,
    TtftSummary,
    answer_line,
    captured_gain,
    score_phases,
    scorecard_lines,
)


def test_summary_of_a_hand_made_series() -> None:
    s = TtftSummary.of([0.1, 0.2, 0.3, 0.4, 1.0])
    assert s.requests == 5
    assert s.p50_s == pytest.approx(0.3)
    assert s.mean_s == pytest.approx(0.4)
    assert s.p95_s == pytest.approx(0.4 + 0.8 * 0.6)  # linear interpolation between 0.4 and 1.0
    empty = TtftSummary.of([])
    assert empty.requests == 0 and math.isnan(empty.p95_s)


@pytest.mark.parametrize(("held", "tuned", "hindsight", "gain"), [
    (1.0, 0.8, 0.6, 0.5),      # half of the room captured
    (1.0, 0.6, 0.6, 1.0),      # all of it
    (1.0, 1.0, 0.6, 0.0),      # nothing
    (1.0, 1.2, 0.6, -0.5),     # the tuner made it worse
    (1.0, 0.5, 0.6, 1.25),     # luckier than the static ceiling (a dynamic change can beat it)
])
def test_captured_gain(held: float, tuned: float, hindsight: float, gain: float) -> None:
    assert captured_gain(held, tuned, hindsight) == pytest.approx(gain)


def test_no_room_means_no_gain_to_capture() -> None:
    assert math.isnan(captured_gain(1.0, 0.9, 1.0))
    assert math.isnan(captured_gain(1.0, 0.9, 1.1))
    assert math.isnan(captured_gain(math.nan, 0.9, 0.8))


def test_phases_and_whole_run_pool_the_requests() -> None:
    held = {0: [1.0] * 10, 1: [2.0] * 10}
    tuned = {0: [1.0] * 10, 1: [1.0] * 10}
    hindsight = {0: [0.5] * 10, 1: [1.0] * 10}
    acts = {0: ActionCounts(applies=1, true_alarms=0), 1: ActionCounts(restarts=1, applies=2, rollbacks=1,
                                                                      true_alarms=1)}
    scores = score_phases(["p1", "p2"], held, tuned, hindsight, acts)
    assert [s.label for s in scores] == ["p1", "p2", WHOLE_RUN]
    p1, p2, whole = scores
    assert p1.gain_mean == pytest.approx(0.0) and p1.speedup_mean == pytest.approx(1.0)
    assert p2.gain_mean == pytest.approx(1.0) and p2.speedup_mean == pytest.approx(2.0)
    # whole run: held mean 1.5, tuned 1.0, hindsight 0.75 -> 0.5 / 0.75
    assert whole.held.mean_s == pytest.approx(1.5) and whole.tuned.mean_s == pytest.approx(1.0)
    assert whole.gain_mean == pytest.approx(0.5 / 0.75)
    assert whole.tuned.requests == 20
    assert whole.actions == ActionCounts(restarts=1, applies=3, rollbacks=1, true_alarms=1)
    lines = scorecard_lines(scores)
    assert len(lines) == 2 + 3 and "**whole run**" in lines[-1] and "67%" in lines[-1]
    assert "| 1,500 / 1,000 / 750 |" in lines[-1] and "| 1.50x faster |" not in lines[-1]
    assert "; 1.50x faster |" in lines[-1] and "+" not in "".join(lines)  # faster is a ratio > 1, labelled
    answer = answer_line(scores)
    assert answer.startswith("Yes: over the whole run, against the defaults held, tuned TTFT p95 was ")
    assert "the mean 1.50x faster" in answer
    assert "67% (mean) of what hindsight could" in answer and "1 rolling restart and 3 configuration changes (1 " \
        "rolled back)" in answer, answer


def test_the_answer_says_no_change_when_nothing_was_applied() -> None:
    scores = score_phases(["p1"], {0: [1.0, 1.1]}, {0: [1.0, 1.1]}, {0: [0.9, 1.0]})
    assert answer_line(scores).startswith("No change: over the whole run, against the defaults held, tuned TTFT p95 "
                                          "was unchanged and the mean unchanged")
    slower = score_phases(["p1"], {0: [1.0] * 5}, {0: [1.3] * 5}, {0: [1.0] * 5}, {0: ActionCounts(applies=1)})
    assert answer_line(slower).startswith("No: over the whole run, against the defaults held, tuned TTFT p95 was "
                                          "1.30x slower")


def test_phase_without_requests_is_left_out() -> None:
    scores = score_phases(["p1", "p2"], {0: [1.0]}, {0: [1.0]}, {0: [1.0]})
    assert [s.label for s in scores] == ["p1", WHOLE_RUN]
