"""Fleet series when several agent replicas scrape the same targets: who serves them, and with
which `namespace`.

`FleetExport(inner, is_exporter=..., pod_namespaces=...)` wraps a collector whose families describe
the scraped fleet (the snapshot collector, the KV-event collector):

- a family is a *fleet* family when any of its samples carries a `pod`, `target` or `role` label
  (tier and TTFT series, per-target health, KV-event signals). While `is_exporter()` is false (a
  standby replica with `export.fleet: leader`) those families are left out, so `sum(...)` over the
  replicas counts each vLLM pod once. Label-less agent series (cycle duration, store rows, snapshot
  time) are always served: they describe this replica, and with honorLabels Prometheus labels them
  with this replica's pod.
- every sample with a `pod` label and no `namespace` gets the namespace that pod was discovered
  in (`pod_namespaces()`), so with `honorLabels: true` the series keep the vLLM pod's namespace
  instead of the agent's.

The standby keeps scraping and keeps its window; only what it serves changes. Sharding (each
replica scrapes a disjoint shard) needs `export.fleet: all`: every replica's series are distinct.
"""
from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping

from prometheus_client.core import Metric
from prometheus_client.registry import Collector

FLEET_LABELS = frozenset({"pod", "target", "role"})


def is_fleet_family(family: Metric) -> bool:
    return any(FLEET_LABELS & sample.labels.keys() for sample in family.samples)


def with_namespaces(family: Metric, namespaces: Mapping[str, str]) -> Metric:
    """`family` with `namespace` added to each sample whose pod has a known namespace (in place)."""
    samples = []
    for s in family.samples:
        ns = namespaces.get(s.labels.get("pod", "")) if "namespace" not in s.labels else None
        samples.append(s._replace(labels={**s.labels, "namespace": ns}) if ns else s)
    family.samples = samples
    return family


class FleetExport(Collector):
    """See the module docstring."""

    def __init__(self, inner: Collector, *, is_exporter: Callable[[], bool] | None = None,
                 pod_namespaces: Callable[[], Mapping[str, str]] | None = None) -> None:
        self.inner = inner
        self.is_exporter = is_exporter
        self.pod_namespaces = pod_namespaces

    def describe(self) -> list[Metric]:
        return []

    def collect(self) -> Iterator[Metric]:
        exporting = self.is_exporter is None or self.is_exporter()
        namespaces = self.pod_namespaces() if self.pod_namespaces is not None else {}
        for family in self.inner.collect():
            if not is_fleet_family(family):
                yield family
            elif exporting:
                yield with_namespaces(family, namespaces) if namespaces else family
