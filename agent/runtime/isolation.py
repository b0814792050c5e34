"""One failing source never takes down /metrics: every extra collector (tuner, actuation, KV
events...) is wrapped so that an exception drops only its own families for that scrape, counts the
failure, and shows in `tierpilot_collector_up{collector}` and in /healthz `checks`.

prometheus_client's registry calls every collector in turn and lets the first exception escape, so
one dead thread behind a collector used to turn the whole endpoint into an HTTP 500.
"""
from __future__ import annotations

import logging
import re
import threading
from collections.abc import Iterator

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from contracts.redact import redact_text

log = logging.getLogger(__name__)


class IsolatedCollector(Collector):
    """Wraps `inner`: its families, or none (and a recorded failure) when it raises."""

    def __init__(self, inner: Collector, name: str | None = None) -> None:
        self.inner = inner
        self.name = name or type(inner).__name__
        self.up = True
        self.failures = 0
        self.last_error = ""
        self._lock = threading.Lock()

    def collect(self) -> Iterator[Metric]:
        try:
            families = list(self.inner.collect())
        except Exception as exc:  # noqa: BLE001 - any failure of a source is isolated to it
            error = redact_text(f"{type(exc).__name__}: {exc}")[:300]
            with self._lock:
                self.failures += 1
                first = self.up or error != self.last_error
                self.up, self.last_error = False, error
            if first:
                log.error("collector %s failed, its series are dropped from /metrics: %s", self.name, error)
            return iter(())
        with self._lock:
            if not self.up:
                log.info("collector %s recovered", self.name)
            self.up = True
        return iter(families)

    def problem(self) -> str | None:
        """None when the last collection worked; else what failed (for /healthz)."""
        return None if self.up else f"failing: {self.last_error}"


class CollectorHealth(Collector):
    """Collects every wrapped collector in turn, then `tierpilot_collector_up{collector}` and
    `tierpilot_collector_errors_total{collector}` for this very collection."""

    def __init__(self) -> None:
        self.wrapped: list[IsolatedCollector] = []

    def add(self, collector: IsolatedCollector) -> None:
        self.wrapped.append(collector)

    def collect(self) -> Iterator[Metric]:
        for c in list(self.wrapped):
            yield from c.collect()
        up = GaugeMetricFamily("tierpilot_collector_up",
                               "1 if the collector's last collection worked; 0: its series are missing.",
                               labels=["collector"])
        errors = CounterMetricFamily("tierpilot_collector_errors", "Failed collections per collector.",
                                     labels=["collector"])
        for c in self.wrapped:
            up.add_metric([c.name], 1.0 if c.up else 0.0)
            errors.add_metric([c.name], float(c.failures))
        yield up
        yield errors


def collector_name(collector: Collector) -> str:
    """The `collector` label value: the collector's `collector_name` (e.g. "tuner"), else its
    class name in snake case without a Collector/Metrics suffix."""
    named = getattr(collector, "collector_name", None)
    if isinstance(named, str) and named:
        return named
    base = re.sub(r"(Collector|Metrics)$", "", type(collector).__name__) or type(collector).__name__
    return re.sub(r"(?<!^)(?=[A-Z])", "_", base).lower()
