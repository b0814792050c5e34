"""Redaction that cannot be tricked: userinfo read the way the HTTP client (yarl) reads it, and
secret query parameters however their names are encoded. The property test scrapes generated URLs
with a running agent and looks for the secrets in everything it serves and logs."""
from __future__ import annotations

import json
import logging
import socket
import string
import urllib.request
from pathlib import Path
from urllib.parse import quote

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from yarl import URL

from agent.runtime.app import Agent
from agent.settings import load_settings
from contracts.redact import redact_text, redact_url
from contracts.tier_model import Target
from tests.support.fake_targets import MetricsServer

GOOD = (Path(__file__).parent / "fixtures" / "vllm_0_33_dp2.prom").read_text()


@pytest.mark.parametrize("url, redacted", [
    ("http://u:p@ssw0rd@host/m", "http://***@host/m"),
    ("http://u:p:w@h:8000/m", "http://***@h:8000/m"),
    ("http://u%40x:p%3Aw@h/m", "http://***@h/m"),
    ("http://u:" + "x" * 5000 + "@h/m", "http://***@h/m"),
    ("http://u:pa/ss@h/m", "http://***@h/m"),  # a raw "/" in a password: not a URL, still hidden
    ("http://h/m?%74oken=abc&x=1", "http://h/m?%74oken=***&x=1"),
    ("http://h/m?%2574oken=abc", "http://h/m?%2574oken=***"),
    ("http://h/m?X-Amz-Signature=abc&api%5Fkey=d&Pass+word=e", "http://h/m?X-Amz-Signature=***&api%5Fkey=***&Pass+word=***"),
    ("http://h/m#access_token=abc", "http://h/m#access_token=***"),
    ("http://[fd00::5]:8000/@evil.example/metrics", "http://[fd00::5]:8000/@evil.example/metrics"),
    ("http://h:8000/metrics?format=text", "http://h:8000/metrics?format=text"),
])
def test_redact_url(url, redacted):
    assert redact_url(url) == redacted


def test_userinfo_is_where_the_http_client_finds_it():
    for url in ("http://u:p@ssw0rd@h/m", "http://a@b:c@d@h:81/m", "http://u:" + "@" * 300 + "x@h/m"):
        parsed = URL(url)
        assert (parsed.host, redact_url(url)) == ("h", "http://***@" + url.rsplit("@", 1)[1])


def test_redact_text_finds_every_url_and_stays_linear():
    msg = "GET http://a:b@h1/x then https://c:d@e@h2:9/y?token=t failed"
    assert redact_text(msg) == "GET http://***@h1/x then https://***@h2:9/y?token=*** failed"
    big = ("http://" + "a" * 200_000 + " ") * 5 + "?" + "b" * 200_000 + "@"
    assert redact_text(big) == big  # nothing to hide (and it returns at once)


# -- property: nothing secret in /metrics, /snapshot, /healthz or the logs -------------------------

MARKS = ("Qz7mark0", "Qz7mark1", "Qz7mark2")  # in every secret: at its start, middle and end
TRICKY = string.ascii_letters + string.digits + "@:%+!$&'()*,;=~._- "
SECRET_KEYS = ("token", "access_token", "api_key", "password", "X-Amz-Signature", "sig", "client_secret",
               "auth")


class Targets:
    def __init__(self) -> None:
        self.current: tuple[Target, ...] = ()

    def targets(self) -> tuple[Target, ...]:
        return self.current


class Records(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.texts: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.texts.append(logging.Formatter("%(name)s %(message)s").format(record))


@pytest.fixture(scope="module")
def running():
    server = MetricsServer()
    server.route("/metrics", text=GOOD)
    closed = socket.socket()
    closed.bind(("127.0.0.1", 0))
    dead_port = closed.getsockname()[1]  # bound, never listening: connection refused
    source = Targets()
    agent = Agent(load_settings(env={}, server={"host": "127.0.0.1", "port": 0, "snapshot": True},
                                scrape={"backoff_base_s": 0, "timeout_s": 2.0}), source)
    records = Records()
    root = logging.getLogger()
    old_level = root.level
    root.addHandler(records)
    root.setLevel(logging.DEBUG)
    agent.start()
    try:
        yield server, dead_port, source, agent, records
    finally:
        agent.stop()
        root.removeHandler(records)
        root.setLevel(old_level)
        closed.close()
        server.close()


def _secret(draw) -> str:
    parts = [draw(st.text(TRICKY, max_size=12)) for _ in range(2)]
    return MARKS[0] + parts[0] + MARKS[1] + parts[1] + MARKS[2]


@st.composite
def secret_urls(draw, port: int, dead_port: int) -> str:
    secret = _secret(draw)
    form = draw(st.sampled_from(["encoded", "raw_at_colon", "raw_unsafe", "long", "query", "both"]))
    user = draw(st.sampled_from(["scraper", "a@b", "u:v", ""]))
    path = draw(st.sampled_from(["/metrics", "/missing"]))
    where = draw(st.sampled_from([port, port, dead_port]))
    if form == "encoded":
        userinfo = f"{quote(user, safe='')}:{quote(secret, safe='')}@"
    elif form == "raw_at_colon":  # `@` and `:` left raw, as a user pasting a password would
        userinfo = f"{user}:{quote(secret, safe='@:')}@"
    elif form == "raw_unsafe":  # a raw "/", "?" or "#" in the password: yarl cannot parse it
        userinfo = f"scraper:{secret[:8]}{draw(st.sampled_from('/?#'))}{quote(secret[8:], safe='@:')}@"
    elif form == "long":
        userinfo = f"{'u' * draw(st.integers(1000, 3000))}:{quote(secret, safe='@:')}@"
    else:
        userinfo = ""
    query = ""
    if form in ("query", "both"):
        key = draw(st.sampled_from(SECRET_KEYS))
        encode = draw(st.lists(st.booleans(), min_size=len(key), max_size=len(key)))
        key = "".join(f"%{ord(c):02X}" if e else c for c, e in zip(key, encode, strict=True))
        query = f"?format=text&{key}={quote(secret, safe='')}"
        if form == "both":
            userinfo = f"{quote(user, safe='')}:{quote(secret, safe='@:')}@"
    return f"http://{userinfo}127.0.0.1:{where}{path}{query}"


def _served(agent: Agent) -> str:
    base = agent.url.rsplit("/", 1)[0]
    out = []
    for path in ("/metrics", "/snapshot", "/healthz"):
        try:
            with urllib.request.urlopen(base + path, timeout=10) as resp:
                out.append(resp.read().decode())
        except urllib.error.HTTPError as exc:  # /healthz may say 503; its body still counts
            out.append(exc.read().decode())
    return "\n".join(out)


def test_no_secret_is_ever_served_or_logged(running):
    server, dead_port, source, agent, records = running

    @settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture,
                                                                     HealthCheck.too_slow])
    @given(st.lists(secret_urls(server.port, dead_port), min_size=1, max_size=3))
    def check(urls: list[str]) -> None:
        records.texts.clear()
        source.current = tuple(Target(u, "vllm", f"p{i}") for i, u in enumerate(urls))
        snap = agent.scrape_now(20)
        assert len(snap.targets) == len(urls)
        exported = _served(agent) + "\n".join(records.texts)
        json.loads(_served_json(agent))  # /snapshot stays valid JSON
        for mark in MARKS:
            assert mark not in exported, (urls, [line for line in exported.splitlines() if mark in line][:3])
            assert mark.lower() not in exported.lower()

    check()


def _served_json(agent: Agent) -> str:
    with urllib.request.urlopen(agent.url.replace("/metrics", "/snapshot"), timeout=10) as resp:
        return resp.read().decode()
