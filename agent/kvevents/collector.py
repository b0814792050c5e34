"""Prometheus Collector over the latest `KvSnapshot` (new families on every scrape, so a pod that
left the fleet loses its series). Register it on the agent's own `CollectorRegistry`:

    registry.register(KvEventsCollector(manager.snapshot))

The catalogue is in docs/metrics.md, section "KV-event workload signals (agent/kvevents)".
"""
from __future__ import annotations

from collections.abc import Callable, Iterator

from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)

from agent.kvevents.index import CAUSES, REUSE_BUCKETS
from agent.kvevents.signals import KvSnapshot

ENGINE_LABELS = ["pod", "model", "dp_rank"]

# name -> (type, help, extra labels); the base labels are ENGINE_LABELS unless noted in MODEL_LEVEL
METRICS: dict[str, tuple[str, str, list[str]]] = {
    "tierpilot_kv_messages": ("counter", "KV-event batches (ZMQ messages) applied.", []),
    "tierpilot_kv_events": ("counter", "KV events applied, by event type.", ["type"]),
    "tierpilot_kv_blocks": ("counter", "Block hashes in applied events, by op (stored/removed) and medium.",
                            ["op", "medium"]),
    "tierpilot_kv_sequence_gaps": ("counter", "Sequence jumps detected (messages missing).", []),
    "tierpilot_kv_missed_messages": ("counter", ("Messages missing in sequence jumps, by outcome "
                                     "(replayed via the replay socket, lost, or unbuffered: older than the engine's replay "
                                     "buffer at a late join)."), ["outcome"]),
    "tierpilot_kv_restarts": ("counter", ("Engine restarts detected (sequence dropped); the pod's index "
                              "was cleared."), []),
    "tierpilot_kv_reconnects": ("counter", ("Publisher disconnections after which the agent reopened the "
                                "stream (a frame over max_message_bytes, or the pod went away)."), []),
    "tierpilot_kv_shed_messages": ("counter", ("Batches received but dropped unapplied: the queue to the index "
                                   "held kv_events.queue_bytes (the index lags the publishers)."), []),
    "tierpilot_kv_shed_bytes": ("counter", "Wire bytes of those shed batches.", []),
    "tierpilot_kv_rejected": ("counter", "Frames, payloads or events counted and skipped, by reason.",
                              ["reason"]),
    "tierpilot_kv_misses": ("counter", ("GPU block stores that had to be computed, by cause "
                            "(cold/capacity/routing). Estimate, see docs/metrics.md."), ["cause"]),
    "tierpilot_kv_miss_tokens": ("counter", "Tokens in missed blocks, by cause.", ["cause"]),
    "tierpilot_kv_external_hits": ("counter", ("GPU block stores of blocks the pod held on a lower tier "
                                   "(loaded from LMCache, not a miss)."), []),
    "tierpilot_kv_external_hit_tokens": ("counter", "Tokens in those external-hit blocks.", []),
    "tierpilot_kv_l2_hits": ("counter", ("Of the external hits, GPU block stores of blocks read from the shared "
                             "L2 (vLLM native tiering's fs tier, 'STORAGE' events)."), []),
    "tierpilot_kv_l2_hit_tokens": ("counter", "Tokens in those L2-hit blocks.", []),
    "tierpilot_kv_rereported_blocks": ("counter", "Stores of blocks already resident on the pod's GPU.", []),
    "tierpilot_kv_unknown_removed_blocks": ("counter", ("Removals of blocks the index did not hold "
                                            "(stored before the agent joined, or aged out)."), []),
    "tierpilot_kv_index_aged_out": ("counter", ("Resident entries dropped by the index's LRU ageing "
                                    "(per-engine cap reached)."), []),
    "tierpilot_kv_resident_blocks": ("gauge", "Blocks the index believes resident, by medium.", ["medium"]),
    "tierpilot_kv_last_event_timestamp_seconds": ("gauge", ("Engine timestamp (ts) of the last applied "
                                                  "batch."), []),
    "tierpilot_kv_reuse_distance_seconds": ("histogram", ("Time from a block's removal from a tier of a "
                                            "pod to its next GPU store on that pod."), ["medium"]),
    "tierpilot_kv_workload_overlap_ratio": ("gauge", ("Workload prefix overlap over the window: 1 - cold "
                                            "prompt tokens / prompt tokens."), []),
    "tierpilot_kv_prompt_token_ratio": ("gauge", ("Share of prompt tokens over the overlap window, by "
                                        "class: cold, capacity, routing (misses, corrected for L2 hits), "
                                        "tail (partial last chunk), l1_hit, l2_hit. Estimates."), ["class"]),
    "tierpilot_kv_overlap_prompt_tokens": ("gauge", "Prompt tokens in the overlap window (denominator).", []),
    "tierpilot_kv_duplicated_blocks": ("gauge", "Blocks resident on more than one pod (GPU or CPU).", []),
    "tierpilot_kv_resident_hashes": ("gauge", "Distinct block hashes resident anywhere in the fleet.", []),
    "tierpilot_kv_shared_l2_blocks": ("gauge", ("Block hashes in the shared L2 ('STORAGE' stores less removals; "
                                      "fleet-resident, not per pod)."), []),
    "tierpilot_kv_index_sketch_bytes": ("gauge", "Memory of the 'ever seen' sketch.", []),
}
MODEL_LEVEL = {"tierpilot_kv_workload_overlap_ratio", "tierpilot_kv_prompt_token_ratio", "tierpilot_kv_overlap_prompt_tokens",
               "tierpilot_kv_duplicated_blocks", "tierpilot_kv_resident_hashes",
               "tierpilot_kv_index_sketch_bytes", "tierpilot_kv_shared_l2_blocks"}


def _family(name: str) -> Metric:
    kind, doc, extra = METRICS[name]
    labels = (["model"] if name in MODEL_LEVEL else ENGINE_LABELS) + extra
    if kind == "counter":
        return CounterMetricFamily(name, doc, labels=labels)
    if kind == "gauge":
        return GaugeMetricFamily(name, doc, labels=labels)
    return HistogramMetricFamily(name, doc, labels=labels)


def build_families(snap: KvSnapshot) -> list[Metric]:
    """The metric families of one snapshot (pure)."""
    fam = {name: _family(name) for name in METRICS}

    def add(name: str, labels: list[str], value: float) -> None:
        fam[name].add_metric(labels, value)  # type: ignore[attr-defined]

    for e in snap.engines:
        base = [e.engine.pod, e.engine.model, str(e.engine.dp_rank)]
        s = e.stream
        add("tierpilot_kv_messages", base, s.messages)
        for kind, n in sorted(s.events.items()):
            add("tierpilot_kv_events", [*base, kind], n)
        for medium, n in sorted(e.stored_blocks.items()):
            add("tierpilot_kv_blocks", [*base, "stored", medium], n)
        for medium, n in sorted(e.removed_blocks.items()):
            add("tierpilot_kv_blocks", [*base, "removed", medium], n)
        add("tierpilot_kv_sequence_gaps", base, s.gaps)
        add("tierpilot_kv_missed_messages", [*base, "replayed"], s.replayed_messages)
        add("tierpilot_kv_missed_messages", [*base, "lost"], s.lost_messages)
        add("tierpilot_kv_missed_messages", [*base, "unbuffered"], s.unbuffered_messages)
        add("tierpilot_kv_restarts", base, s.restarts)
        add("tierpilot_kv_reconnects", base, s.reconnects)
        add("tierpilot_kv_shed_messages", base, s.shed_messages)
        add("tierpilot_kv_shed_bytes", base, s.shed_bytes)
        for reason, n in sorted(s.rejected.items()):
            add("tierpilot_kv_rejected", [*base, reason], n)
        for cause in CAUSES:
            add("tierpilot_kv_misses", [*base, cause], e.miss_blocks[cause])
            add("tierpilot_kv_miss_tokens", [*base, cause], e.miss_tokens[cause])
        add("tierpilot_kv_external_hits", base, e.external_hit_blocks)
        add("tierpilot_kv_external_hit_tokens", base, e.external_hit_tokens)
        add("tierpilot_kv_l2_hits", base, e.l2_hit_blocks)
        add("tierpilot_kv_l2_hit_tokens", base, e.l2_hit_tokens)
        add("tierpilot_kv_rereported_blocks", base, e.rereported_blocks)
        add("tierpilot_kv_unknown_removed_blocks", base, e.unknown_removed_blocks)
        add("tierpilot_kv_index_aged_out", base, e.aged_out)
        for medium, n in sorted(e.resident_blocks.items()):
            add("tierpilot_kv_resident_blocks", [*base, medium], n)
        if s.last_event_ts is not None:
            add("tierpilot_kv_last_event_timestamp_seconds", base, s.last_event_ts)
        for medium, cum in sorted(e.reuse_buckets.items()):
            buckets = [(_le(b), float(c)) for b, c in zip(REUSE_BUCKETS, cum)] + [("+Inf", float(cum[-1]))]
            fam["tierpilot_kv_reuse_distance_seconds"].add_metric(  # type: ignore[attr-defined]
                [*base, medium], buckets, e.reuse_sum[medium])
    for m in snap.models:
        if m.overlap is not None:
            add("tierpilot_kv_workload_overlap_ratio", [m.model], m.overlap.ratio)
            add("tierpilot_kv_overlap_prompt_tokens", [m.model], m.overlap.prompt_tokens)
            for cls in ("cold", "capacity", "routing", "tail", "l1_hit", "l2_hit"):
                share = m.overlap.share(cls)
                if share is not None:
                    add("tierpilot_kv_prompt_token_ratio", [m.model, cls], share)
        add("tierpilot_kv_duplicated_blocks", [m.model], m.duplicated_blocks)
        add("tierpilot_kv_resident_hashes", [m.model], m.resident_hashes)
        add("tierpilot_kv_shared_l2_blocks", [m.model], m.shared_l2_blocks)
        add("tierpilot_kv_index_sketch_bytes", [m.model], m.sketch_bytes)
    return list(fam.values())


def _le(bound: float) -> str:
    return repr(float(bound))


class KvEventsCollector:
    """A prometheus_client custom collector; `snapshot` is usually `KvEventManager.snapshot`."""

    collector_name = "kv_events"  # the `collector` label of tierpilot_collector_up

    def __init__(self, snapshot: Callable[[], KvSnapshot]) -> None:
        self._snapshot = snapshot

    def describe(self) -> Iterator[Metric]:
        yield from (_family(name) for name in METRICS)

    def collect(self) -> Iterator[Metric]:
        yield from build_families(self._snapshot())
