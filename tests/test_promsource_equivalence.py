"""Direct scrape and `source: prometheus` agree on the emulated cluster, on real parts: a real
Prometheus (Debian's) scrapes the emulated pods (with the `pod` label Kubernetes service
discovery attaches); one agent scrapes the same pods itself, another reads Prometheus' query API.
Over the same window: hit ratios within 0.01, quantiles within 5%, counts within 1%."""
from __future__ import annotations

import json
import math
import random
import re
import time

import pytest
from click.testing import CliRunner

from agent.cli.run import scrape_once
from agent.collect.discovery import StaticTargets
from agent.runtime.app import Agent
from agent.settings import load_settings
from contracts.tier_model import Snapshot, Target
from emulator.cluster.fleet import ClusterSpec, EmulatedCluster
from emulator.cluster.pod_metrics import RequestOutcome
from tests.support.prometheus import prometheus_factory  # noqa: F401

WINDOW_S = 600.0


def _static_configs(cluster: EmulatedCluster) -> list[dict]:
    return [{"targets": [t["url"].split("//", 1)[1].split("/", 1)[0]],
             "labels": {"pod": t["pod"], "namespace": "llm"}} for t in cluster.targets()]


def _traffic(cluster: EmulatedCluster, rng: random.Random, n: int) -> None:
    for pod in cluster.pods.values():
        for _ in range(n):
            prompt = rng.randint(256, 8192)
            gpu = rng.randint(0, prompt // 2)
            cpu = rng.randint(0, (prompt - gpu) // 3)
            l2 = rng.randint(0, (prompt - gpu - cpu) // 3)
            pod.metrics.record(RequestOutcome(prompt, gpu, cpu, l2, output_tokens=64,
                                              ttft_s=rng.uniform(0.02, 3.0), l2_read_s=l2 * 1e-6,
                                              stored_tokens=(prompt - gpu - cpu - l2) // 256 * 256))
            pod.fuse.record_io("read", l2 * 131072, [rng.uniform(80, 6000) for _ in range(max(1, l2 // 256))])


def _close(a: float | None, b: float | None, rel: float = 0.0, abs_: float = 0.0) -> bool:
    if a is None or b is None:
        return a is None and b is None
    return math.isclose(a, b, rel_tol=rel, abs_tol=abs_)


def assert_equivalent(direct: Snapshot, prom: Snapshot) -> None:
    d_tiers = {(t.pod, t.model, t.tier): t for t in direct.tiers}
    p_tiers = {(t.pod, t.model, t.tier): t for t in prom.tiers}
    assert d_tiers and set(d_tiers) == set(p_tiers)
    for key, d in d_tiers.items():
        p = p_tiers[key]
        assert d.source == p.source, key
        for attr in ("lookup_tokens", "hit_tokens", "evicted_chunks", "evicted_files", "evicted_bytes"):
            assert _close(getattr(d, attr), getattr(p, attr), rel=0.01), (key, attr, d, p)
        for attr in ("hit_ratio", "cumulative_hit_ratio", "usage_ratio"):
            assert _close(getattr(d, attr), getattr(p, attr), abs_=0.01), (key, attr, d, p)
    d_pods = {(p.pod, p.model): p for p in direct.pods}
    p_pods = {(p.pod, p.model): p for p in prom.pods}
    assert d_pods and set(d_pods) == set(p_pods)
    for key, d in d_pods.items():
        p = p_pods[key]
        assert _close(d.prompt_tokens, p.prompt_tokens, rel=0.01) and _close(d.requests, p.requests, rel=0.01)
        assert d.ttft_quantiles and set(d.ttft_quantiles) == set(p.ttft_quantiles), key
        for q, v in d.ttft_quantiles.items():
            assert _close(v, p.ttft_quantiles[q], rel=0.05), (key, q, v, p.ttft_quantiles[q])
    d_io = {(x.pod, x.op): x.quantiles for x in direct.l2_io}
    p_io = {(x.pod, x.op): x.quantiles for x in prom.l2_io}
    assert d_io and set(d_io) == set(p_io)
    for key, qs in d_io.items():
        for q, v in qs.items():
            assert _close(v, p_io[key][q], rel=0.05), (key, q, qs, p_io[key])
    assert {t.target.pod for t in direct.targets if t.up} == {t.target.pod for t in prom.targets if t.up}


@pytest.fixture()
def scraped_cluster(prometheus_factory):  # noqa: F811
    with EmulatedCluster(ClusterSpec(pods=3, restart_downtime_s=0.0)) as cluster:
        targets = cluster.targets()
        prom = prometheus_factory([t["url"].split("//", 1)[1].split("/", 1)[0] for t in targets],
                                  static_configs=_static_configs(cluster))
        yield cluster, prom


@pytest.mark.parametrize("aggregate", ["server", "agent"])
def test_direct_scrape_and_prometheus_source_agree(scraped_cluster, aggregate):
    cluster, prom = scraped_cluster
    store = {"store": {"window_s": WINDOW_S, "retention_s": WINDOW_S}}
    direct = Agent(load_settings(env={}, **store), StaticTargets(
        [Target(url=t["url"], role=t["role"], pod=t["pod"], namespace="llm") for t in cluster.targets()]))
    direct.scrape_now()  # before any traffic: the window starts here
    rng = random.Random(7)
    for _ in range(3):
        _traffic(cluster, rng, 40)
        time.sleep(1.1)
    time.sleep(2.5)  # Prometheus has scraped the final state
    d_snap = direct.scrape_now()
    via_prom = Agent(load_settings(env={}, source="prometheus",
                                   prometheus={"url": prom.url, "aggregate": aggregate},
                                   scrape={"interval_s": 1.0}, **store), StaticTargets(()))
    p_snap = via_prom.scrape_now()
    assert_equivalent(d_snap, p_snap)
    # the range-query backfill gave the store the window's history at once (the tuner's read API)
    assert via_prom.store.frame()["ts"].n_unique() > 3
    assert via_prom.store.request_rate(pod="vllm-0") > 0
    # the same tierpilot_* series (by name and labels other than `target`) on /metrics
    assert _series_names(direct.metrics_text()) == _series_names(via_prom.metrics_text())

    # with a selector per role (the usual config), the same answer
    roles = {"vllm": 'job="tierpilot",pod=~"vllm-.*"', "curvine-master": '{pod="curvine-master"}'}
    per_role = Agent(load_settings(env={}, source="prometheus", prometheus={"url": prom.url, "roles": roles},
                                   **store), StaticTargets(()))
    snap = per_role.scrape_now()
    assert {t.pod for t in snap.tiers} == {t.pod for t in d_snap.tiers}

    # `tierpilot scrape-once --from-prometheus` prints the same view, in one line
    out = CliRunner().invoke(scrape_once, ["--from-prometheus", prom.url, "--format", "json"])
    assert out.exit_code == 0, out.output
    printed = json.loads(out.output)
    assert {(t["pod"], t["tier"], t["source"]) for t in printed["tiers"]} == {
        (t.pod, t.tier, t.source) for t in d_snap.tiers}
    # its table says what the ratios are over: the part of the window Prometheus holds (seconds here)
    table = CliRunner().invoke(scrape_once, ["--from-prometheus", prom.url + "/api/v1"], env={"COLUMNS": "400"})
    assert table.exit_code == 0, table.output
    over = re.findall(r"ratios over the last (\d+) s", table.output)
    assert over and all(1 <= int(s) < 120 for s in over), table.output
    bad = CliRunner().invoke(scrape_once, ["--from-prometheus", prom.url, "--selector", "gpu=x"])
    assert bad.exit_code == 2 and "unknown role 'gpu'" in bad.output


def _series_names(text: str) -> set[str]:
    out = set()
    for line in text.splitlines():
        if line.startswith("tierpilot_") and not line.startswith(("tierpilot_cycle", "tierpilot_store",
                                                                   "tierpilot_target", "tierpilot_scrape")):
            name = line.split("{", 1)[0].split(" ", 1)[0]
            labels = line.split("{", 1)[1].split("}", 1)[0] if "{" in line else ""
            out.add((name, ",".join(sorted(p for p in labels.split(",") if not p.startswith("target=")))))
    return out
