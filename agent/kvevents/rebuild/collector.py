"""Prometheus Collector of the block-stream recorder and the last rebuilt window (catalogue:
docs/metrics.md, "KV-event workload signals"): what is kept, what the per-engine rate cap dropped,
and which engines the last rebuild capped as outliers."""
from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from agent.kvevents.rebuild.recorder import BlockRecorder


class RebuildCollector:
    collector_name = "kv_rebuild"

    def __init__(self, recorder: BlockRecorder, outliers: Callable[[], Mapping[str, int]] = dict,
                 counter_outliers: Callable[[], set[str]] = set) -> None:
        self.recorder = recorder
        self.outliers = outliers
        self.counter_outliers = counter_outliers

    def describe(self) -> list[Metric]:
        return []

    def collect(self) -> Iterator[Metric]:
        rec = self.recorder
        yield GaugeMetricFamily("tierpilot_kv_rebuild_block_refs", "Block references the recorder keeps for the "
                                "rebuilt planning workload (every model).", value=rec.refs())
        yield GaugeMetricFamily("tierpilot_kv_rebuild_bytes", "Bytes of the recorder's columns.", value=rec.nbytes())
        yield GaugeMetricFamily("tierpilot_kv_rebuild_sample_level", "Root-hash sampling level: chains kept have "
                                "their root in the first 2^-level of hash space (0: all).", value=rec.level)
        capped = CounterMetricFamily("tierpilot_kv_rebuild_capped_refs", "Block references an engine stored beyond "
                                     "kv_events.rebuild.engine_refs_per_s, dropped.", labels=["pod", "model"])
        medium = CounterMetricFamily("tierpilot_kv_rebuild_recorded_refs", "Block references recorded, by medium.",
                                     labels=["pod", "model", "medium"])
        for (model, engine), st in sorted(rec.engines.items()):
            capped.add_metric([engine, model], st.capped_refs)
            for m, n in sorted(st.by_medium.items()):
                medium.add_metric([engine, model, m], n)
        yield capped
        yield medium
        out = GaugeMetricFamily("tierpilot_kv_rebuild_outlier_blocks", "Engines the last rebuilt window capped as "
                                "outliers (more than engine_share x the median engine's stored blocks): their "
                                "stored blocks in that window.", labels=["pod"])
        for engine, n in sorted(self.outliers().items()):
            out.add_metric([engine], n)
        yield out
        liars = GaugeMetricFamily("tierpilot_kv_rebuild_counter_outlier", "Pods whose request counter the last "
                                  "rebuilt window did not believe (more than engine_share x the median pod's): 1.",
                                  labels=["pod"])
        for pod in sorted(self.counter_outliers()):
            liars.add_metric([pod], 1.0)
        yield liars
