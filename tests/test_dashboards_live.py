"""Every dashboard query, annotation and variable runs on a real Prometheus that scrapes a running
agent, and returns data; the alert rules load and evaluate on the same data; the overview renders
from it.

The agent runs in-process against loopback targets serving the hand-built vLLM 0.33 / LMCache /
Curvine payloads of tests/fixtures/ (their counters grow on every scrape, so rates are real), plus
one target answering HTTP 500. The tuner, actuation and KV-event collectors are registered with a
few events each, so their series exist too.
"""
from __future__ import annotations

import math
import re
import threading
import time
import urllib.parse
from collections.abc import Iterator
from pathlib import Path

import pytest
from click.testing import CliRunner

from agent.cli import main
from agent.collect.discovery import StaticTargets
from agent.k8s.metrics import ActuationCollector, ActuationMetrics
from agent.kvevents.collector import KvEventsCollector
from agent.kvevents.signals import EngineId, KvSignals
from agent.kvevents.wire import Batch, Removed, Stored
from agent.runtime.app import Agent
from agent.settings import load_settings
from contracts.knobs import Knobs
from contracts.tier_model import Target
from dashboards import build
from dashboards.catalog import QueryRef, dashboard_queries
from dashboards.promql import expand
from dashboards.settings import BuildSettings
from dashboards.source import PrometheusSource
from tests.support.fake_targets import MetricsServer
from tests.support.prometheus import PrometheusServer, run_prometheus
from tuners.metrics import TunerMetrics
from tuners.objective import TtftObservations
from tuners.proposals import ProposalBook
from tuners.shadow import ShadowLog

pytestmark = pytest.mark.slow

FIXTURES = Path(__file__).parent / "fixtures"
MODEL = "meta-llama/Llama-3.1-8B-Instruct"
NAMESPACE = "llm-serving"
ROUTES = {  # path -> (fixture, role, pod)
    "/vllm": ("vllm_0_33_dp2.prom", "vllm", "vllm-0"),
    "/lmcache": ("lmcache_inprocess.prom", "lmcache", "vllm-0"),
    "/fuse": ("curvine_fuse.prom", "curvine-fuse", "vllm-0"),
    "/master": ("curvine_master.prom", "curvine-master", "curvine-master-0"),
}
NATIVE_ROUTE = "/native"
SETTINGS = BuildSettings()
DASHBOARDS = build.dashboards(SETTINGS)
QUERIES = [ref for d in DASHBOARDS for ref in dashboard_queries(d) if "variable" not in ref.where]
VARIABLES = [(d.uid, v) for d in DASHBOARDS for v in d.variables]
# Grafana's values with every variable on "All", at a 1 s scrape interval.
ALL = {"namespace": ".*", "model": ".*", "pod": ".*", "role": ".*", "__rate_interval": "10s"}
_TYPE = re.compile(r"^# TYPE (\S+) (?:counter|histogram|summary)$", re.MULTILINE)


def grown(text: str, factor: float) -> str:
    """The payload with every counter and histogram sample multiplied by `factor` (gauges kept)."""
    cumulative = set(_TYPE.findall(text))
    out = []
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name = re.match(r"[^{\s]+", line).group(0)  # type: ignore[union-attr]
            family = re.sub(r"_(total|bucket|count|sum)$", "", name)
            if name in cumulative or family in cumulative:
                head, _, value = line.rpartition(" ")
                line = f"{head} {float(value) * factor!r}"
        out.append(line)
    return "\n".join(out) + "\n"


def kv_signals(now: float) -> KvSignals:
    """Two pods: a block stored on both (routing miss, duplication), one evicted and stored again."""
    sig = KvSignals(clock=lambda: now)
    a, b = EngineId("vllm-0", MODEL), EngineId("vllm-1", MODEL)
    sig.observe_prompt_tokens("vllm-0", MODEL, 0, ts=now - 20)
    sig.apply(a, Batch(b"", 1, now - 10, 0, [Stored([11, 12, 13], None, 16, "GPU", None)], {}))
    sig.apply(b, Batch(b"", 1, now - 9, 0, [Stored([11, 12], None, 16, "GPU", None)], {}))
    sig.apply(a, Batch(b"", 2, now - 8, 0, [Removed([13], "GPU", None)], {}))
    sig.apply(a, Batch(b"", 3, now - 7, 0, [Stored([13], 12, 16, "GPU", None)], {}))
    # vLLM native tiering's CPU tier: an offloaded block, later evicted
    sig.apply(a, Batch(b"", 4, now - 6, 0, [Stored([11], None, 0, "CPU", None)], {}))
    sig.apply(a, Batch(b"", 5, now - 6, 0, [Removed([11], "CPU", None)], {}))
    sig.observe_prompt_tokens("vllm-0", MODEL, 96, ts=now - 5)
    return sig


def tuner_metrics() -> TunerMetrics:
    m = TunerMetrics(target="vllm-fleet")
    m.set_config(Knobs(chunk_tokens=512, router="prefixaware"))
    m.set_last_good(Knobs())
    m.set_best(0.42)
    m.set_phase(1)
    m.trial_finished("complete")
    m.set_capacity_curves({"cpu": [(0.0, 0.0), (5.0, 0.0), (48.0, 0.058)], "l2": [(0.0, 0.0), (80.0, 0.17)]})
    # The drift counter has no series until its first event, and Prometheus' increase() cannot see
    # the birth of a series at 1: one event before the scrapes start, one after.
    m.drift_event("overlap")
    return m


class _Ttft:
    """TTFT for the shadow log: p95 0.8 s before the change, 0.6 s after it."""

    def __init__(self) -> None:
        self.p95 = 0.8

    def ttft_observations(self, since: float, until: float) -> TtftObservations:
        return TtftObservations(samples=(self.p95 / 2,) * 50 + (self.p95,) * 10)


class ShadowFeed:
    """A shadow tuner's record and a live tuner's proposal book with a few events each: one plan
    pricing a restart (proposed under `hot`), then the fleet changing to it and the change scored."""

    def __init__(self) -> None:
        self.before, self.after = Knobs(), Knobs(cpu_gib=16.0)
        self.plans: list[dict] = []
        self.running = self.before
        self.ttft = _Ttft()
        self.log = ShadowLog(scope="hot", plans=self.plans, running=lambda: self.running, ttft=self.ttft,
                             settle_s=0.0, window_s=1.0, min_requests=10, target="vllm-fleet")
        self.book = ProposalBook("hot")

    def plan(self, at: float) -> None:
        line = {"knobs": {"cpu_gib": [self.before.cpu_gib, self.after.cpu_gib]}, "verdict": "apply",
                "gain_per_hour_s": 52.0, "transition_cost_s": 14.0, "steady_gain_p95": 0.2}
        self.plans.append({"at": at, "current": self.before.to_dict(), "plan": "restart", "priced": [line]})
        self.log.update(at)
        self.book.record(self.before, self.after, "restart", at=at)

    def change(self, at: float) -> None:
        self.running = self.after
        self.log.update(at)
        self.ttft.p95 = 0.6
        self.log.update(at + 2.0)


@pytest.fixture(scope="module")
def live(tmp_path_factory: pytest.TempPathFactory, samples_dir: Path
         ) -> Iterator[tuple[PrometheusServer, TunerMetrics]]:
    texts = {path: (FIXTURES / fixture).read_text() for path, (fixture, _, _) in ROUTES.items()}
    # a pod running vLLM's native tiering (CPU and fs tiers): the real 0.32 capture
    texts[NATIVE_ROUTE] = (samples_dir / "vllm_0_32_cpu_native_tiering_metrics.prom").read_text()
    roles = {path: (role, pod) for path, (_, role, pod) in ROUTES.items()} | {NATIVE_ROUTE: ("vllm", "vllm-native")}
    stop = threading.Event()
    with MetricsServer() as srv:
        targets = [Target(srv.route(path, text=texts[path]), role, pod) for path, (role, pod) in roles.items()]
        targets.append(Target(srv.route("/broken", status=500), "vllm", "vllm-1"))

        def grow() -> None:
            factor = 1.0
            while not stop.wait(0.5):
                factor += 0.25
                for path, text in texts.items():
                    srv.route(path, text=grown(text, factor))

        grower = threading.Thread(target=grow, daemon=True)
        grower.start()
        tuner = tuner_metrics()
        shadow = ShadowFeed()
        shadow.log.update(time.time())
        actuation = ActuationMetrics()
        actuation.leader("tierpilot-0", True)
        actuation.reapplied("deployment/vllm")
        settings = load_settings(server={"host": "127.0.0.1", "port": 0}, scrape={"interval_s": 1.0},
                                 tiers={"cpu_capacity_gib": 5.0})
        collectors = (tuner, shadow.log, shadow.book, ActuationCollector(actuation),
                      KvEventsCollector(kv_signals(time.time()).snapshot))
        try:
            with Agent(settings, StaticTargets(targets), collectors=collectors) as agent:
                address = urllib.parse.urlsplit(agent.url).netloc
                workdir = tmp_path_factory.mktemp("prom")
                # `namespace` is a target label the ServiceMonitor/PodMonitor adds: attach it as
                # Kubernetes service discovery would, so the namespace variable has a value to list
                with run_prometheus([address], workdir, job=SETTINGS.alerts.agent_job,
                                    rule_files=[build.REPO_ROOT / build.RULES_FILE],
                                    static_configs=[{"targets": [address], "labels": {"namespace": NAMESPACE}}]
                                    ) as prom:
                    prom.wait_for("tierpilot_ttft_seconds_bucket", timeout=30)
                    # changes the annotations mark, after Prometheus has seen the counters at rest
                    tuner.actuation("applied")
                    tuner.actuation("rolled_back")
                    tuner.drift_event("overlap")
                    tuner.trial_finished("complete")
                    shadow.plan(time.time())
                    shadow.change(time.time())
                    prom.wait_for("rate(tierpilot_kv_hit_tokens_total[10s]) > 0", timeout=30)
                    prom.wait_for('increase(tierpilot_actuations_total{result="rolled_back"}[1m]) > 0', timeout=30)
                    prom.wait_for("increase(tierpilot_drift_events_total[1m]) > 0", timeout=30)
                    prom.wait_for("increase(tierpilot_tuner_shadow_moves_total[1m]) > 0", timeout=30)
                    yield prom, tuner
        finally:
            stop.set()
            grower.join(timeout=5)


def _range(prom: PrometheusServer, expr: str) -> list:
    end = time.time()
    return PrometheusSource(prom.url).query_range(expr, end - 15, end, 1)


@pytest.mark.parametrize("ref", QUERIES, ids=[r.where for r in QUERIES])
def test_query_returns_data(live, ref: QueryRef):
    prom, _ = live
    series = _range(prom, expand(ref.expr, ALL))
    values = [v for s in series for v in s.values if not math.isnan(v)]
    assert series and values, f"{ref.where}: no data for\n{expand(ref.expr, ALL)}"


@pytest.mark.parametrize("uid,variable", VARIABLES, ids=[f"{u} ${v.name}" for u, v in VARIABLES])
def test_variable_query_returns_values(live, uid, variable):
    prom, _ = live
    match = expand(f"{variable.metric}{{{variable.selector}}}" if variable.selector else variable.metric, ALL)
    values = prom.api(f"label/{variable.label}/values", **{"match[]": match})
    if variable.label == "namespace":  # the target label the scrape config attaches (see `live`)
        assert values == [NAMESPACE], f"{uid} ${variable.name}: label_values({match}, namespace) = {values}"
        return
    assert values, f"{uid} ${variable.name}: label_values({match}, {variable.label}) is empty"


def test_rules_evaluate_on_the_agents_data(live):
    prom, _ = live
    # p95 TTFT of the fixture is 0.74 s, under the 1 s SLO: error ratio 0 for the model (the native
    # tiering capture's model is a second one)
    errors = prom.wait_for("namespace_model:tierpilot_ttft_slo_errors:ratio_avg5m", timeout=20)
    got = {r["metric"]["model"]: float(r["value"][1]) for r in errors}
    assert set(got) == {MODEL, "tiny-llama"} and got[MODEL] == 0.0
    total = prom.query_value(f'namespace_model:tierpilot_kv_total_hit_ratio:avg{{model="{MODEL}"}}')
    assert total == pytest.approx(0.625)
    # the broken target is down: its alert is pending (for: 5m) and names the role
    pending = prom.wait_for('ALERTS{alertname="TierpilotScrapeTargetsDown"}', timeout=20)
    assert [(a["metric"]["role"], a["metric"]["alertstate"]) for a in pending] == [("vllm", "pending")]
    rules = prom.api("rules")
    health = {r["name"]: r["health"] for g in rules["groups"] for r in g["rules"]}
    assert set(health.values()) == {"ok"}, health


def test_render_cli_draws_the_overview_from_prometheus(live, tmp_path):
    """`tierpilot dashboards render` goes through `render_overview()` and the real query_range API."""
    prom, _ = live
    result = CliRunner().invoke(main, ["dashboards", "render", "--out", str(tmp_path), "--prometheus", prom.url,
                                       "--since", "1m", "--step", "1", "--scrape-interval", "1"])
    assert result.exit_code == 0, result.output
    sheet = tmp_path / "tierpilot-overview.png"
    assert sheet.exists() and sheet.stat().st_size > 50_000
    pngs = sorted(p.name for p in tmp_path.glob("*.png"))
    assert len(pngs) == len(DASHBOARDS[0].panels) + 1
