"""Wall-clock steps (NTP corrections, `date -s`, a resumed VM) change neither rates nor windows:
the agent's data clock advances with the monotonic clock (agent/runtime/clock.py)."""
from __future__ import annotations

import pytest

from agent.collect.discovery import StaticTargets
from agent.runtime.app import Agent
from agent.runtime.clock import SteadyWallClock
from agent.settings import load_settings
from contracts.tier_model import Target
from tests.support.fake_targets import MetricsServer
from tests.support.runtime_fakes import FakeVllm


def request_rates(jump_s: float, steady: bool) -> list[float | None]:
    wall, mono = [1_800_000_000.0], [100.0]
    clock = SteadyWallClock(lambda: wall[0], lambda: mono[0]) if steady else (lambda: wall[0])
    pod = FakeVllm()
    with MetricsServer() as srv:
        url = srv.route("/metrics", text=pod.text())
        agent = Agent(load_settings(env={}, scrape={"interval_s": 15}), StaticTargets([Target(url, "vllm", "v")]),
                      clock=clock)
        rates = []
        for step in range(6):
            pod.serve(20)  # 20 requests per 15 s: 1.33/s
            srv.route("/metrics", text=pod.text())
            mono[0] += 15
            wall[0] += 15 + (jump_s if step == 3 else 0)
            snap = agent.scrape_now()
            rates.append(next(p.request_rate for p in snap.pods if p.pod == "v"))
        return rates


@pytest.mark.parametrize("jump_s", [2 * 3600.0, -86_400.0])
def test_a_wall_clock_step_leaves_rates_alone(jump_s):
    rates = request_rates(jump_s, steady=True)
    assert rates[1:] == pytest.approx([20 / 15] * 5, rel=1e-6)


def test_the_plain_wall_clock_would_have_misread_the_rate():
    # what the agent did before: +2 h between two scrapes read 1.33/s as ~0.0028/s
    rates = request_rates(2 * 3600.0, steady=False)
    assert any(r is None or r < 0.1 * 20 / 15 for r in rates[4:]), rates


def test_steady_clock_starts_at_wall_time_and_follows_monotonic():
    wall, mono = [1000.0], [5.0]
    c = SteadyWallClock(lambda: wall[0], lambda: mono[0])
    assert c() == 1000.0
    wall[0] += 7200
    mono[0] += 1
    assert c() == 1001.0
