"""A plan's cost is capped by settings, whatever rate or prompt length one pod claims: the fitted
workload replays at most `tuner.warm_start.max_requests` requests and `max_block_refs` block
references, and a capped workload says so (its note, logged by the planner's history)."""
from __future__ import annotations

import logging

import polars as pl
import pytest

from agent.runtime.paying_runtime import FittedHistory
from agent.runtime.workload_fit import ObservedWorkload, capped_workload, fitted_workload
from agent.settings import load_settings

pytestmark = pytest.mark.timeout(60)

MIX = ((1024.0, 2048.0, 0.5), (2048.0, 4096.0, 0.5))


def _refs(frame: pl.DataFrame) -> int:
    return int(frame["hash_ids"].list.len().sum())


@pytest.mark.parametrize("rate", [1e4, 1e6, 1e9])
def test_any_claimed_rate_replays_at_most_the_cap(rate):
    frame = fitted_workload(ObservedWorkload(rate, MIX, 0.5), duration_s=300, max_requests=2000, seed=3)
    assert 0 < frame.height <= 2000
    assert frame["input_length"].mean() == pytest.approx(2300, rel=0.25)  # still the observed mix


def test_a_claimed_huge_prompt_is_bounded_by_block_references():
    huge = ((1e12, float("inf"), 1.0),)  # a histogram bucket no model accepts
    frame, note = capped_workload(ObservedWorkload(50.0, huge, 0.9), duration_s=300, max_requests=2000,
                                  max_block_refs=20_000, seed=0)
    assert 0 < frame.height and _refs(frame) <= 20_000
    assert note is not None and "block references" in note


def test_an_honest_workload_is_not_capped_and_a_capped_one_says_so():
    honest, note = capped_workload(ObservedWorkload(4.0, MIX, 0.5), duration_s=300, max_requests=2000,
                                   max_block_refs=100_000, seed=0)
    assert note is None and 900 < honest.height < 1500
    capped, note = capped_workload(ObservedWorkload(1e9, MIX, 0.5), duration_s=300, max_requests=2000,
                                   max_block_refs=100_000, seed=0)
    assert capped.height <= 2000 and note is not None
    assert "capped" in note and "1e+09 req/s" in note and "2000 requests" in note


def test_the_settings_carry_both_caps():
    ws = load_settings(env={}).tuner.warm_start
    assert ws.max_requests == 2000 and ws.max_block_refs == 100_000
    assert load_settings(env={}, tuner={"warm_start": {"max_block_refs": 5000}}).tuner.warm_start.max_block_refs == 5000


class _Observed(FittedHistory):
    def observed(self, now: float) -> ObservedWorkload:
        return ObservedWorkload(1e9, MIX, 0.5)


def test_the_planner_history_logs_a_capped_plan(caplog):
    history = _Observed(None, None, lambda: 1000.0, window_s=300, max_requests=500, max_block_refs=50_000, seed=0)
    with caplog.at_level(logging.WARNING, logger="agent.runtime.paying_runtime"):
        frame = history.history(1000.0, 300.0)
    assert frame.height <= 500 and history.capped is not None
    assert any("plan workload capped" in r.getMessage() for r in caplog.records)
