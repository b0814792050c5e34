"""The peer token check fails closed on any bytes: an `Authorization` header that is not UTF-8
(aiohttp hands it over with surrogate escapes) is refused with a 401 and counted in
`tierpilot_peer_auth_refused_total`, never a 500 with a traceback."""
from __future__ import annotations

import socket
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agent.collect.discovery import StaticTargets
from agent.runtime.app import Agent
from agent.runtime.peer_auth import PeerToken
from agent.settings import load_settings

pytestmark = pytest.mark.timeout(60)


def _token(tmp_path: Path) -> PeerToken:
    path = tmp_path / "token"
    path.write_text("s3cret\n")
    return PeerToken(path)


@settings(max_examples=300, deadline=None)
@given(raw=st.binary(max_size=64))
def test_any_header_bytes_are_refused_or_accepted_never_raised(tmp_path_factory, raw):
    token = _token(tmp_path_factory.mktemp("tok"))
    header = raw.decode("utf-8", "surrogateescape")  # as aiohttp decodes a header
    before = token.refused
    ok = token.accepts("Bearer " + header)
    assert ok == (raw.strip() == b"s3cret")
    assert token.refused == before + (0 if ok else 1)
    scheme, _, rest = raw.partition(b" ")
    assert token.accepts(header) is (scheme.lower() == b"bearer" and rest.strip() == b"s3cret")


def _raw_get(port: int, path: str, header: bytes) -> bytes:
    with socket.create_connection(("127.0.0.1", port), timeout=5) as sock:
        sock.sendall(b"GET " + path.encode() + b" HTTP/1.1\r\nHost: x\r\nConnection: close\r\n"
                     b"Authorization: " + header + b"\r\n\r\n")
        chunks = []
        while chunk := sock.recv(65536):
            chunks.append(chunk)
    return b"".join(chunks)


def test_a_non_utf8_token_gets_401_and_is_counted(tmp_path, caplog):
    token = tmp_path / "token"
    token.write_text("s3cret\n")
    settings_ = load_settings(env={}, server={"host": "127.0.0.1", "port": 0}, scrape={"interval_s": 3600},
                              shard={"count": 2, "index": 1, "token_file": str(token)})
    agent = Agent(settings_, StaticTargets(()))
    agent.start()
    try:
        port = int(agent.url.rsplit(":", 1)[1].split("/")[0])
        for header in (b"Bearer \xff\xfe", b"Bearer s3cret\xc3", b"\xff\xff s3cret", b"Bearer \xed\xa0\x80"):
            answer = _raw_get(port, "/window?window_s=60", header)
            assert answer.startswith(b"HTTP/1.1 401"), answer[:200]
        assert _raw_get(port, "/window?window_s=60", b"Bearer s3cret").startswith(b"HTTP/1.1 200")
        metrics = _raw_get(port, "/metrics", b"none")
        assert b"tierpilot_peer_auth_refused_total 4.0" in metrics
        assert "Traceback" not in caplog.text and "Error handling request" not in caplog.text
    finally:
        agent.stop()
