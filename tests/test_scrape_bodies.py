"""A body is complete or it is refused: over real HTTP, from a raw-socket server that sends exactly
the bytes each case needs (a gzip stream without its trailer, a short Content-Length, a chunked body
cut mid-way). The target is down with a reason and its pod keeps its last good values."""
from __future__ import annotations

import gzip
import socket
import threading
import zlib
from pathlib import Path

import pytest

from agent.collect.discovery import StaticTargets
from agent.runtime.app import Agent
from agent.settings import load_settings
from contracts.tier_model import Target

GOOD = (Path(__file__).parent / "fixtures" / "vllm_0_33_dp2.prom").read_text().encode()
HEAD = b"HTTP/1.1 200 OK\r\nContent-Type: text/plain; version=0.0.4\r\nConnection: close\r\n"


def _gzip_without_trailer(body: bytes) -> bytes:
    """A gzip stream cut at a line boundary: header and deflate blocks up to a flush, no final
    block, no CRC32/size trailer (what a proxy that gave up mid-stream forwards)."""
    cut = body[: body.rfind(b"\n", 0, len(body) // 2) + 1]
    comp = zlib.compressobj(6, zlib.DEFLATED, 31)
    return comp.compress(cut) + comp.flush(zlib.Z_SYNC_FLUSH)


def _chunked(body: bytes, cut: bool) -> bytes:
    chunks = [body[i:i + 4096] for i in range(0, len(body), 4096)]
    out = b"".join(b"%x\r\n%s\r\n" % (len(c), c) for c in chunks)
    if cut:
        return out[: len(out) // 2]  # mid-way through a chunk, no terminating 0-chunk
    return out + b"0\r\n\r\n"


def responses() -> dict[str, bytes]:
    gz_good = gzip.compress(GOOD)
    gz_cut = _gzip_without_trailer(GOOD)
    half = GOOD[: len(GOOD) // 2]
    om = GOOD.rstrip(b"\n") + b"\n"
    om_head = HEAD.replace(b"text/plain; version=0.0.4", b"application/openmetrics-text; version=1.0.0; charset=utf-8")
    return {
        "/openmetrics": om_head + b"Content-Length: %d\r\n\r\n" % (len(om) + 6) + om + b"# EOF\n",
        "/openmetrics-no-eof": om_head + b"Content-Length: %d\r\n\r\n" % len(om) + om,
        "/good": HEAD + b"Content-Length: %d\r\n\r\n" % len(GOOD) + GOOD,
        "/gzip": HEAD + b"Content-Encoding: gzip\r\nContent-Length: %d\r\n\r\n" % len(gz_good) + gz_good,
        "/gzip-no-trailer": HEAD + b"Content-Encoding: gzip\r\nContent-Length: %d\r\n\r\n" % len(gz_cut) + gz_cut,
        "/gzip-no-trailer-no-length": HEAD + b"Content-Encoding: gzip\r\n\r\n" + gz_cut,
        "/gzip-garbage-after": HEAD + b"Content-Encoding: gzip\r\n\r\n" + gz_good + b"extra",
        "/gzip-two-members": HEAD + b"Content-Encoding: gzip\r\n\r\n" + gzip.compress(GOOD[:1000])
                             + gzip.compress(GOOD[1000:]),
        "/short-length": HEAD + b"Content-Length: %d\r\n\r\n" % len(GOOD) + half,
        "/chunked": HEAD + b"Transfer-Encoding: chunked\r\n\r\n" + _chunked(GOOD, cut=False),
        "/chunked-cut": HEAD + b"Transfer-Encoding: chunked\r\n\r\n" + _chunked(GOOD, cut=True),
        "/gzip-empty": HEAD + b"Content-Encoding: gzip\r\nContent-Length: 0\r\n\r\n",
        "/deflate-empty": HEAD + b"Content-Encoding: deflate\r\nContent-Length: 0\r\n\r\n",
        "/gzip-empty-no-length": HEAD + b"Content-Encoding: gzip\r\n\r\n",
        "/chunked-gzip-empty": HEAD + b"Content-Encoding: gzip\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n",
        "/chunked-gzip-cut": HEAD + b"Content-Encoding: gzip\r\nTransfer-Encoding: chunked\r\n\r\n"
                              + _chunked(gz_cut, cut=False),
    }


class RawServer:
    """Answers each request with the exact bytes of its path, then closes the connection."""

    def __init__(self, answers: dict[str, bytes]) -> None:
        self.answers = answers
        self.current: dict[str, str] = {}  # path -> the path whose bytes it answers with now
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        self.sock.settimeout(0.2)
        while not self._stop.is_set():
            try:
                conn, _ = self.sock.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            with conn:
                conn.settimeout(2)
                data = b""
                try:
                    while b"\r\n\r\n" not in data:
                        more = conn.recv(65536)
                        if not more:
                            break
                        data += more
                    path = data.split(b" ", 2)[1].decode() if data.count(b" ") >= 2 else "/"
                    conn.sendall(self.answers.get(self.current.get(path, path), b"HTTP/1.1 404 Not Found\r\n"
                                                                                  b"Content-Length: 0\r\n\r\n"))
                    conn.shutdown(socket.SHUT_WR)
                except OSError:
                    pass

    def url(self, path: str) -> str:
        return f"http://127.0.0.1:{self.port}{path}"

    def close(self) -> None:
        self._stop.set()
        self.sock.close()
        self._thread.join(2)


@pytest.fixture(scope="module")
def server():
    srv = RawServer(responses())
    yield srv
    srv.close()


def _agent(url: str) -> Agent:
    return Agent(load_settings(env={}, scrape={"timeout_s": 3.0, "backoff_base_s": 0}),
                 StaticTargets([Target(url, "vllm", "p")]))


@pytest.mark.parametrize("path", ["/good", "/gzip", "/chunked", "/gzip-two-members", "/openmetrics"])
def test_complete_bodies_are_read(server, path):
    snap = _agent(server.url(path)).scrape_now()
    assert snap.targets[0].up, snap.targets[0]
    assert snap.targets[0].samples == sum(1 for line in GOOD.splitlines() if line and not line.startswith(b"#"))


@pytest.mark.parametrize("path, reason", [
    ("/gzip-no-trailer", "incomplete_body"), ("/gzip-no-trailer-no-length", "incomplete_body"),
    ("/short-length", "incomplete_body"), ("/chunked-cut", "incomplete_body"),
    ("/chunked-gzip-cut", "incomplete_body"), ("/gzip-garbage-after", "bad_encoding"),
    ("/gzip-empty", "incomplete_body"), ("/deflate-empty", "incomplete_body"),
    ("/gzip-empty-no-length", "incomplete_body"), ("/chunked-gzip-empty", "incomplete_body"),
    ("/openmetrics-no-eof", "parse_error"),  # served as OpenMetrics, cut before its # EOF
])
def test_an_incomplete_body_marks_the_target_down_and_keeps_its_last_good_values(server, path, reason):
    agent = _agent(server.url("/target"))
    server.current["/target"] = "/good"
    good = agent.scrape_now()
    assert good.targets[0].up and good.pods
    server.current["/target"] = path
    snap = agent.scrape_now()
    status = snap.targets[0]
    assert not status.up and status.reason == reason, status
    assert status.errors == {reason: 1}
    assert status.detail and "http" not in status.detail
    # what the pod reported before is still what is served: nothing of the partial body was taken
    assert [(p.pod, p.model, p.requests, p.prompt_tokens) for p in snap.pods] == \
        [(p.pod, p.model, p.requests, p.prompt_tokens) for p in good.pods]
    assert snap.tiers == good.tiers
