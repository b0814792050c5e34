"""`source: prometheus` with `aggregate: server`: the mapping files compiled into PromQL
(prom/plan.py) give, on a real Prometheus, exactly the view the agent-side path gives from the
raw series; the cases where the two could part are the point: several data-parallel engines,
mean gauges, a histogram without `+Inf`, a NaN series (read the exact way, its anomaly counted),
the Ray Serve prefix alias, LMCache's several model labels and `max`, `where` filters, router
re-exports carrying `server`, info gauges whose value is a label, and every reference sample."""
from __future__ import annotations

import math
import time
from pathlib import Path

import pytest

from agent.collect.discovery import StaticTargets
from agent.collect.mapping import load_mappings
from agent.collect.prom.frame import Labelling, plan
from agent.collect.prom.plan import compile_group
from agent.runtime.app import Agent
from agent.settings import load_settings
from contracts.tier_model import Snapshot
from tests.support.fake_targets import MetricsServer
from tests.support.prometheus import prometheus_factory  # noqa: F401

SHARED = Path(__import__("os").environ.get("TIERPILOT_SHARED", Path(__file__).resolve().parents[2] / "shared"))
M = 'model_name="meta-llama/Llama-3.1-8B-Instruct"'
WINDOW_S = 2.0  # short, so that Prometheus (scraping every second) holds a whole window soon
SETTLED_S = 3.0  # both paths read Prometheus at an instant this far back: every scrape stamped before it is in


def _engine_payload(nan_hits: bool = False, inf_bucket: bool = True) -> str:
    lines = ["# TYPE vllm:prefix_cache_queries_total counter", "# TYPE vllm:prefix_cache_hits_total counter",
             "# TYPE vllm:kv_cache_usage_perc gauge", "# TYPE vllm:cache_config_info gauge",
             "# TYPE vllm:prompt_tokens_cached_by_source_total counter",
             "# TYPE vllm:time_to_first_token_seconds histogram", "# TYPE vllm:num_requests_waiting gauge"]
    for engine, (queries, hits, usage, blocks) in enumerate([(9000, 3000, 0.2, 1000), (5000, 1000, 0.6, 1200)]):
        e = f'engine="{engine}",{M}'
        lines.append(f"vllm:prefix_cache_queries_total{{{e}}} {queries}")
        lines.append(f"vllm:prefix_cache_hits_total{{{e}}} {'NaN' if nan_hits and engine else hits}")
        lines.append(f"vllm:kv_cache_usage_perc{{{e}}} {usage}")
        lines.append(f"vllm:num_requests_waiting{{{e}}} {engine + 2}")
        lines.append(f'vllm:cache_config_info{{block_size="16",engine="{engine}",num_gpu_blocks="{blocks}"}} 1')
        for source, n in (("device", 2000), ("host", 0), ("external_unspecified", 700)):
            lines.append(f'vllm:prompt_tokens_cached_by_source_total{{{e},source="{source}"}} {n + engine}')
        cum = 0
        bounds = ["0.1", "0.5", "1.0", "2.5"] + (["+Inf"] if inf_bucket else [])
        for le, n in zip(bounds, (3, 10, 4, 2, 1), strict=False):
            cum += n
            lines.append(f'vllm:time_to_first_token_seconds_bucket{{{e},le="{le}"}} {cum + engine}')
        lines.append(f"vllm:time_to_first_token_seconds_sum{{{e}}} {12.5 + engine}")
        lines.append(f"vllm:time_to_first_token_seconds_count{{{e}}} {20 + engine}")
    return "\n".join(lines) + "\n"


ROUTER = """# TYPE vllm:num_incoming_requests_total counter
vllm:num_incoming_requests_total{model="m"} 42
# TYPE vllm:prefix_cache_hits_total counter
vllm:prefix_cache_hits_total{server="http://10.0.0.9:8000",model_name="m"} 999
# TYPE vllm:request_latency_seconds histogram
vllm:request_latency_seconds_bucket{model="m",le="0.5"} 10
vllm:request_latency_seconds_bucket{model="m",le="+Inf"} 12
vllm:request_latency_seconds_sum{model="m"} 7.5
vllm:request_latency_seconds_count{model="m"} 12
"""


@pytest.fixture()
def fleet(prometheus_factory):  # noqa: F811
    payloads = {"vllm-dp": ("vllm", _engine_payload()), "vllm-nan": ("vllm", _engine_payload(nan_hits=True)),
                "vllm-noinf": ("vllm", _engine_payload(inf_bucket=False)), "router-0": ("router", ROUTER)}
    for sample in sorted((SHARED / "reference" / "samples").glob("*.prom")):
        text = sample.read_text()
        if "\n...\n" not in text:  # a docs excerpt with elisions is no payload Prometheus accepts
            payloads[sample.stem.replace("_", "-")] = ("vllm", text)
    with MetricsServer() as server:
        configs = []
        for pod, (job, text) in payloads.items():
            server.route(f"/{pod}", text=text)
            host = server.url(f"/{pod}").split("//", 1)[1].split("/", 1)[0]
            configs.append({"targets": [host], "labels": {"__metrics_path__": f"/{pod}", "pod": pod,
                                                          "namespace": "llm", "role": job}})
        prom = prometheus_factory([], static_configs=configs, wait_for_first_scrape=False)
        deadline = time.monotonic() + 30
        while len(prom.query("up == 1")) < len(payloads) and time.monotonic() < deadline:
            time.sleep(0.3)
        down = [r["metric"]["pod"] for r in prom.query("up == 0")]
        assert not down, down
        time.sleep(WINDOW_S + 1 + SETTLED_S)  # every series is older than the window: none "born" inside it
        yield prom, payloads


class PinnedClock:
    """The data clock both agents read: the instant their queries ask Prometheus about."""

    def __init__(self, t: float) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t


def _agent(url: str, aggregate: str, roles: dict | None = None, clock: PinnedClock | None = None) -> Agent:
    settings = load_settings(env={}, source="prometheus", store={"window_s": WINDOW_S, "retention_s": 60},
                             prometheus={"url": url, "aggregate": aggregate, "backfill": False,
                                         "roles": roles or {}})
    return Agent(settings, StaticTargets(()), clock=clock)


def _close(a: object, b: object) -> bool:
    if isinstance(a, float) and isinstance(b, float):
        return math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-12) or (math.isnan(a) and math.isnan(b))
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_close(a[k], b[k]) for k in a)
    if isinstance(a, tuple) and isinstance(b, tuple):
        return len(a) == len(b) and all(_close(x, y) for x, y in zip(a, b, strict=True))
    if hasattr(a, "__dataclass_fields__") and type(a) is type(b):
        return all(_close(getattr(a, f), getattr(b, f)) for f in a.__dataclass_fields__)
    return a == b


def _same_view(server: Snapshot, agent: Snapshot) -> None:
    for attr in ("tiers", "pods", "l2_io", "eviction_ages", "ttft_histograms"):
        s = sorted(getattr(server, attr), key=repr)
        a = sorted(getattr(agent, attr), key=repr)
        assert len(s) == len(a), (attr, len(s), len(a))
        for x, y in zip(s, a, strict=True):
            diff = {f: (getattr(x, f), getattr(y, f)) for f in x.__dataclass_fields__
                    if not _close(getattr(x, f), getattr(y, f))}
            assert not diff, (attr, x.pod, diff)
    s_status = {t.target.key: (t.up, t.reason) for t in server.targets}
    a_status = {t.target.key: (t.up, t.reason) for t in agent.targets}
    assert s_status.items() <= a_status.items()
    # the agent-side path also lists, as targets, series that no rule keeps (without a selector,
    # the router's `server`-labelled re-exports are named after vLLM's metrics): no data either way
    extra = {key.rsplit("/", 1)[1] for key in a_status.keys() - s_status.keys()}
    assert extra <= {"router-0"}
    assert not any(t.pod in extra for t in (*agent.tiers, *agent.pods))


def test_query_shapes_follow_each_rules_aggregation():
    mappings = load_mappings()
    (group,) = plan(mappings, {"vllm": 'job="vllm"'})
    parts = {(p.rule.signal, p.part): p.query for p in compile_group(group, mappings, Labelling())}
    assert parts[("gpu_hit_tokens", "value")] == (
        'sum by (pod, namespace, instance, model_name) ({__name__=~"vllm:prefix_cache_hits_total|'
        'ray_vllm:prefix_cache_hits_total",server="",job="vllm"})')
    assert parts[("cached_host_tokens", "value")].endswith('source="host",server="",job="vllm"})')
    assert parts[("gpu_usage_ratio", "mean_sum")].startswith("sum by") and \
        parts[("gpu_usage_ratio", "mean_count")].startswith("count by")
    assert parts[("ttft_seconds", "bucket")].startswith("sum by (pod, namespace, instance, model_name, le) (")
    assert {("ttft_seconds", "sum"), ("ttft_seconds", "count")} <= parts.keys()
    assert parts[("gpu_blocks", "raw")].startswith('{__name__=~"vllm:cache_config_info|')  # value from a label
    lmcache = parts[("lmcache_hit_tokens", "value")]  # several model labels, `max` that still shows NaN
    assert lmcache.startswith("max by (pod, namespace, instance, served_model_name, model_name, model) (")
    assert " + 0 * sum by (" in lmcache
    (everything,) = plan(mappings, {})
    roleless = compile_group(everything, mappings, Labelling(), present=frozenset({"vllm:prefix_cache_hits_total"}))
    assert {p.rule.signal for p in roleless} == {"gpu_hit_tokens"}  # only rules whose names exist
    assert all(", job, " in p.query for p in roleless)  # no selector: `job` may name the role


@pytest.mark.parametrize("roles", [None, {"vllm": 'role="vllm"', "router": 'role="router"'}])
def test_server_side_aggregation_gives_the_agent_side_view(fleet, roles):
    prom, payloads = fleet
    # both paths ask Prometheus about the same settled instant, however late each query runs
    at = time.time() - SETTLED_S
    s_clock, a_clock = PinnedClock(at - 0.05), PinnedClock(at)
    server, agent = _agent(prom.url, "server", roles, s_clock), _agent(prom.url, "agent", roles, a_clock)
    server.scrape_now()
    s_clock.t = at
    s_snap, a_snap = server.scrape_now(), agent.scrape_now()
    _same_view(s_snap, a_snap)
    pods = {t.pod for t in s_snap.tiers}
    assert {"vllm-dp", "vllm-nan", "vllm-noinf", "datadog-ray-vllm-metrics"} <= pods
    # two engines summed (hits, queries), the usage gauge averaged, the capacity label summed
    dp = {t.tier: t for t in s_snap.tiers if t.pod == "vllm-dp"}
    assert dp["gpu"].hit_tokens == 4000 and dp["gpu"].lookup_tokens == 14000
    assert math.isclose(dp["gpu"].usage_ratio, 0.4)
    (pod,) = [p for p in s_snap.pods if p.pod == "vllm-dp"]
    assert pod.gpu_capacity_tokens == (1000 + 1200) * 16 and pod.requests_waiting == 5
    # the NaN series: that target is read raw; its anomaly is counted and its valid series kept
    nan = next(t for t in s_snap.targets if t.target.pod == "vllm-nan")
    assert not nan.up and nan.reason == "invalid_value" and nan.errors == {"invalid_value": 2}
    assert any(t.pod == "vllm-nan" and t.tier == "gpu" for t in s_snap.tiers)
    # no `+Inf` bucket: one is made from `_count`, so the quantiles exist
    (noinf,) = [h for h in s_snap.ttft_histograms if h.pod == "vllm-noinf"]
    assert noinf.cumulative_counts[-1] == 41 and noinf.count == 41  # 20 + 21: the engines
    # the router's re-export with `server` never counts as an engine's
    assert not any(t.pod == "router-0" for t in s_snap.tiers)
    # every pod with a mapped series has a status (the docs' usage excerpt has none: no KV pod)
    assert {t.target.pod for t in s_snap.targets} == set(payloads) - {"vllm-metrics-docs-usage-excerpt"}



def test_backfill_instants_start_at_the_first_sample_and_double_back():
    from agent.collect.prom.aggregate import backfill_instants

    assert backfill_instants(1000.0, 300.0, 15.0) == [700.0, 760.0, 880.0, 940.0, 970.0, 985.0]
    # Prometheus has the targets only since 950: the baseline is its first sample, not before
    assert backfill_instants(1000.0, 300.0, 15.0, earliest=950.0) == [950.0, 970.0, 985.0]
