"""OpenTelemetry export of the same snapshot: observable instruments read it at each collection,
and an OTLP exporter (HTTP/protobuf or gRPC) pushes it when an endpoint is configured.

TTFT is also exported as `gen_ai.server.time_to_first_token`, a histogram (unit `s`) following
the GenAI semantic conventions. The SDK has no observable histogram, so the agent's exporter
wrapper adds that metric to each batch from the snapshot: vLLM's own cumulative buckets (its
bounds are a superset of the convention's advice), cumulative temporality, one point per pod and
model, with `gen_ai.operation.name`, `gen_ai.provider.name`, `gen_ai.request.model` and
`k8s.pod.name`. L2 I/O latency goes the same way as `tierpilot.l2.io.duration` (histogram, `s`, the
source's buckets, attributes `pod` and `op`).
"""
from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Sequence

from opentelemetry.metrics import CallbackOptions, Observation
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import (
    AggregationTemporality,
    Histogram,
    HistogramDataPoint,
    Metric,
    MetricExporter,
    MetricExportResult,
    MetricsData,
    PeriodicExportingMetricReader,
    ResourceMetrics,
    ScopeMetrics,
)
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.util.instrumentation import InstrumentationScope

from contracts.tier_model import HistogramView, Snapshot
from exporters.settings import OtelSettings

GENAI_TTFT = "gen_ai.server.time_to_first_token"
L2_IO = "tierpilot.l2.io.duration"
SCOPE = "tierpilot.agent"


def _point(h: HistogramView, attributes: dict[str, str], start_ns: int, now_ns: int) -> HistogramDataPoint | None:
    """One cumulative OTLP point from lifetime buckets (per-bucket counts, as OTLP wants)."""
    counts = list(h.cumulative_counts)
    if len(counts) != len(h.bounds) + 1:
        return None
    per_bucket = [round(c - (counts[i - 1] if i else 0.0)) for i, c in enumerate(counts)]
    return HistogramDataPoint(
        attributes=attributes, start_time_unix_nano=start_ns, time_unix_nano=now_ns,
        count=round(h.count), sum=h.total,
        bucket_counts=[max(0, c) for c in per_bucket], explicit_bounds=list(h.bounds),
        min=None, max=None,  # type: ignore[arg-type]  # unknown from buckets; left unset in OTLP
    )


def _histogram(name: str, description: str, points: list[HistogramDataPoint | None]) -> Metric | None:
    kept = [p for p in points if p is not None]
    if not kept:
        return None
    return Metric(name=name, description=description, unit="s",
                  data=Histogram(data_points=kept, aggregation_temporality=AggregationTemporality.CUMULATIVE))


def genai_ttft_metric(snap: Snapshot, operation: str, provider: str, start_ns: int, now_ns: int) -> Metric | None:
    return _histogram(GENAI_TTFT, "Time to generate the first token for successful responses.", [
        _point(h, {"gen_ai.operation.name": operation, "gen_ai.provider.name": provider,
                   "gen_ai.request.model": h.model, "k8s.pod.name": h.pod}, start_ns, now_ns)
        for h in snap.ttft_histograms])


def l2_io_metric(snap: Snapshot, start_ns: int, now_ns: int) -> Metric | None:
    """L2 I/O latency per pod, operation and source (per FUSE I/O, or per LMCache remote request),
    in the source's buckets."""
    return _histogram(L2_IO, "L2 I/O latency: per FUSE I/O (source curvine_fuse) or per LMCache remote request.", [
        _point(io.histogram, {"pod": io.pod, "op": io.op, "source": io.source}, start_ns, now_ns)
        for io in snap.l2_io if io.histogram is not None])


class SnapshotHistogramExporter(MetricExporter):
    """Wraps an OTLP exporter; adds the GenAI TTFT histogram built from the snapshot to each batch."""

    def __init__(self, inner: MetricExporter, get_snapshot: Callable[[], Snapshot], settings: OtelSettings,
                 resource: Resource):
        super().__init__(preferred_temporality=inner._preferred_temporality,
                         preferred_aggregation=inner._preferred_aggregation)
        self.inner = inner
        self.get_snapshot = get_snapshot
        self.settings = settings
        self.resource = resource
        self.start_ns = time.time_ns()

    def export(self, metrics_data: MetricsData, timeout_millis: float = 10_000, **kwargs) -> MetricExportResult:
        snap, now = self.get_snapshot(), time.time_ns()
        added = [m for m in (genai_ttft_metric(snap, self.settings.genai_operation, self.settings.genai_provider,
                                               self.start_ns, now),
                             l2_io_metric(snap, self.start_ns, now)) if m is not None]
        if added:
            scope = ScopeMetrics(scope=InstrumentationScope("tierpilot.genai"), metrics=added, schema_url="")
            resource_metrics = list(metrics_data.resource_metrics)
            if resource_metrics:
                first = resource_metrics[0]
                resource_metrics[0] = ResourceMetrics(
                    resource=first.resource, scope_metrics=[*first.scope_metrics, scope], schema_url=first.schema_url)
            else:
                resource_metrics = [ResourceMetrics(resource=self.resource, scope_metrics=[scope], schema_url="")]
            metrics_data = MetricsData(resource_metrics=resource_metrics)
        return self.inner.export(metrics_data, timeout_millis=timeout_millis, **kwargs)

    def force_flush(self, timeout_millis: float = 10_000) -> bool:
        return self.inner.force_flush(timeout_millis)

    def shutdown(self, timeout_millis: float = 30_000, **kwargs) -> None:
        self.inner.shutdown(timeout_millis=timeout_millis, **kwargs)


def otlp_exporter(settings: OtelSettings) -> MetricExporter:
    """The OTLP metric exporter for the configured protocol and endpoint."""
    if not settings.endpoint:
        raise ValueError("otel.endpoint is not set")
    headers = dict(settings.headers) or None
    if settings.protocol == "grpc":
        from opentelemetry.exporter.otlp.proto.grpc.metric_exporter import OTLPMetricExporter as Grpc

        endpoint = settings.endpoint.removeprefix("http://").removeprefix("https://")
        return Grpc(endpoint=endpoint, insecure=not settings.endpoint.startswith("https://"),
                    headers=headers, timeout=settings.timeout_s)
    from opentelemetry.exporter.otlp.proto.http.metric_exporter import OTLPMetricExporter as Http

    endpoint = settings.endpoint
    if not endpoint.rstrip("/").endswith("/v1/metrics"):
        endpoint = endpoint.rstrip("/") + "/v1/metrics"
    return Http(endpoint=endpoint, headers=headers, timeout=settings.timeout_s)


class OtelExporter:
    """Observable instruments over the snapshot, pushed by a periodic OTLP reader."""

    def __init__(self, get_snapshot: Callable[[], Snapshot], settings: OtelSettings,
                 exporter: MetricExporter | None = None):
        self.get_snapshot = get_snapshot
        self.settings = settings
        self.resource = Resource.create({"service.name": settings.service_name})
        inner = exporter if exporter is not None else otlp_exporter(settings)
        self.exporter = SnapshotHistogramExporter(inner, get_snapshot, settings, self.resource)
        self.reader = PeriodicExportingMetricReader(
            self.exporter, export_interval_millis=settings.interval_s * 1000,
            export_timeout_millis=settings.timeout_s * 1000)
        self.provider = MeterProvider(resource=self.resource, metric_readers=[self.reader])
        self._register(self.provider.get_meter(SCOPE))

    def _register(self, meter) -> None:
        def tiers(attr: str) -> Callable[[CallbackOptions], Iterable[Observation]]:
            def cb(_options: CallbackOptions) -> Iterable[Observation]:
                for t in self.get_snapshot().tiers:
                    v = getattr(t, attr)
                    if v is not None:
                        labels = {"pod": t.pod, "model": t.model, "tier": t.tier}
                        if attr != "cumulative_hit_ratio":
                            labels["source"] = t.source
                        yield Observation(v, labels)
            return cb

        meter.create_observable_counter("tierpilot.kv.lookup_tokens", [tiers("lookup_tokens")], unit="{token}",
                                        description="Tokens that reached this tier's lookup")
        meter.create_observable_counter("tierpilot.kv.hit_tokens", [tiers("hit_tokens")], unit="{token}",
                                        description="Tokens served from this tier")
        meter.create_observable_gauge("tierpilot.kv.hit_ratio", [tiers("hit_ratio")], unit="1",
                                      description="Tier-conditional hit ratio over the window")
        meter.create_observable_gauge("tierpilot.kv.cumulative_hit_ratio", [tiers("cumulative_hit_ratio")],
                                      unit="1", description="Share of prompt tokens served by this tier or above")
        meter.create_observable_counter("tierpilot.kv.evicted_chunks", [tiers("evicted_chunks")], unit="{chunk}",
                                        description="LMCache chunks evicted from this tier")
        meter.create_observable_counter("tierpilot.kv.evicted_files", [tiers("evicted_files")], unit="{file}",
                                        description="Files evicted from the L2 pool (Curvine)")
        meter.create_observable_counter("tierpilot.kv.evicted_bytes", [tiers("evicted_bytes")], unit="By",
                                        description="Bytes freed by L2 pool eviction (Curvine)")
        meter.create_observable_gauge("tierpilot.kv.usage_ratio", [tiers("usage_ratio")], unit="1",
                                      description="Fraction of this tier's capacity in use")

        def ttft(_options: CallbackOptions) -> Iterable[Observation]:
            for p in self.get_snapshot().pods:
                for q, v in p.ttft_quantiles.items():
                    yield Observation(v, {"pod": p.pod, "model": p.model, "q": f"{q:g}"})

        def l2(_options: CallbackOptions) -> Iterable[Observation]:
            for io in self.get_snapshot().l2_io:
                for q, v in io.quantiles.items():
                    yield Observation(v, {"pod": io.pod, "op": io.op, "source": io.source, "q": f"{q:g}"})

        def up(_options: CallbackOptions) -> Iterable[Observation]:
            for st in self.get_snapshot().targets:
                yield Observation(1 if st.up else 0, {"target": st.target.key, "role": st.target.role,
                                                      "pod": st.target.pod})

        meter.create_observable_gauge("tierpilot.ttft", [ttft], unit="s",
                                      description="Time to first token quantile over the window")
        meter.create_observable_gauge("tierpilot.l2.io_latency", [l2], unit="s",
                                      description="L2 I/O latency quantile over the window")
        meter.create_observable_gauge("tierpilot.target.up", [up], unit="1",
                                      description="1 if the last scrape of the target succeeded")

    def flush(self, timeout_s: float = 10.0) -> bool:
        return self.provider.force_flush(timeout_millis=timeout_s * 1000)

    def shutdown(self) -> None:
        self.provider.shutdown()


__all__: Sequence[str] = ["GENAI_TTFT", "L2_IO", "OtelExporter", "SnapshotHistogramExporter", "otlp_exporter"]
