"""Faulty targets: the agent keeps going, marks the target down, counts the reason, and keeps
every other target's data."""
from __future__ import annotations

from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from agent.collect.discovery import StaticTargets
from agent.runtime.app import Agent
from agent.settings import load_settings
from contracts.tier_model import Target
from tests.support.fake_targets import MetricsServer

FIXTURES = Path(__file__).parent / "fixtures"
M = "meta-llama/Llama-3.1-8B-Instruct"
GOOD = (FIXTURES / "vllm_0_33_dp2.prom").read_text()


class MutableTargets:
    def __init__(self, targets):
        self.list = list(targets)

    def targets(self):
        return tuple(self.list)


def values(text: str, name: str) -> dict[tuple, float]:
    out = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            if s.name == name:
                out[tuple(sorted(s.labels.items()))] = s.value
    return out


def settings(**scrape):
    return load_settings(scrape={"timeout_s": 0.5, "max_body_bytes": 1 << 20, "backoff_base_s": 0, **scrape})


@pytest.fixture
def server():
    with MetricsServer() as srv:
        yield srv


def test_each_fault_marks_only_its_target_down(server):
    targets = {
        "good": server.route("/good", text=GOOD),
        "silent": server.route("/silent", hang=True),
        "drip": server.route("/drip", text=GOOD, drip_s=0.05),
        "http500": server.route("/500", status=500),
        "binary": server.route("/binary", body=b"\x89PNG\r\n\x1a\n\x00\xff\xfe garbage"),
        "text": server.route("/text", body=b"<html><body>Service Unavailable</body></html>\n"),
        "huge": server.route("/huge", size=50 * 2**20),
        "cut": server.route("/cut", text=GOOD, reset=True),
        "gzip": server.route("/gzip", text=GOOD, gzip=True),
    }
    agent = Agent(settings(), StaticTargets([Target(u, "vllm", pod) for pod, u in targets.items()]))
    snap = agent.scrape_now()
    status = {st.target.pod: st for st in snap.targets}
    assert {p: st.reason for p, st in status.items() if not st.up} == {
        "silent": "timeout", "drip": "timeout", "http500": "http_5xx", "binary": "parse_error",
        "text": "parse_error", "huge": "body_too_large", "cut": "incomplete_body",
    }
    assert status["good"].up and status["gzip"].up
    assert "line 1" in status["text"].detail and "UTF-8" in status["binary"].detail
    # the good targets' data is complete and exact
    for pod in ("good", "gzip"):
        gpu = next(t for t in snap.tiers if t.pod == pod and t.tier == "gpu")
        assert (gpu.lookup_tokens, gpu.hit_tokens, gpu.hit_ratio) == (16000, 6000, 0.375)
    text = agent.metrics_text()
    up = values(text, "tierpilot_target_up")
    assert up[(("pod", "silent"), ("role", "vllm"), ("target", targets["silent"]))] == 0.0
    assert up[(("pod", "good"), ("role", "vllm"), ("target", targets["good"]))] == 1.0
    errors = values(text, "tierpilot_scrape_errors_total")
    assert errors[(("pod", "huge"), ("reason", "body_too_large"), ("role", "vllm"), ("target", targets["huge"]))] == 1
    assert sum(errors.values()) == 7
    # and the agent keeps going: a second cycle counts again
    agent.scrape_now()
    assert sum(values(agent.metrics_text(), "tierpilot_scrape_errors_total").values()) == 14


def test_nan_inf_and_counter_reset_are_counted_and_never_go_negative(server):
    url = server.route("/v", text=GOOD)
    other = server.route("/o", text=GOOD)
    agent = Agent(settings(), StaticTargets([Target(url, "vllm", "v"), Target(other, "vllm", "o")]))
    agent.scrape_now()
    # a restart: every counter starts again from small values; one NaN and one +Inf arrive too
    # (values only: rewriting `le="2000.0"` too would repeat the `le="200.0"` bucket series)
    restarted = GOOD.replace("} 10000.0", "} 1000.0").replace("} 6000.0", "} 600.0").replace("} 4000.0", "} 400.0") \
        .replace("} 2000.0", "} 200.0")
    restarted = restarted.replace('vllm:kv_cache_usage_perc{engine="0"', 'vllm:kv_cache_usage_perc{engine="0"', 1)
    restarted = restarted.replace(f'vllm:num_requests_running{{engine="0",model_name="{M}"}} 3.0',
                                  f'vllm:num_requests_running{{engine="0",model_name="{M}"}} NaN')
    restarted = restarted.replace(f'vllm:prompt_tokens_total{{engine="1",model_name="{M}"}} 600.0',
                                  f'vllm:prompt_tokens_total{{engine="1",model_name="{M}"}} +Inf')
    server.route("/v", text=restarted)
    snap = agent.scrape_now()
    st = {s.target.pod: s for s in snap.targets}
    # the fault marks the target down for this cycle (its valid series are kept, below)
    assert not st["v"].up and st["v"].reason == "invalid_value"
    assert st["v"].errors == {"counter_reset": 1, "invalid_value": 1}
    assert st["o"].up and st["o"].errors == {}
    gpu = next(t for t in snap.tiers if t.pod == "v" and t.tier == "gpu")
    # lifetime totals restart; window increase after the reset = the new values (1000+600 / 400+200)
    assert (gpu.lookup_tokens, gpu.hit_tokens) == (1600, 600)
    assert gpu.hit_ratio == 600 / 1600
    other_gpu = next(t for t in snap.tiers if t.pod == "o" and t.tier == "gpu")
    # unchanged counters: no traffic in the window, so the ratio falls back to lifetime totals
    assert (other_gpu.hit_tokens, other_gpu.hit_ratio) == (6000, 0.375)
    rates = [p.prompt_token_rate for p in snap.pods if p.pod == "v"]
    assert all(r is None or r >= 0 for r in rates)
    # the next clean scrape (same post-restart counters, no NaN/Inf) brings it back up
    clean = GOOD.replace("} 10000.0", "} 1000.0").replace("} 6000.0", "} 600.0").replace("} 4000.0", "} 400.0") \
        .replace("} 2000.0", "} 200.0")
    server.route("/v", text=clean)
    snap = agent.scrape_now()
    assert {s.target.pod: s.up for s in snap.targets} == {"v": True, "o": True}


def test_a_deleted_pod_vanishes_from_metrics(server):
    keep = Target(server.route("/keep", text=GOOD), "vllm", "keep")
    gone = Target(server.route("/gone", text=GOOD), "vllm", "gone")
    source = MutableTargets([keep, gone])
    agent = Agent(settings(), source)
    agent.scrape_now()
    assert {t.pod for t in agent.snapshot.tiers} == {"keep", "gone"}
    server.route("/gone", text=GOOD, reset=True)  # deleted while being scraped
    snap = agent.scrape_now()
    assert {s.target.pod: s.reason for s in snap.targets if not s.up} == {"gone": "incomplete_body"}
    source.list = [keep]  # discovery noticed the deletion
    agent.scrape_now()
    text = agent.metrics_text()
    assert "gone" not in text
    assert values(text, "tierpilot_kv_hit_tokens_total")[
        (("model", M), ("pod", "keep"), ("source", "vllm_v1"), ("tier", "gpu"))] == 6000


def test_failing_targets_back_off():
    clock = [0.0]
    from agent.collect.scrape import Backoff

    b = Backoff(base_s=5, max_s=20, clock=lambda: clock[0])
    assert b.ready("t")
    assert [b.failed("t") for _ in range(4)] == [5, 10, 20, 20]
    assert not b.ready("t")
    clock[0] = 19.9
    assert not b.ready("t")
    clock[0] = 20.0
    assert b.ready("t")
    b.succeeded("t")
    assert b.failures("t") == 0


def test_backed_off_target_is_skipped_and_reported_down(server):
    url = server.route("/x", status=503)
    agent = Agent(settings(backoff_base_s=60), StaticTargets([Target(url, "vllm", "x")]))
    agent.scrape_now()
    snap = agent.scrape_now()
    (st,) = snap.targets
    assert (st.up, st.skipped, st.reason, st.errors) == (False, True, "http_5xx", {"http_5xx": 1})
    assert server.hits["/x"] == 1
