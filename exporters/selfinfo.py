"""The exporter's own conventions: `process_*`, `python_info` and `tierpilot_build_info`.

    register_self_metrics(registry)   # in the agent's own registry, next to the snapshot collector

`process_*` (CPU seconds, resident and virtual memory, open and max file descriptors, start time)
come from prometheus_client's ProcessCollector (Linux /proc), `python_info` from its
PlatformCollector, and `tierpilot_build_info{version, python_version}` is a constant 1 that says
which build answers (join on it, as with any `*_build_info`).
"""
from __future__ import annotations

import importlib.metadata
import platform
from collections.abc import Iterator

from prometheus_client import CollectorRegistry, PlatformCollector, ProcessCollector
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector


def package_version(name: str = "tierpilot") -> str:
    """The installed distribution's version ("unknown" when run from a tree that is not installed)."""
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return "unknown"


class BuildInfo(Collector):
    """`tierpilot_build_info{version, python_version} 1`."""

    def __init__(self, version: str | None = None) -> None:
        self.version = version or package_version()
        self.python_version = platform.python_version()

    def collect(self) -> Iterator[Metric]:
        info = GaugeMetricFamily("tierpilot_build_info",
                                 "Always 1: the tierpilot version and Python version of this agent.",
                                 labels=["version", "python_version"])
        info.add_metric([self.version, self.python_version], 1.0)
        yield info


def register_self_metrics(registry: CollectorRegistry) -> None:
    """Register process_*, python_info and tierpilot_build_info into `registry`."""
    ProcessCollector(registry=registry)
    PlatformCollector(registry=registry)
    registry.register(BuildInfo())
