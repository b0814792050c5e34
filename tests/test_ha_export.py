"""Two agent replicas behind the Prometheus Operator, on a real Prometheus:

- labels survive: the ServiceMonitor the chart renders (honorLabels) turned into the scrape config
  the operator generates keeps the vLLM pod's `pod` and `namespace` on the tier series, and gives
  the agent's own series the agent pod's; the same scrape without honorLabels shows the bug
  (pod = the agent, exported_pod = the vLLM pod), so the check can fail;
- no double counting: with export.fleet=leader, the overview dashboard's queries and the sum of
  every fleet series over two replicas (Lease over the Kubernetes emulator) equal those over one
  agent (the dashboard's max/avg/ratio/quantile panels would hide a duplicate; the sums would not);
- no lost window: after the leader dies, the standby takes the Lease and serves at once the same
  window as an agent that scraped alone all along.
"""
from __future__ import annotations

import json
import math
import random
import subprocess
import time

import pytest
import yaml

from agent.collect.discovery import StaticTargets
from agent.k8s.api import KubeApi
from agent.k8s.leader import LeaseElector
from agent.k8s.settings import LeaseSettings
from agent.runtime.app import Agent
from agent.settings import load_settings
from contracts.tier_model import Target
from emulator.cluster.fleet import ClusterSpec, EmulatedCluster
from emulator.cluster.pod_metrics import RequestOutcome
from exporters.fleet import FleetExport, is_fleet_family
from tests.conftest import REPO_ROOT
from tests.support.kube import NS, FakeTime, serve
from tests.support.prometheus import start_prometheus
from tests.test_helm_chart import CHART, OPERATOR_CRDS, helm_path

AGENT_NS = "monitoring"  # the agent runs in another namespace than the vLLM pods (NS)
FLEET = '{__name__=~"tierpilot_(kv|ttft|requests|prompt|l2|target|scrape_samples).*", job="%s"}'
LEASE = LeaseSettings(name="tierpilot-leader", duration_s=15, renew_deadline_s=10, retry_period_s=2)


@pytest.fixture
def kube(shared_dir):
    yield from serve(shared_dir)


class Clock:
    now = 1_800_000_000.0

    def __call__(self) -> float:
        return self.now


def _traffic(cluster: EmulatedCluster, rng: random.Random) -> None:
    for pod in cluster.pods.values():
        for _ in range(rng.randint(5, 20)):
            prompt = rng.randint(256, 8192)
            gpu = rng.randint(0, prompt // 2)
            pod.metrics.record(RequestOutcome(prompt, gpu, rng.randint(0, (prompt - gpu) // 2), 0, 32,
                                              ttft_s=rng.uniform(0.01, 2.0)))


def operator_scrape_config(monitor: dict, job: str, targets: list[tuple[str, str]]) -> dict:
    """What the Prometheus Operator generates for `monitor`'s first endpoint, after its relabelling:
    the target labels namespace/pod/service/endpoint/container/job of each agent pod (here as static
    labels), and honor_labels from `honorLabels`."""
    ep = monitor["spec"]["endpoints"][0]
    return {
        "job_name": job, "honor_labels": bool(ep.get("honorLabels", False)), "metrics_path": ep["path"],
        "scrape_interval": "2s", "scrape_timeout": "2s",
        "static_configs": [{"targets": [addr], "labels": {
            "namespace": AGENT_NS, "pod": pod, "service": monitor["metadata"]["name"], "endpoint": ep["port"],
            "container": "agent", "job": job}} for addr, pod in targets],
    }


def _rendered_monitor() -> dict:
    # rendered for a cluster that serves the Prometheus Operator's CRDs (the chart's default is `auto`)
    proc = subprocess.run([helm_path(), "template", "tierpilot", str(CHART), "-n", AGENT_NS, *OPERATOR_CRDS,
                           "--show-only", "templates/servicemonitor.yaml"],
                          capture_output=True, text=True, timeout=60, check=True)
    return yaml.safe_load(proc.stdout)


def _agent(targets: list[Target], clock: Clock) -> Agent:
    s = load_settings(env={}, scrape={"interval_s": 3600}, server={"host": "127.0.0.1", "port": 0})
    return Agent(s, StaticTargets(targets), clock=clock)


def _addr(agent: Agent) -> str:
    return agent.url.removeprefix("http://").removesuffix("/metrics")


def dashboard_queries() -> list[str]:
    """Every query of the overview dashboard (dashboards/json), Grafana variables set to all."""
    exprs: list[str] = []

    def walk(x):
        if isinstance(x, dict):
            if isinstance(x.get("expr"), str) and x["expr"]:
                exprs.append(x["expr"])
            for v in x.values():
                walk(v)
        elif isinstance(x, list):
            for v in x:
                walk(v)

    walk(json.loads((REPO_ROOT / "dashboards" / "json" / "tierpilot-overview.json").read_text()))
    return exprs


def for_job(expr: str, job: str) -> str:
    """`expr` restricted to one scrape job; every selector of the dashboards names $namespace."""
    out = expr.replace('namespace=~"$namespace"', f'job="{job}", namespace=~".*"')
    assert out.count(f'job="{job}"') == expr.count("{"), expr
    for var in ("$pod", "$model", "$role"):
        out = out.replace(f'"{var}"', '".*"')
    return out.replace("$__rate_interval", "30s")


def _vector(prom, expr: str, at: float) -> dict[tuple, float]:
    data = prom.api("query", query=expr, time=f"{at:.3f}")
    rows = data["result"] if data["resultType"] == "vector" else [{"metric": {}, "value": data["result"]}]
    return {tuple(sorted(r["metric"].items())): float(r["value"][1]) for r in rows}


def _same(ha: dict, one: dict, rel: float) -> bool:
    return ha.keys() == one.keys() and all(
        (math.isnan(ha[k]) and math.isnan(one[k])) or ha[k] == pytest.approx(one[k], rel=rel, abs=1e-9) for k in one)


def _fleet(prom, job: str) -> dict[tuple, float]:
    out = {}
    for r in prom.query(f"sum by (__name__, namespace, pod, model, tier, quantile) ({FLEET % job})"):
        m = r["metric"]
        if m.get("namespace") == AGENT_NS:  # a series about no vLLM pod: labelled with the serving agent
            m = {k: v for k, v in m.items() if k not in ("pod", "namespace")}
        out[tuple(sorted(m.items()))] = float(r["value"][1])
    return out


def test_fleet_families_are_those_with_pod_target_or_role_labels():
    from prometheus_client.core import GaugeMetricFamily

    own = GaugeMetricFamily("tierpilot_store_rows", "rows")
    own.add_metric([], 3)
    tier = GaugeMetricFamily("tierpilot_kv_usage_ratio", "usage", labels=["pod", "tier"])
    tier.add_metric(["vllm-0", "gpu"], 0.5)
    tier.add_metric(["elsewhere", "gpu"], 0.1)
    assert not is_fleet_family(own) and is_fleet_family(tier)

    class Inner:
        def collect(self):
            yield own
            yield tier

    leader = {"now": False}
    c = FleetExport(Inner(), is_exporter=lambda: leader["now"], pod_namespaces=lambda: {"vllm-0": "llm"})
    assert [f.name for f in c.collect()] == ["tierpilot_store_rows"]
    leader["now"] = True
    fams = list(c.collect())
    assert [s.labels for s in fams[1].samples] == [{"pod": "vllm-0", "tier": "gpu", "namespace": "llm"},
                                                   {"pod": "elsewhere", "tier": "gpu"}]


def test_leader_export_elects_a_leader_even_without_the_tuner(kube):
    from agent.runtime.assembly import RuntimeConfigError, build_runtime
    from agent.settings import SettingsError

    settings = load_settings(env={}, server={"host": "127.0.0.1", "port": 0}, export={"fleet": "leader"},
                             actuation={"lease_namespace": NS, "identity": "agent-x"})
    rt = build_runtime(settings, api_client=kube.api_client(), targets=StaticTargets([]), env={})
    assert rt.tuning is None and rt.elector is not None and rt.elector.namespace == NS
    assert not rt.agent.exporting_fleet()
    assert rt.elector.try_acquire_or_renew() and rt.agent.exporting_fleet()
    assert kube.get("Lease", NS, "tierpilot-leader")["spec"]["holderIdentity"] == "agent-x"
    no_election = load_settings(env={}, export={"fleet": "leader"}, actuation={"leader_election": False})
    with pytest.raises(RuntimeConfigError, match="key 'export.fleet'"):
        build_runtime(no_election, targets=StaticTargets([]), env={})
    with pytest.raises(SettingsError, match="other shards' series"):
        load_settings(env={}, export={"fleet": "leader"}, shard={"count": 2, "allow_unauthenticated": True})


def test_two_replicas_behind_the_operator_count_once_and_fail_over_with_a_warm_window(kube, tmp_path):
    clock, fake, rng = Clock(), FakeTime(), random.Random(3)
    monitor = _rendered_monitor()
    assert monitor["spec"]["endpoints"][0]["honorLabels"] is True
    with EmulatedCluster(ClusterSpec(pods=3, restart_downtime_s=0.0)) as cluster:
        targets = [Target(t["url"], t["role"], t["pod"], namespace=NS)  # type: ignore[arg-type]
                   for t in cluster.targets()]
        a, b, single = (_agent(targets, clock) for _ in range(3))
        electors = {}
        for name, agent in (("agent-a", a), ("agent-b", b)):
            electors[name] = LeaseElector(KubeApi(kube.api_client()), NS, LEASE, name, clock=fake.clock, now=fake.now)
            agent.is_fleet_exporter = electors[name].is_leader
        assert electors["agent-a"].try_acquire_or_renew() and not electors["agent-b"].try_acquire_or_renew()
        agents = (a, b, single)
        for agent in agents:
            agent.start()
        prom = None
        try:
            deadline = time.monotonic() + 20
            while any(agent.cycles < 1 for agent in agents) and time.monotonic() < deadline:
                time.sleep(0.02)  # each started agent's own first cycle, before any traffic
            for _ in range(3):  # every replica scrapes the same pods at the same (fake) times
                _traffic(cluster, rng)
                clock.now += 15.0
                for agent in agents:
                    agent.scrape_now()
            pods = [(_addr(a), "tierpilot-5f7d9-aaaaa"), (_addr(b), "tierpilot-5f7d9-bbbbb")]
            jobs = [operator_scrape_config(monitor, "tierpilot", pods),
                    operator_scrape_config(monitor, "single", [(_addr(single), "tierpilot-single")]),
                    {**operator_scrape_config(monitor, "no-honor", [(_addr(single), "tierpilot-single")]),
                     "honor_labels": False}]
            prom = start_prometheus([], tmp_path / "prom", wait_for_first_scrape=False, scrape_configs=jobs)
            prom.wait_for('tierpilot_kv_lookup_tokens_total{job="tierpilot"}', min_series=3)
            prom.wait_for('tierpilot_kv_lookup_tokens_total{job="single"}', min_series=3)
            prom.wait_for('tierpilot_store_rows{job="tierpilot"}', min_series=2)

            # labels: the vLLM pod's pod and namespace on tier series, the agent's on its own series
            tier = prom.query('tierpilot_kv_lookup_tokens_total{job="single"}')
            assert {r["metric"]["pod"] for r in tier} == set(cluster.pods)
            assert {r["metric"]["namespace"] for r in tier} == {NS}
            assert not any("exported_pod" in r["metric"] for r in tier)
            own = prom.query('tierpilot_store_rows{job="single"}')
            assert [(r["metric"]["pod"], r["metric"]["namespace"]) for r in own] == [("tierpilot-single", AGENT_NS)]
            bug = prom.wait_for('tierpilot_kv_lookup_tokens_total{job="no-honor"}', min_series=3)
            assert {r["metric"]["pod"] for r in bug} == {"tierpilot-single"}  # the operator's default
            assert {r["metric"]["exported_pod"] for r in bug} == set(cluster.pods)

            # no double counting: two replicas (one exporting) read as one agent
            ha, one = _fleet(prom, "tierpilot"), _fleet(prom, "single")
            assert len(one) > 10 and ha == one
            assert len(prom.query('tierpilot_store_rows{job="tierpilot"}')) == 2  # both replicas report themselves

            # the overview dashboard's queries: the same values from two replicas as from one agent
            _traffic(cluster, rng)
            clock.now += 15.0
            for agent in agents:
                agent.scrape_now()
            time.sleep(7)  # Prometheus samples before and after the change for the rate panels
            at = time.time()
            compared = 0
            for expr in dashboard_queries():
                ha_v, one_v = _vector(prom, for_job(expr, "tierpilot"), at), _vector(prom, for_job(expr, "single"), at)
                # rate panels: each job is sampled at its own instants, so rate()'s extrapolation over
                # one step of the counters differs (up to ~20% on a loaded machine); a duplicate would
                # read 2x. The exact check of every fleet series is the sums above.
                assert _same(ha_v, one_v, rel=0.35 if "rate(" in expr else 1e-9), (expr, ha_v, one_v)
                compared += bool(one_v) and not all(math.isnan(v) for v in one_v.values())
            assert compared >= 10
            one = _fleet(prom, "single")  # what one agent reads before the failover

            # the leader dies; the standby takes the Lease and serves the same window at once
            a.stop()
            fake.sleep(16)
            assert electors["agent-b"].try_acquire_or_renew() is True
            _traffic(cluster, rng)
            clock.now += 15.0
            for agent in (b, single):
                agent.scrape_now()
            assert b.store.hit_ratios() == pytest.approx(single.store.hit_ratios())
            assert b.store.request_rate() == pytest.approx(single.store.request_rate())
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline:  # until Prometheus scraped both after the change
                ha, one_after = _fleet(prom, "tierpilot"), _fleet(prom, "single")
                if ha == one_after and one_after != one:
                    break
                time.sleep(0.25)
            assert ha == one_after and one_after != one and len(ha) > 10
            assert {r["metric"]["instance"] for r in prom.query(FLEET % "tierpilot")} == {_addr(b)}
        finally:
            if prom is not None:
                prom.stop()
            for agent in agents:
                agent.stop()
