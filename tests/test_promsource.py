"""`source: prometheus` units and faults: settings, query shapes, auth headers, and a query API
that is down, slow, erroring or reporting `up == 0` (reasoned status, nothing else lost)."""
from __future__ import annotations

import asyncio
import base64
import json
import re
import threading
import time
from collections.abc import Iterator

import pytest
from aiohttp import web

from agent.collect.discovery import StaticTargets
from agent.collect.mapping import load_mappings
from agent.collect.prom.frame import Labelling, RoleGroup, plan, split_vector
from agent.runtime.app import Agent
from agent.settings import SettingsError, load_settings
from tests.support.prometheus import free_port

VLLM = {"__name__": "vllm:prefix_cache_queries_total", "pod": "vllm-0", "namespace": "llm",
        "model_name": "m", "engine": "0", "job": "vllm", "instance": "10.0.0.1:8000"}


def _vector(*series: tuple[dict, float]) -> dict:
    return {"status": "success", "data": {"resultType": "vector",
                                          "result": [{"metric": m, "value": [time.time(), str(v)]} for m, v in series]}}


class FakeQueryApi:
    """A loopback server speaking the query API's wire format with canned answers; `mode` makes it
    slow, fail with HTTP 503, or answer `status: error`. Records the requests' headers and forms."""

    def __init__(self) -> None:
        self.mode = "ok"
        self.aggregate = "server"
        self.fail_range = False
        self.paths: list[tuple[str, str]] = []
        self.up = 1.0
        self.requests: list[tuple[dict, dict]] = []
        self.port = free_port()
        self._loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    async def _handle(self, request: web.Request) -> web.Response:
        form = dict(await request.post())
        self.requests.append((dict(request.headers), form))
        self.paths.append((request.path, form.get("query", "")))
        if self.fail_range and (request.path.endswith("query_range") or "min_over_time" in form.get("query", "")):
            return web.Response(status=503, text="unavailable")  # the backfill's queries only
        if self.mode == "slow":
            await asyncio.sleep(3)
        if self.mode == "503":
            return web.Response(status=503, text="unavailable")
        if self.mode == "error":
            return web.json_response({"status": "error", "errorType": "timeout", "error": "query timed out"},
                                     status=503)
        q = form["query"]
        agg = re.match(r"sum by \(([^)]*)\) \(([a-zA-Z_:]+)\{", q)
        if agg:  # aggregate: server, one rule's part: the series grouped by the listed labels
            by = [x.strip() for x in agg.group(1).split(",")]
            labels = {k: v for k, v in VLLM.items() if k in by}
            return web.json_response(_vector((labels, 500.0 if "hits" in agg.group(2) else 1000.0)))
        if q.startswith("up"):
            return web.json_response(_vector(({k: v for k, v in VLLM.items() if k != "__name__"}
                                               | {"__name__": "up"}, self.up)))
        hits = {**VLLM, "__name__": "vllm:prefix_cache_hits_total"}
        if q.startswith("("):  # an increase query: no __name__ on increase()'s part
            name = q[1:].split("{", 1)[0]
            labels = {k: v for k, v in VLLM.items() if k != "__name__"}
            return web.json_response(_vector((labels, 100.0 if "queries" in name else 25.0)))
        return web.json_response(_vector((VLLM, 1000.0), (hits, 500.0)))

    async def _names(self, request: web.Request) -> web.Response:
        self.requests.append((dict(request.headers), dict(request.query)))
        if self.mode != "ok":
            return await self._handle(request)
        return web.json_response({"status": "success", "data": [VLLM["__name__"], "vllm:prefix_cache_hits_total"]})

    def _run(self) -> None:
        asyncio.set_event_loop(self._loop)
        app = web.Application()
        app.router.add_get("/api/v1/label/__name__/values", self._names)
        app.router.add_post("/api/v1/query", self._handle)
        app.router.add_post("/api/v1/query_range", self._handle)
        runner = web.AppRunner(app)
        self._loop.run_until_complete(runner.setup())
        self._loop.run_until_complete(web.TCPSite(runner, "127.0.0.1", self.port).start())
        self._ready.set()
        self._loop.run_forever()
        self._loop.run_until_complete(runner.cleanup())

    def start(self) -> None:
        self._thread.start()
        self._ready.wait(5)

    def stop(self) -> None:
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(5)


@pytest.fixture(params=["server", "agent"])
def api(request) -> Iterator[FakeQueryApi]:
    """The fake query API, once for each `aggregate` mode (the agent built by `_agent` uses it)."""
    server = FakeQueryApi()
    server.aggregate = request.param
    server.start()
    yield server
    server.stop()


def _agent(url: str, aggregate: str = "server", **prom) -> Agent:
    settings = load_settings(env={}, source="prometheus", prometheus={"url": url, "timeout_s": 1.0,
                                                                     "backfill": False, "aggregate": aggregate,
                                                                     **prom})
    return Agent(settings, StaticTargets(()))


def test_settings_need_a_url_and_one_kind_of_auth(tmp_path):
    with pytest.raises(SettingsError, match="prometheus.url"):
        load_settings(env={}, source="prometheus")
    with pytest.raises(SettingsError, match="not both"):
        load_settings(env={}, prometheus={"url": "http://p:9090", "bearer_token_file": str(tmp_path / "t"),
                                          "basic_auth": {"username": "u", "password_file": str(tmp_path / "p")}})
    with pytest.raises(SettingsError, match="cert_file and key_file"):
        load_settings(env={}, prometheus={"url": "http://p:9090", "tls": {"cert_file": str(tmp_path / "c")}})
    env = {"TIERPILOT_SOURCE": "prometheus", "TIERPILOT_PROMETHEUS__URL": "https://thanos:10902/"}
    s = load_settings(env=env)
    assert s.source == "prometheus" and s.prometheus.url == "https://thanos:10902"


def test_query_plan_reads_only_mapped_names_and_keeps_series_born_in_the_window():
    mappings = load_mappings()
    (everything,) = plan(mappings, {})
    assert everything.role is None and "vllm:prefix_cache_hits_total" in everything.names
    assert "vllm:kv_cache_usage_perc" in everything.names and "vllm:kv_cache_usage_perc" not in everything.counters
    groups = plan(mappings, {"vllm": '{job="vllm"}', "curvine-fuse": 'job="fuse"'})
    assert [g.role for g in groups] == ["vllm", "curvine-fuse"]
    assert groups[0].last_query().endswith(',job="vllm"}') and groups[0].up_query() == 'up{job="vllm"}'
    q = groups[0].increase_query("vllm:prompt_tokens_total", 300)
    assert q == ('(vllm:prompt_tokens_total{job="vllm"} unless vllm:prompt_tokens_total{job="vllm"} offset 300s)'
                 ' or increase(vllm:prompt_tokens_total{job="vllm"}[300s])')
    # pods from `pod`, else `instance`; roles from `job`, else from the metric name
    into: dict = {}
    split_vector([{"metric": {"__name__": "curvine_fuse_io_bytes_total", "instance": "n1:9003"}, "value": [0, "5"]},
                  {"metric": {"__name__": "vllm:prompt_tokens_total", "pod": "a", "job": "router"},
                   "value": [0, "7"]}],
                 RoleGroup(None, "", (), frozenset()), Labelling(), {"curvine_fuse_io_bytes_total": "curvine-fuse"},
                 into)
    assert set(into) == {("curvine-fuse", "n1:9003", ""), ("router", "a", "")}


def test_bearer_token_and_basic_auth_are_read_from_files_each_cycle(api, tmp_path):
    token = tmp_path / "token"
    token.write_text("s3cret\n")
    agent = _agent(api.url, api.aggregate, bearer_token_file=str(token))
    snap = agent.scrape_now()
    assert all(h["Authorization"] == "Bearer s3cret" for h, _ in api.requests)
    # agent-side: the window's `increase()` (25 of 100); server-side: the store differences the
    # lifetime values between cycles, so the first cycle has lifetime totals only (500 of 1000)
    assert [t.tier for t in snap.tiers] == ["gpu"]
    assert snap.tiers[0].hit_ratio == (0.25 if api.aggregate == "agent" else 0.5)
    token.write_text("rotated")
    api.requests.clear()
    agent.scrape_now()
    assert api.requests and all(h["Authorization"] == "Bearer rotated" for h, _ in api.requests)
    pw = tmp_path / "pw"
    pw.write_text("hunter2\n")
    api.requests.clear()
    _agent(api.url, api.aggregate, basic_auth={"username": "agent", "password_file": str(pw)}).scrape_now()
    assert api.requests[0][0]["Authorization"] == "Basic " + base64.b64encode(b"agent:hunter2").decode()
    # the server-side timeout travels with every query, below the client's
    assert all(float(form["timeout"]) < 1.0 for _, form in api.requests if "query" in form)


@pytest.mark.parametrize(("mode", "reason"), [("slow", "timeout"), ("503", "http_5xx"), ("error", "query_error")])
def test_failing_query_api_marks_targets_down_and_keeps_the_last_answer(api, mode, reason):
    agent = _agent(api.url, api.aggregate)
    good = agent.scrape_now()
    rows = agent.store.rows
    assert good.targets[0].up and good.tiers
    api.mode = mode
    bad = agent.scrape_now()
    (status,) = bad.targets
    assert not status.up and status.reason == reason and "Prometheus query failed" in status.detail
    assert status.errors == {reason: 1}
    assert bad.tiers == good.tiers  # the previous answer, not a gap
    assert agent.store.rows == rows  # nothing stale written to the window
    api.mode = "ok"
    again = agent.scrape_now()
    assert again.targets[0].up and again.targets[0].errors == {reason: 1}


@pytest.mark.parametrize("aggregate", ["server", "agent"])
def test_unreachable_query_api_is_one_reasoned_status(aggregate):
    snap = _agent(f"http://127.0.0.1:{free_port()}", aggregate).scrape_now()
    (status,) = snap.targets
    assert not status.up and status.reason == "connection_refused" and status.target.pod == "prometheus"
    assert not snap.tiers


def test_target_prometheus_cannot_scrape_is_down_with_reason(api):
    api.up = 0.0
    snap = _agent(api.url, api.aggregate).scrape_now()
    (status,) = snap.targets
    assert not status.up and status.reason == "target_down" and "10.0.0.1:8000" in status.detail
    text = json.dumps([t.pod for t in snap.tiers])
    assert "vllm-0" in text  # its last series Prometheus still has are kept


def test_query_concurrency_gate_survives_one_event_loop_per_cycle(api):
    agent = _agent(api.url, api.aggregate, concurrency=1)  # every query waits for the gate
    for _ in range(2):  # scrape_now runs each cycle on a fresh event loop
        snap = agent.scrape_now()
        assert snap.targets[0].up and snap.tiers


def test_unreadable_tls_files_are_a_reasoned_status_until_they_appear(api, tmp_path):
    import shutil
    import ssl

    ca = tmp_path / "ca.pem"  # not there yet (a Secret being rotated)
    agent = _agent(api.url, api.aggregate, tls={"ca_file": str(ca)})
    (status,) = agent.scrape_now().targets
    assert not status.up and status.reason == "tls_error" and "ca.pem" in status.detail
    assert status.target.pod == "prometheus" and status.errors == {"tls_error": 1}  # nothing known yet
    shutil.copy(ssl.get_default_verify_paths().cafile, ca)
    snap = agent.scrape_now()
    assert snap.targets[0].up and snap.tiers


def test_a_failing_backfill_is_given_up_after_three_attempts(api):
    from agent.collect.prom.source import BACKFILL_ATTEMPTS

    settings = load_settings(env={}, source="prometheus", prometheus={
        "url": api.url, "timeout_s": 1.0, "backfill": True, "aggregate": api.aggregate})
    agent = Agent(settings, StaticTargets(()))
    api.fail_range = True  # the cycle's own queries answer; the backfill's do not
    for attempt in range(1, BACKFILL_ATTEMPTS + 1):
        assert agent.scrape_now().targets[0].up
        assert agent.cycle.backfilled == (attempt == BACKFILL_ATTEMPTS)
    asked = len(api.paths)
    agent.scrape_now()
    assert api.paths[asked:] and not any(path.endswith("query_range") or "min_over_time" in query
                                         for path, query in api.paths[asked:])
