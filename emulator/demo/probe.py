"""Reads the agent's own export (its `/metrics`) the way a dashboard would, to show next to the
twin's ground truth: is the agent seeing what really happens?"""
from __future__ import annotations

import dataclasses
import math
import urllib.error
import urllib.request

from prometheus_client.parser import text_string_to_metric_families


@dataclasses.dataclass(frozen=True)
class AgentView:
    ttft_p95_s: float | None  # mean over pods of the agent's per-pod TTFT p95
    cumulative_hit_ratio: float | None  # mean over pods of the lowest tier's cumulative ratio
    tier_hit_ratios: dict[str, float]  # tier -> mean over pods of tierpilot_kv_hit_ratio
    targets_up: int
    targets: int


def parse_agent_view(text: str) -> AgentView:
    """Fleet summary from the agent's unified metrics (pure)."""
    ttft: list[float] = []
    per_tier: dict[str, list[float]] = {}
    cumulative: dict[str, tuple[int, float]] = {}  # pod -> (tier rank, value)
    rank = {"gpu": 0, "cpu": 1, "l2": 2}
    up = total = 0
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            if s.name == "tierpilot_ttft_quantile_seconds" and s.labels.get("q") == "0.95" and math.isfinite(s.value):
                ttft.append(s.value)
            elif s.name == "tierpilot_kv_cumulative_hit_ratio" and math.isfinite(s.value):
                pod, r = s.labels.get("pod", ""), rank.get(s.labels.get("tier", ""), -1)
                if r >= cumulative.get(pod, (-1, 0.0))[0]:
                    cumulative[pod] = (r, s.value)
            elif s.name == "tierpilot_kv_hit_ratio" and math.isfinite(s.value):
                per_tier.setdefault(s.labels.get("tier", ""), []).append(s.value)
            elif s.name == "tierpilot_target_up":
                total += 1
                up += int(s.value >= 1)
    return AgentView(
        ttft_p95_s=sum(ttft) / len(ttft) if ttft else None,
        cumulative_hit_ratio=(sum(v for _, v in cumulative.values()) / len(cumulative)) if cumulative else None,
        tier_hit_ratios={tier: sum(v) / len(v) for tier, v in per_tier.items() if v},
        targets_up=up, targets=total)


def fetch_agent_text(url: str, timeout_s: float = 2.0) -> str | None:
    """The agent's `/metrics` text, or None while it does not answer."""
    try:
        with urllib.request.urlopen(url, timeout=timeout_s) as resp:
            return resp.read().decode("utf-8", "replace")
    except (OSError, urllib.error.URLError, ValueError):
        return None


def probe_agent(url: str, timeout_s: float = 2.0) -> AgentView | None:
    text = fetch_agent_text(url, timeout_s)
    try:
        return parse_agent_view(text) if text is not None else None
    except ValueError:
        return None
