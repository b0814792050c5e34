"""The demo's agent runs on the emulated cluster's clock, but what Prometheus sees is wall time:
a real Prometheus scraping a demo agent evaluates the shipped TierpilotAgentStale expression to a
few seconds (not to the ~1.8e9 s between trace time and the Unix epoch), and the KV streams' last
event timestamps are wall time too."""
from __future__ import annotations

import threading
import time
from pathlib import Path

from agent.kvevents import EndpointSpec
from contracts.tier_model import Target
from dashboards.alert_rules import agent_alerts
from dashboards.settings import AlertSettings
from emulator.cluster.kv_publisher import KvEventPublisher, stored_event
from emulator.demo.agent_export import parse_agent_export
from emulator.demo.agent_stack import DemoAgent
from tests.support.fake_targets import MetricsServer
from tests.support.prometheus import prometheus_factory  # noqa: F401

FIXTURES = Path(__file__).parent / "fixtures"
SCALE = 20.0


def test_a_healthy_demo_agent_is_not_stale_to_prometheus(prometheus_factory):  # noqa: F811
    started = time.time()
    cluster_now = lambda: 50.0 + (time.time() - started) * SCALE  # trace seconds, as in the demo
    wall_of = lambda t: time.time() - (cluster_now() - t) / SCALE
    stale = next(a for a in agent_alerts(AlertSettings()) if a.alert == "TierpilotAgentStale")
    with MetricsServer() as srv, KvEventPublisher("tcp://127.0.0.1:0", bind=True) as pub:
        url = srv.route("/metrics", text=(FIXTURES / "vllm_0_33_dp2.prom").read_text())
        agent = DemoAgent([Target(url=url, role="vllm", pod="vllm-0")], clock=cluster_now, port=0,
                          kv_endpoints=[EndpointSpec(pod="vllm-0", model="m", endpoint=pub.endpoint)],
                          wall_of=wall_of)
        agent.start()
        stop = threading.Event()

        def publish() -> None:  # batches stamped in cluster time, as the emulated publishers do
            block = 1
            while not stop.wait(0.2):
                pub.publish([stored_event([block], None, 16)], ts=cluster_now())
                block += 1

        feeder = threading.Thread(target=publish, daemon=True)
        feeder.start()
        try:
            host = agent.url.removeprefix("http://").removesuffix("/metrics")
            prom = prometheus_factory([host])
            prom.wait_for("tierpilot_snapshot_timestamp_seconds")
            prom.wait_for("tierpilot_kv_last_event_timestamp_seconds")
            behind = prom.query_value(stale.expr.split(">")[0])
            kv_behind = prom.query_value("time() - max(tierpilot_kv_last_event_timestamp_seconds)")
            assert prom.query(stale.expr) == []  # the alert's condition is false: not even pending
            text = agent.agent.metrics_text()
        finally:
            stop.set()
            feeder.join(5)
            agent.stop()
    assert behind is not None and -5 < behind < 10, behind
    assert kv_behind is not None and -5 < kv_behind < 10, kv_behind
    # the demo still reads its own export in cluster time, for the accuracy measure
    export = parse_agent_export(text)
    assert abs(export.taken_at - time.time()) < 10
    cluster_t = agent.cluster_time_of(export.taken_at)
    assert cluster_t is not None and 50.0 <= cluster_t <= cluster_now()
