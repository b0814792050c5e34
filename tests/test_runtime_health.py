"""/healthz and /readyz: the pure verdict, and a real agent whose scheduler is stalled."""
from __future__ import annotations

import asyncio
import json
import time
import urllib.error
import urllib.request

from agent.collect.discovery import StaticTargets
from agent.runtime.app import Agent
from agent.runtime.health import judge, stale_after_s
from agent.settings import load_settings


def _get(url: str) -> tuple[int, dict]:
    try:
        with urllib.request.urlopen(url, timeout=5) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def _wait_for(pred, timeout: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if pred():
            return True
        time.sleep(0.05)
    return False


def test_verdict():
    base = {"interval_s": 10.0, "cycles": 0, "scheduler_running": True}
    h = judge(now=5, started_at=0, last_cycle_at=None, **base)
    assert h.live and not h.ready and "first scrape" in h.reason
    h = judge(now=31, started_at=0, last_cycle_at=None, **base)
    assert not h.live and "no scrape cycle completed" in h.reason
    h = judge(now=100, started_at=0, last_cycle_at=80, **{**base, "cycles": 9})
    assert h.live and h.ready and h.last_cycle_age_s == 20
    h = judge(now=111, started_at=0, last_cycle_at=80, **{**base, "cycles": 9})
    assert not h.live and not h.ready and "31.0s since the last completed scrape cycle (limit 30s)" in h.reason
    h = judge(now=81, started_at=0, last_cycle_at=80, **{**base, "scheduler_running": False})
    assert not h.live and h.reason == "scheduler not running"
    assert judge(now=1, started_at=None, last_cycle_at=None, **base).live is False
    assert stale_after_s(0.01) == 1.0


def _agent() -> Agent:
    settings = load_settings(server={"host": "127.0.0.1", "port": 0}, scrape={"interval_s": 0.2}, env={})
    return Agent(settings, StaticTargets([]))


def test_healthz_fails_when_the_scheduler_is_paused_and_readyz_waits_for_a_cycle():
    agent = _agent()
    agent.start()
    try:
        base = agent.url.removesuffix("/metrics")
        assert _wait_for(lambda: _get(base + "/readyz")[0] == 200)
        status, body = _get(base + "/healthz")
        assert status == 200 and body["ok"] and body["cycles"] >= 1
        agent._scheduler.pause()  # stall: no job runs any more
        assert _wait_for(lambda: _get(base + "/healthz")[0] == 503)
        status, body = _get(base + "/healthz")
        assert body["ok"] is False and body["reason"] == "scheduler not running"
        assert _get(base + "/readyz")[0] == 503
    finally:
        agent.stop()


def test_healthz_fails_when_a_scrape_cycle_hangs():
    agent = _agent()
    release = asyncio.Event()
    real_run = agent.cycle.run
    hang = {"on": False}

    async def run(session, targets):
        if hang["on"]:
            await release.wait()  # never set: the cycle is stuck, the scheduler skips later runs
        return await real_run(session, targets)

    agent.cycle.run = run
    agent.start()
    try:
        base = agent.url.removesuffix("/metrics")
        assert _wait_for(lambda: _get(base + "/healthz")[1]["cycles"] >= 1)
        hang["on"] = True
        assert _wait_for(lambda: _get(base + "/healthz")[0] == 503)
        _status, body = _get(base + "/healthz")
        assert "since the last completed scrape cycle" in body["reason"] and body["last_cycle_age_s"] > 0.6
    finally:
        agent.stop()


def test_readyz_is_503_before_the_first_cycle():
    agent = _agent()
    gate = asyncio.Event()
    real_run = agent.cycle.run

    async def run(session, targets):
        await gate.wait()
        return await real_run(session, targets)

    agent.cycle.run = run
    agent.start()
    try:
        base = agent.url.removesuffix("/metrics")
        status, body = _get(base + "/readyz")
        assert status == 503 and body["reason"] == "waiting for the first scrape cycle"
        assert _get(base + "/healthz")[0] == 200  # live while within the stale limit
        agent._loop.call_soon_threadsafe(gate.set)
        assert _wait_for(lambda: _get(base + "/readyz")[0] == 200)
    finally:
        agent.stop()
