"""The agent's export (its `/metrics` text), parsed into the per-pod values the accuracy measure
compares with the twin's truth. Pure: text in, frozen record out.

Per pod, not averaged: every exported ratio and quantile is a per-pod value over the agent's
window, so it is compared with the same pod's truth over the same window (like with like).
"""
from __future__ import annotations

import dataclasses
import math

from prometheus_client.parser import text_string_to_metric_families

TIER_RANK = {"gpu": 0, "cpu": 1, "l2": 2}
COUNTERS = ("tierpilot_kv_lookup_tokens", "tierpilot_kv_hit_tokens", "tierpilot_kv_evictions")
# The exported eviction families, by unit, read into the one "tierpilot_kv_evictions" key the twin's
# truth is counted in: the emulated LMCache writes one L2 file per chunk, so here files are chunks.
EVICTION_FAMILIES = ("tierpilot_kv_evicted_chunks", "tierpilot_kv_evicted_files")


@dataclasses.dataclass(frozen=True)
class AgentExport:
    taken_at: float  # tierpilot_snapshot_timestamp_seconds (the agent's clock: cluster seconds here)
    hit_ratio: dict[tuple[str, str], float]  # (pod, tier) -> tierpilot_kv_hit_ratio
    cumulative: dict[str, float]  # pod -> cumulative hit ratio of its lowest tier
    ttft: dict[tuple[str, str], float]  # (pod, quantile) -> seconds
    l2_read: dict[tuple[str, str], float]  # (pod, quantile) -> seconds
    counters: dict[tuple[str, str, str], float]  # (family, pod, tier) -> lifetime total (units summed)
    kv_overlap: float | None  # tierpilot_kv_workload_overlap_ratio (one model)
    kv_classes: dict[str, float]  # class -> tierpilot_kv_prompt_token_ratio
    up: dict[str, bool]  # pod -> every target of the pod up


def _finite(v: float) -> bool:
    return v is not None and math.isfinite(v)


def parse_agent_export(text: str) -> AgentExport:
    """Read every signal the accuracy measure knows from one `/metrics` payload."""
    taken_at = math.nan
    hit: dict[tuple[str, str], float] = {}
    cumulative: dict[str, tuple[int, float]] = {}
    ttft: dict[tuple[str, str], float] = {}
    l2: dict[tuple[str, str], float] = {}
    counters: dict[tuple[str, str, str], float] = {}
    overlap: float | None = None
    classes: dict[str, float] = {}
    up: dict[str, bool] = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            lab, v = s.labels, s.value
            if not _finite(v):
                continue
            pod = lab.get("pod", "")
            if s.name == "tierpilot_snapshot_timestamp_seconds":
                taken_at = v
            elif s.name == "tierpilot_kv_hit_ratio":
                hit[(pod, lab.get("tier", ""))] = v
            elif s.name == "tierpilot_kv_cumulative_hit_ratio":
                rank = TIER_RANK.get(lab.get("tier", ""), -1)
                if rank >= cumulative.get(pod, (-1, 0.0))[0]:
                    cumulative[pod] = (rank, v)
            elif s.name == "tierpilot_ttft_quantile_seconds":
                ttft[(pod, lab.get("q", ""))] = v
            elif s.name == "tierpilot_l2_io_latency_quantile_seconds" and lab.get("op") == "read":
                l2[(pod, lab.get("q", ""))] = v
            elif s.name.endswith("_total") and s.name[: -len("_total")] in COUNTERS + EVICTION_FAMILIES:
                family = s.name[: -len("_total")]
                family = "tierpilot_kv_evictions" if family in EVICTION_FAMILIES else family
                key = (family, pod, lab.get("tier", ""))
                counters[key] = counters.get(key, 0.0) + v
            elif s.name == "tierpilot_kv_workload_overlap_ratio":
                overlap = v
            elif s.name == "tierpilot_kv_prompt_token_ratio":
                classes[lab.get("class", "")] = v
            elif s.name == "tierpilot_target_up":
                up[pod] = up.get(pod, True) and v >= 1
    return AgentExport(taken_at, hit, {p: v for p, (_r, v) in cumulative.items()}, ttft, l2, counters,
                       overlap, classes, up)
