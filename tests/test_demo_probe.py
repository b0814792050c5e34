"""The demo's probe reads the agent's own /metrics like a dashboard would."""
from __future__ import annotations

import pytest

from emulator.demo.probe import parse_agent_view

EXPORT = """\
# TYPE tierpilot_kv_hit_ratio gauge
tierpilot_kv_hit_ratio{pod="a",model="m",tier="gpu",source="vllm"} 0.5
tierpilot_kv_hit_ratio{pod="b",model="m",tier="gpu",source="vllm"} 0.3
tierpilot_kv_hit_ratio{pod="a",model="m",tier="l2",source="estimated"} 0.2
tierpilot_kv_hit_ratio{pod="b",model="m",tier="l2",source="estimated"} NaN
# TYPE tierpilot_kv_cumulative_hit_ratio gauge
tierpilot_kv_cumulative_hit_ratio{pod="a",model="m",tier="gpu"} 0.5
tierpilot_kv_cumulative_hit_ratio{pod="a",model="m",tier="l2"} 0.6
tierpilot_kv_cumulative_hit_ratio{pod="b",model="m",tier="gpu"} 0.3
# TYPE tierpilot_ttft_quantile_seconds gauge
tierpilot_ttft_quantile_seconds{pod="a",model="m",q="0.95"} 0.4
tierpilot_ttft_quantile_seconds{pod="b",model="m",q="0.95"} 0.6
tierpilot_ttft_quantile_seconds{pod="b",model="m",q="0.5"} 0.1
# TYPE tierpilot_target_up gauge
tierpilot_target_up{target="x",role="vllm",pod="a"} 1
tierpilot_target_up{target="y",role="vllm",pod="b"} 0
"""


def test_per_tier_ratios_are_pod_means_and_nan_is_skipped():
    view = parse_agent_view(EXPORT)
    assert view.tier_hit_ratios == pytest.approx({"gpu": 0.4, "l2": 0.2})
    # each pod's deepest tier: a -> l2 0.6, b -> gpu 0.3
    assert view.cumulative_hit_ratio == pytest.approx(0.45)
    assert view.ttft_p95_s == pytest.approx(0.5)
    assert (view.targets_up, view.targets) == (1, 2)


def test_an_empty_export_has_no_values():
    view = parse_agent_view("")
    assert view.tier_hit_ratios == {} and view.cumulative_hit_ratio is None and view.ttft_p95_s is None
