"""A thin loopback HTTP server that serves one `/metrics` renderer (and `/health`).

It binds 127.0.0.1 only. `stop()` closes the listening socket, so a scrape during a restart
gets "connection refused" exactly like a pod that is being replaced; `start()` binds the same
port again.
"""
from __future__ import annotations

import gzip
import http.server
import logging
import sys
import threading
from collections.abc import Callable

from prometheus_client.exposition import CONTENT_TYPE_LATEST, gzip_accepted

LOOPBACK = "127.0.0.1"
log = logging.getLogger(__name__)


class _Handler(http.server.BaseHTTPRequestHandler):
    server: _Server
    protocol_version = "HTTP/1.1"

    def do_GET(self) -> None:
        path = self.path.split("?", 1)[0]
        if path == "/metrics":
            try:
                body = self.server.render()
            except Exception as exc:  # noqa: BLE001 - a renderer bug must be a 500, like a real server
                self._send(500, f"render failed: {exc}\n".encode(), "text/plain; charset=utf-8")
                return
            if gzip_accepted(self.headers.get("Accept-Encoding", "")):
                self._send(200, gzip.compress(body, compresslevel=1), CONTENT_TYPE_LATEST, gzip=True)
            else:
                self._send(200, body, CONTENT_TYPE_LATEST)
        elif path in ("/health", "/healthz"):
            self._send(200, b"", "text/plain; charset=utf-8")
        else:
            self._send(404, b"not found\n", "text/plain; charset=utf-8")

    def _send(self, code: int, body: bytes, ctype: str, gzip: bool = False) -> None:
        self.send_response(code)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(body)))
        if gzip:
            self.send_header("Content-Encoding", "gzip")
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: object) -> None:  # silence per-request logs
        return


class _Server(http.server.ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True

    def __init__(self, port: int, render: Callable[[], bytes], host: str = LOOPBACK) -> None:
        self.render = render
        self.client_disconnects = 0
        super().__init__((host, port), _Handler)

    def handle_error(self, request: object, client_address: object) -> None:
        """A client that drops its keep-alive connection (a scraper closing its session, a
        timeout) is counted and logged at debug, not printed as a traceback; anything else is."""
        exc = sys.exc_info()[1]
        if isinstance(exc, ConnectionError):  # reset, aborted, broken pipe
            self.client_disconnects += 1
            log.debug("client %s disconnected: %s", client_address, exc)
            return
        super().handle_error(request, client_address)


class MetricsEndpoint:
    """`/metrics` on 127.0.0.1:port (or another loopback address: a pod IP of the project's kubelet).
    Port 0 picks a free port once; restarts keep it."""

    def __init__(self, render: Callable[[], bytes], port: int = 0, host: str = LOOPBACK) -> None:
        self._render = render
        self._port = port
        self._host = host
        self._server: _Server | None = None
        self._thread: threading.Thread | None = None

    @property
    def port(self) -> int:
        return self._port

    @property
    def url(self) -> str:
        return f"http://{self._host}:{self._port}/metrics"

    @property
    def client_disconnects(self) -> int:
        """Connections clients dropped (reset, broken pipe) since the last start()."""
        return self._server.client_disconnects if self._server is not None else 0

    @property
    def running(self) -> bool:
        return self._server is not None

    def start(self) -> None:
        if self._server is not None:
            return
        server = _Server(self._port, self._render, self._host)
        self._port = server.server_address[1]
        self._server = server
        self._thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.1},
                                        name=f"metrics-{self._port}", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        server, thread = self._server, self._thread
        self._server = self._thread = None
        if server is not None:
            server.shutdown()
            server.server_close()
        if thread is not None:
            thread.join(timeout=5)
