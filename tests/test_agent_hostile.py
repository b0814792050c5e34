"""Hostile targets on loopback servers: every attack is survived, the attacker is down with a clear
reason, the other targets keep all their data, and nothing the attacker sent (or a credential)
reaches /metrics, /snapshot or the logs."""
from __future__ import annotations

import json
import logging
import re
import urllib.error
import urllib.request
from pathlib import Path

import pytest
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.parser import text_string_to_metric_families

from agent.collect.discovery import StaticTargets, endpoint_url, pod_target
from agent.runtime.app import Agent
from agent.runtime.payloads import snapshot_json
from agent.settings import RoleDiscovery, load_settings
from contracts.redact import redact_text, redact_url
from contracts.tier_model import Target
from tests.support.fake_targets import MetricsServer

FIXTURES = Path(__file__).parent / "fixtures"
GOOD = (FIXTURES / "vllm_0_33_dp2.prom").read_text()
SECRET = "AKIAIOSFODNN7EXAMPLE"  # what a fake metadata service would hand out


def settings(**over):
    scrape = {"timeout_s": 2.0, "max_body_bytes": 4 << 20, "backoff_base_s": 0, "sample_limit": 5000,
              "label_limit": 16, "label_value_length_limit": 1024, **over.pop("scrape", {})}
    return load_settings(scrape=scrape, **over)


def attacks(server: MetricsServer, elsewhere: MetricsServer) -> dict[str, tuple[str, str]]:
    """pod -> (url, the reason its target must be down with)."""
    many = "".join(f'vllm:num_requests_running{{engine="{i}",model_name="m"}} 1\n' for i in range(6000))
    wide = "vllm:num_requests_running{" + ",".join(f'l{i}="v"' for i in range(40)) + "} 1\n"
    dup = 'vllm:prefix_cache_hits_total{engine="0",model_name="m"} 5\n' * 50
    elsewhere.route("/latest/meta-data/iam", text=f"# {SECRET}\nsecret 1\n")
    return {
        "freeze": (server.route("/freeze", text=GOOD + "junk{" + 'a="1"  ' * 40 + "\n"), "parse_error"),
        "huge_label": (server.route("/huge", text=GOOD + 'x{a="' + "v" * (3 << 20) + '"} 1\n'), "label_length"),
        "many": (server.route("/many", text=many), "sample_limit"),
        "wide": (server.route("/wide", text=wide), "label_limit"),
        "dup": (server.route("/dup", text=dup), "duplicate_series"),
        "leak": (server.route("/leak", body=f"<html>{SECRET}</html>\n".encode()), "parse_error"),
        "redirect": (server.route("/redirect", redirect=elsewhere.url("/latest/meta-data/iam")), "redirect"),
    }


def test_every_attack_is_survived_with_a_reason_and_nothing_else_is_lost(caplog):
    caplog.set_level(logging.DEBUG)
    with MetricsServer() as server, MetricsServer() as elsewhere:
        bad = attacks(server, elsewhere)
        good_url = server.route("/good", text=GOOD)
        user_url = good_url.replace("http://", f"http://scraper:{SECRET}@")
        targets = [Target(good_url, "vllm", "good"), Target(user_url, "vllm", "authed")]
        targets += [Target(url, "vllm", pod) for pod, (url, _) in bad.items()]
        agent = Agent(settings(), StaticTargets(targets))
        reference = Agent(settings(), StaticTargets([Target(good_url, "vllm", "good")]))
        snap, ref = agent.scrape_now(), reference.scrape_now()
        status = {s.target.pod: s for s in snap.targets}
        for pod, (_, reason) in bad.items():
            assert not status[pod].up and status[pod].reason == reason, (pod, status[pod])
            assert status[pod].errors[reason] == (49 if pod == "dup" else 1)  # dup: the 49 repeats dropped
        assert status["good"].up and status["authed"].up
        assert elsewhere.hits == {}, "the redirect to another origin was followed"
        # the good target's data is exactly what it is without the attackers
        assert [t for t in snap.tiers if t.pod == "good"] == [t for t in ref.tiers if t.pod == "good"]
        assert {t.pod for t in snap.tiers} == {"good", "authed"}
        metrics = agent.metrics_text()
        exported = metrics + snapshot_json(snap) + caplog.text
        assert SECRET not in exported and "AKIA" not in exported and "junk" not in exported
        assert "vvvvvvvv" not in exported
        ups = {s.labels["pod"]: (s.labels["target"], s.value) for f in text_string_to_metric_families(metrics)
               for s in f.samples if s.name == "tierpilot_target_up"}
        assert ups["authed"] == (good_url.replace("http://", "http://***@"), 1.0)
        assert ups["freeze"][1] == 0.0


def test_a_failing_collector_drops_only_its_own_series():
    class Dead:
        def collect(self):
            raise RuntimeError(f"KV thread died (dsn postgresql://u:{SECRET}@db/x)")

    class Alive:
        def collect(self):
            g = GaugeMetricFamily("tierpilot_test_alive", "alive")
            g.add_metric([], 1.0)
            yield g

    with MetricsServer() as server:
        url = server.route("/good", text=GOOD)
        agent = Agent(settings(server={"host": "127.0.0.1", "port": 0}), StaticTargets([Target(url, "vllm", "v")]),
                      collectors=[Dead(), Alive()])
        agent.start()
        try:
            agent.scrape_now(10)
            with urllib.request.urlopen(agent.url) as resp:
                assert resp.status == 200
                body = resp.read().decode()
            assert "tierpilot_test_alive 1.0" in body and 'tierpilot_target_up{' in body
            assert 'tierpilot_collector_up{collector="dead"} 0.0' in body
            assert 'tierpilot_collector_up{collector="alive"} 1.0' in body
            assert SECRET not in body
            health = json.loads(urllib.request.urlopen(agent.url.replace("/metrics", "/healthz")).read())
            assert health["degraded"] == ["collector:dead"]
            assert health["checks"]["collector:dead"].startswith("failing: RuntimeError: KV thread died")
            assert SECRET not in json.dumps(health)
        finally:
            agent.stop()


@pytest.mark.parametrize("enabled, status", [(False, 404), (True, 200)])
def test_snapshot_is_off_by_default_and_loopback_only(enabled, status):
    assert load_settings().server.snapshot is False
    agent = Agent(settings(server={"host": "127.0.0.1", "port": 0, "snapshot": enabled}), StaticTargets([]))
    agent.start()
    try:
        url = agent.url.replace("/metrics", "/snapshot")
        try:
            got = urllib.request.urlopen(url).status
        except urllib.error.HTTPError as exc:
            got = exc.code
        assert got == status
    finally:
        agent.stop()


def test_non_loopback_clients_are_refused_the_snapshot():
    from agent.runtime.endpoints import is_loopback as _is_loopback

    assert _is_loopback("127.0.0.1") and _is_loopback("::1")
    assert not _is_loopback("10.0.0.7") and not _is_loopback(None) and not _is_loopback("garbage")


@pytest.mark.parametrize("scheme, port, path", [
    ("http://127.0.0.2:18090/latest#", "8000", "/metrics"),  # the scheme that turned the pod URL into a fragment
    ("gopher", "8000", "/metrics"),
    ("http", "80a", "/metrics"), ("http", " 80", "/metrics"), ("http", "0", "/metrics"), ("http", "65536", "/m"),
    ("http", "8000", "metrics"), ("http", "8000", "//169.254.169.254/x"), ("http", "8000", "/m#frag"),
    ("http", "8000", "/m x"), ("http", "8000", "/m\\..\\x"),
])
def test_bad_annotations_skip_the_pod(scheme, port, path):
    with pytest.raises(ValueError):
        endpoint_url("10.0.0.5", scheme, port, path)
    pod = {"metadata": {"name": "p", "namespace": "n", "annotations": {
        "prometheus.io/scheme": scheme, "prometheus.io/port": port, "prometheus.io/path": path}},
        "spec": {}, "status": {"phase": "Running", "podIP": "10.0.0.5"}}
    assert pod_target(pod, "vllm", RoleDiscovery(selector="app=vllm")) is None


def test_good_annotations_stay_on_the_pod_ip():
    assert endpoint_url("10.0.0.5", "https", "8443", "/m?format=text") == "https://10.0.0.5:8443/m?format=text"
    assert endpoint_url("fd00::5", "http", 8000, "/@evil.example/metrics") == "http://[fd00::5]:8000/@evil.example/metrics"
    with pytest.raises(ValueError):
        endpoint_url("metadata.google.internal", "http", "80", "/")


def test_same_origin_redirects_are_followed():
    with MetricsServer() as server:
        final = server.route("/real", text=GOOD)
        hop = server.route("/hop", redirect="/real")
        snap = Agent(settings(), StaticTargets([Target(hop, "vllm", "v")])).scrape_now()
        assert snap.targets[0].up and server.hits["/real"] == 1 and final


def test_redaction():
    assert redact_url("http://u:p@10.0.0.5:8000/metrics") == "http://***@10.0.0.5:8000/metrics"
    assert redact_url("http://10.0.0.5/m?api_token=abc&x=1") == "http://10.0.0.5/m?api_token=***&x=1"
    assert redact_text("connect to https://a:b@h/x failed") == "connect to https://***@h/x failed"
    assert redact_url("http://10.0.0.5:8000/metrics") == "http://10.0.0.5:8000/metrics"


@pytest.mark.parametrize("override, key", [
    ({"scrape": {"max_body_bytes": 10**12}}, "scrape.max_body_bytes"),
    ({"scrape": {"sample_limit": 10**9}}, "scrape.sample_limit"),
    ({"scrape": {"label_value_length_limit": 10**9}}, "scrape.label_value_length_limit"),
    ({"scrape": {"concurrency": 10**6}}, "scrape.concurrency"),
    ({"scrape": {"max_models_per_target": 10**9}}, "scrape.max_models_per_target"),
    ({"scrape": {"max_series_per_target": 10**9}}, "scrape.max_series_per_target"),
    ({"store": {"retention_s": 1e12}}, "store.retention_s"),
    ({"tuner": {"trials_per_phase": 10**9}}, "tuner.trials_per_phase"),
    ({"tuner": {"warm_start": {"max_requests": 10**12}}}, "tuner.warm_start.max_requests"),
    ({"tuner": {"limits": {"pods": 10**9}}}, "tuner.limits.pods"),
    ({"tuner": {"guardrails": {"cooldown_s": 1e12}}}, "tuner.guardrails.cooldown_s"),
])
def test_every_size_setting_has_an_upper_bound(override, key):
    from agent.settings import SettingsError

    with pytest.raises(SettingsError, match=rf"key '{re.escape(key)}': Input should be less than or equal to"):
        load_settings(env={}, **override)


def test_a_bad_targets_file_never_logs_its_credentials(tmp_path, caplog):
    from agent.collect.discovery import FileTargets

    path = tmp_path / "targets.yaml"
    path.write_text(f'targets:\n  - {{url: "ftp://scraper:{SECRET}@10.0.0.5/m", role: vllm, pod: p}}\n')
    with caplog.at_level(logging.ERROR):
        source = FileTargets(path)
    assert source.targets() == () and "url must start with http" in source.last_error
    assert SECRET not in source.last_error and SECRET not in caplog.text
