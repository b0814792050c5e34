"""Values that cannot be true are refused per series, with a reason, and counted; a refused series
never leaves a partial sum behind; no JSON the agent serves holds NaN or Infinity."""
from __future__ import annotations

import math
import re
import urllib.error
import urllib.request
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from agent.collect.discovery import StaticTargets
from agent.collect.mapping import load_mappings
from agent.collect.normalise import normalise
from agent.collect.parse import parse
from agent.kvevents.fleet import state_json
from agent.runtime.app import Agent
from agent.runtime.payloads import snapshot_json
from agent.settings import load_settings
from contracts.jsonsafe import dumps, strict_loads
from contracts.tier_model import PodView, Snapshot, Target, TierView
from tests.support.fake_targets import MetricsServer

GOOD = (Path(__file__).parent / "fixtures" / "vllm_0_33_dp2.prom").read_text()
MAPPINGS = load_mappings()
M = "meta-llama/Llama-3.1-8B-Instruct"


def sub(text: str, name: str, value: str, engine: str = r"\d", extra: str = "") -> str:
    """Set `name`'s value on the lines of `engine` (a regex) that also match `extra`."""
    pattern = rf'^({re.escape(name)}\{{[^}}]*engine="{engine}"[^}}]*{extra}[^}}]*\}}) \S+$'
    out, n = re.subn(pattern, rf"\g<1> {value}", text, flags=re.MULTILINE)
    assert n, (name, engine, extra)
    return out


def signals(text: str) -> tuple[dict[tuple[str, float | None], float], dict[str, int]]:
    out = normalise(Target("http://p/m", "vllm", "p"), parse(text, MAPPINGS.wanted["vllm"]), MAPPINGS)
    values = {(s.name, None if s.le != s.le else s.le): s.value for s in out.signals if s.source == "vllm_v1"}
    return values, out.anomalies


TTFT = "vllm:time_to_first_token_seconds_bucket"
CASES = {
    "negative counter (one engine)": (lambda t: sub(t, "vllm:prompt_tokens_total", "-550", "0"),
                                      {"negative_counter": 1}, ["prompt_tokens"]),
    "1e308 counter on both engines": (lambda t: sub(t, "vllm:prefix_cache_queries_total", "1e308"),
                                      {"value_out_of_range": 2}, ["gpu_lookup_tokens"]),
    "non-monotone buckets": (lambda t: sub(t, TTFT, "1.0", "1", 'le="0.5"'),
                             {"non_monotone_buckets": 1}, ["ttft_seconds"]),
    "le that is not a number": (lambda t: t.replace('le="0.25",model', 'le="abc",model'),
                                {"malformed_histogram": 1}, ["ttft_seconds"]),
    "bucket without le": (lambda t: t.replace('{engine="0",le="0.1",', '{engine="0",'),
                          {"malformed_histogram": 1}, ["ttft_seconds"]),
    "negative histogram count": (lambda t: sub(t, "vllm:time_to_first_token_seconds_count", "-1", "0"),
                                 {"negative_counter": 1}, ["ttft_seconds"]),
}


@pytest.mark.parametrize("case", CASES)
def test_an_impossible_value_is_refused_with_its_reason_and_leaves_no_partial_signal(case):
    hostile, anomalies, gone = CASES[case]
    good, none = signals(GOOD)
    assert none == {}
    got, found = signals(hostile(GOOD))
    assert found == anomalies
    for name in gone:  # the whole signal of that model is absent this scrape (never a partial sum)
        assert not [k for k in got if k[0].split(":")[0] == name], (name, sorted(k for k in got if name in k[0]))
    kept = {k: v for k, v in good.items() if k[0].split(":")[0] not in gone}
    assert {k: got[k] for k in kept} == kept  # everything else is exactly as without the fault


@pytest.fixture(scope="module")
def server():
    with MetricsServer() as srv:
        yield srv


def test_a_hostile_pod_poisons_nothing_and_every_reason_is_counted(server):
    url = server.route("/p", text=GOOD)
    now = [1000.0]
    agent = Agent(load_settings(env={}, scrape={"backoff_base_s": 0}), StaticTargets([Target(url, "vllm", "p")]),
                  clock=lambda: now[0])
    good = agent.scrape_now()
    hostile = sub(GOOD, "vllm:prompt_tokens_total", "-550")
    hostile = sub(hostile, "vllm:prefix_cache_queries_total", "1e308")
    hostile = sub(hostile, "vllm:request_success_total", "1.5e308")
    hostile = sub(hostile, TTFT, "1.0", "1", 'le="0.5"')
    for step in (1, 2):
        now[0] += 15
        server.route("/p", text=hostile)
        snap = agent.scrape_now()  # two engines at 1.5e308 no longer overflow the sum (it raised)
        status = snap.targets[0]
        assert not status.up and status.reason in ("negative_counter", "value_out_of_range")
        assert status.errors == {"negative_counter": 2 * step, "value_out_of_range": 12 * step,
                                 "non_monotone_buckets": step}
    (pod,) = snap.pods
    (before,) = good.pods
    # the refused signals keep their last good values; nothing negative, nothing infinite
    assert (pod.prompt_tokens, pod.requests) == (before.prompt_tokens, before.requests)
    for rate in (pod.request_rate, pod.prompt_token_rate):
        assert rate is None or (math.isfinite(rate) and rate >= 0)
    assert pod.ttft_quantiles == before.ttft_quantiles
    strict_loads(snapshot_json(snap))
    counted = {s.labels["reason"]: s.value for f in text_string_to_metric_families(agent.metrics_text())
               for s in f.samples if s.name == "tierpilot_scrape_errors_total"}
    assert counted == {"negative_counter": 4.0, "value_out_of_range": 24.0, "non_monotone_buckets": 2.0}
    now[0] += 15
    server.route("/p", text=GOOD)
    assert agent.scrape_now().targets[0].up  # clean again: up again


# -- strict JSON ---------------------------------------------------------------------------------

def test_strict_loads_refuses_what_json_parse_refuses():
    for text in ("NaN", "[Infinity]", '{"a": -Infinity}'):
        with pytest.raises(ValueError):
            strict_loads(text)
    assert dumps({"a": [math.nan, (math.inf, 1.5)], "b": -math.inf}) == '{"a": [null, [null, 1.5]], "b": null}'


def test_snapshot_json_is_strict_json():
    snap = Snapshot(taken_at=math.inf, tiers=(TierView("p", M, "gpu", "vllm_v1", hit_ratio=math.nan),),
                    pods=(PodView("p", M, request_rate=math.inf, ttft_quantiles={0.5: math.nan}),))
    data = strict_loads(snapshot_json(snap))
    assert data["taken_at"] is None and data["tiers"][0]["hit_ratio"] is None
    assert data["pods"][0]["request_rate"] is None and data["pods"][0]["ttft_quantiles"] == {"0.5": None}
    strict_loads(state_json({"x": math.nan}))


def test_healthz_readyz_and_snapshot_are_strict_json_whatever_the_clock_says():
    agent = Agent(load_settings(env={}, server={"host": "127.0.0.1", "port": 0, "snapshot": True}),
                  StaticTargets([]), clock=lambda: math.inf)
    agent.start()
    try:
        agent.scrape_now(10)
        assert agent.snapshot.taken_at == math.inf
        base = agent.url.rsplit("/", 1)[0]
        for path in ("/healthz", "/readyz", "/snapshot"):
            try:
                body = urllib.request.urlopen(base + path, timeout=10).read()
            except urllib.error.HTTPError as exc:
                body = exc.read()
            strict_loads(body)
    finally:
        agent.stop()
