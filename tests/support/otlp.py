"""Real OTLP metric receivers on 127.0.0.1 for tests.

- OTLP/HTTP (protobuf): PyPI `oteltap` (async); `oteltap_receiver(port)` builds one.
- OTLP/gRPC: `GrpcMetricsReceiver`, a small MetricsService servicer on `opentelemetry-proto` and
  `grpcio`, started on a free port and stopped by `close()` (or the context manager).
"""
from __future__ import annotations

import threading
import time
from concurrent import futures
from typing import Self

import grpc
from opentelemetry.proto.collector.metrics.v1 import metrics_service_pb2, metrics_service_pb2_grpc
from opentelemetry.proto.metrics.v1.metrics_pb2 import Metric

from tests.support.prometheus import free_port


def oteltap_receiver(port: int | None = None):
    """An (unstarted) oteltap OTLP/HTTP receiver on 127.0.0.1; use `async with`."""
    from oteltap import OtelTapHttpProtobufReceiver, OtelTapHttpProtobufReceiverSettings

    return OtelTapHttpProtobufReceiver(OtelTapHttpProtobufReceiverSettings(http_port=port or free_port()))


class _Servicer(metrics_service_pb2_grpc.MetricsServiceServicer):
    def __init__(self, sink: GrpcMetricsReceiver):
        self.sink = sink

    def Export(self, request, context):
        self.sink._add(request)
        return metrics_service_pb2.ExportMetricsServiceResponse()


class GrpcMetricsReceiver:
    """Collects every ExportMetricsServiceRequest; `metrics(name)` lists the received Metric protos."""

    def __init__(self) -> None:
        self.requests: list[metrics_service_pb2.ExportMetricsServiceRequest] = []
        self._cond = threading.Condition()
        self.server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
        metrics_service_pb2_grpc.add_MetricsServiceServicer_to_server(_Servicer(self), self.server)
        self.port = self.server.add_insecure_port("127.0.0.1:0")
        self.server.start()

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def _add(self, request) -> None:
        with self._cond:
            self.requests.append(request)
            self._cond.notify_all()

    def metrics(self, name: str | None = None) -> list[Metric]:
        with self._cond:
            reqs = list(self.requests)
        return [m for r in reqs for rm in r.resource_metrics for sm in rm.scope_metrics for m in sm.metrics
                if name is None or m.name == name]

    def wait_for(self, name: str, timeout: float = 10.0) -> list[Metric]:
        deadline = time.monotonic() + timeout
        while True:
            found = self.metrics(name)
            if found:
                return found
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise TimeoutError(f"no OTLP metric {name!r} within {timeout}s; got {sorted({m.name for m in self.metrics()})}")
            with self._cond:
                self._cond.wait(min(remaining, 0.2))

    def close(self) -> None:
        self.server.stop(grace=None).wait(5)

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
