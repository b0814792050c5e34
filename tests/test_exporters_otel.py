"""OTLP export received by real receivers: oteltap (HTTP/protobuf) and a gRPC servicer."""
from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from agent.collect.discovery import StaticTargets
from agent.runtime.app import Agent
from agent.settings import load_settings
from contracts.tier_model import Target
from exporters.otel import GENAI_TTFT, L2_IO, OtelExporter
from tests.support.fake_targets import MetricsServer
from tests.support.otlp import GrpcMetricsReceiver, oteltap_receiver
from tests.support.prometheus import free_port

FIXTURES = Path(__file__).parent / "fixtures"
MODEL = "meta-llama/Llama-3.1-8B-Instruct"


@pytest.fixture(scope="module")
def snapshot():
    with MetricsServer() as srv:
        url = srv.route("/v", text=(FIXTURES / "vllm_0_33_dp2.prom").read_text())
        fuse = srv.route("/f", text=(FIXTURES / "curvine_fuse.prom").read_text())
        agent = Agent(load_settings(), StaticTargets([Target(url, "vllm", "vllm-0"),
                                                      Target(fuse, "curvine-fuse", "vllm-0")]))
        return agent.scrape_now()


def _attrs(point) -> dict[str, str]:
    return {kv.key: kv.value.string_value for kv in point.attributes}


def _check_ttft(metric) -> None:
    assert metric.unit == "s"
    (point,) = metric.histogram.data_points
    assert _attrs(point) == {"gen_ai.operation.name": "chat", "gen_ai.provider.name": "vllm",
                             "gen_ai.request.model": MODEL, "k8s.pod.name": "vllm-0"}
    assert list(point.explicit_bounds) == [0.05, 0.1, 0.25, 0.5, 1.0]
    # engine 0 + engine 1, per bucket (not cumulative) as OTLP wants
    assert list(point.bucket_counts) == [10, 22, 24, 9, 7, 0]
    assert point.count == 72
    assert point.sum == pytest.approx(12 * 0.0 + sum([0.03 * 10, 0.07 * 22, 0.2 * 24, 0.4 * 9, 0.8 * 7]))
    assert metric.histogram.aggregation_temporality == 2  # cumulative


def test_grpc_export_reaches_a_real_grpc_receiver(snapshot):
    with GrpcMetricsReceiver() as rx:
        settings = load_settings(otel={"endpoint": rx.endpoint, "protocol": "grpc", "interval_s": 60})
        exporter = OtelExporter(lambda: snapshot, settings.otel)
        try:
            assert exporter.flush(10)
        finally:
            exporter.shutdown()
        _check_ttft(rx.wait_for(GENAI_TTFT)[0])
        l2 = rx.wait_for(L2_IO)[0]
        assert l2.unit == "s" and l2.histogram.aggregation_temporality == 2
        read = next(p for p in l2.histogram.data_points if _attrs(p) == {"pod": "vllm-0", "op": "read", "source": "curvine_fuse"})
        assert read.explicit_bounds[0] == pytest.approx(10e-6)  # curvine_fuse_io_duration_us, in seconds
        assert sum(read.bucket_counts) == read.count > 0
        ratios = rx.wait_for("tierpilot.kv.hit_ratio")[0]
        got = {(_attrs(p)["tier"], _attrs(p)["source"]): p.as_double for p in ratios.gauge.data_points}
        assert got == {("gpu", "vllm_v1"): 0.375, ("cpu", "vllm_by_source"): 0.25, ("l2", "vllm_by_source"): 0.2}
        lookups = rx.wait_for("tierpilot.kv.lookup_tokens")[0]
        assert lookups.sum.is_monotonic
        assert sorted(p.as_double for p in lookups.sum.data_points) == [7500.0, 10000.0, 16000.0]
        ttft = rx.wait_for("tierpilot.ttft")[0]
        assert {_attrs(p)["q"]: p.as_double for p in ttft.gauge.data_points}["0.5"] == pytest.approx(0.125)


def test_http_export_reaches_oteltap(snapshot):
    async def main():
        port = free_port()
        async with oteltap_receiver(port) as rx:
            settings = load_settings(otel={"endpoint": f"http://127.0.0.1:{port}", "interval_s": 60})
            exporter = OtelExporter(lambda: snapshot, settings.otel)
            # oteltap does not buffer: register the awaiters before anything is sent
            want_ttft = asyncio.ensure_future(rx.await_metric(lambda m: m.name == GENAI_TTFT, timeout=15))
            want_usage = asyncio.ensure_future(
                rx.await_metric(lambda m: m.name == "tierpilot.kv.usage_ratio", timeout=15))
            await asyncio.sleep(0)
            try:
                assert await asyncio.to_thread(exporter.flush, 10)
                ttft, usage = await want_ttft, await want_usage
            finally:
                await asyncio.to_thread(exporter.shutdown)
        _check_ttft(ttft)
        assert [p.as_double for p in usage.gauge.data_points] == [0.375]

    asyncio.run(main())


def test_agent_pushes_over_otlp_when_an_endpoint_is_configured(snapshot):
    with MetricsServer() as srv, GrpcMetricsReceiver() as rx:
        url = srv.route("/v", text=(FIXTURES / "vllm_0_33_dp2.prom").read_text())
        settings = load_settings(server={"host": "127.0.0.1", "port": 0},
                                 otel={"endpoint": rx.endpoint, "protocol": "grpc", "interval_s": 0.5})
        with Agent(settings, StaticTargets([Target(url, "vllm", "vllm-0")])):
            metric = rx.wait_for("tierpilot.target.up", timeout=15)[0]
        assert [p.as_int for p in metric.gauge.data_points] == [1]
