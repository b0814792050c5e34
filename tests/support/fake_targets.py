"""Real HTTP /metrics endpoints on 127.0.0.1 for agent tests, with scriptable faults.

    with MetricsServer() as srv:
        srv.route("/a", text=payload)               # 200 text/plain
        srv.route("/b", status=500)
        srv.route("/c", hang=True)                  # accepts, never answers
        srv.route("/d", text=payload, drip_s=0.2)   # headers, then a byte every drip_s
        srv.route("/e", body=b"\\x89garbage")
        srv.route("/f", text=payload, gzip=True)
        srv.route("/g", size=50 * 2**20)            # a 50 MB body
        srv.route("/h", reset=True)                  # drops the connection mid-body
        srv.route("/i", redirect="http://127.0.0.1:1/x")  # 302 to that Location
        srv.url("/a")

Runs in a thread (ThreadingHTTPServer); `close()` releases hanging handlers and stops it.
"""
from __future__ import annotations

import gzip as gz
import http.server
import socket
import threading
import time
from dataclasses import dataclass
from typing import Self

OPENMETRICS = "application/openmetrics-text; version=1.0.0; charset=utf-8"


@dataclass
class Route:
    text: str | None = None
    body: bytes | None = None
    status: int = 200
    hang: bool = False
    drip_s: float = 0.0
    gzip: bool = False
    size: int = 0
    reset: bool = False
    redirect: str = ""
    content_type: str = "text/plain; version=0.0.4; charset=utf-8"


class MetricsServer:
    def __init__(self) -> None:
        self.routes: dict[str, Route] = {}
        self.hits: dict[str, int] = {}
        self._closing = threading.Event()
        server = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: object) -> None:
                pass

            def do_GET(self) -> None:
                server.hits[self.path] = server.hits.get(self.path, 0) + 1
                route = server.routes.get(self.path)
                if route is None:
                    self.send_error(404)
                    return
                if route.hang:
                    server._closing.wait(60)
                    return
                if route.redirect:
                    self.send_response(302)
                    self.send_header("Location", route.redirect)
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return
                if route.status != 200:
                    body = b"internal error\n"
                    self.send_response(route.status)
                    self.send_header("Content-Length", str(len(body)))
                    self.end_headers()
                    self.wfile.write(body)
                    return
                if route.size:
                    self._big(route.size)
                    return
                body = route.body if route.body is not None else (route.text or "").encode()
                if route.gzip:
                    body = gz.compress(body)
                self.send_response(200)
                self.send_header("Content-Type", route.content_type)
                if route.gzip:
                    self.send_header("Content-Encoding", "gzip")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                if route.reset:
                    self.wfile.write(body[: len(body) // 2])
                    self.wfile.flush()
                    self.connection.shutdown(socket.SHUT_RDWR)  # gone before the body is complete
                    self.close_connection = True
                    return
                if route.drip_s:
                    for i in range(len(body)):
                        if server._closing.is_set():
                            return
                        try:
                            self.wfile.write(body[i:i + 1])
                            self.wfile.flush()
                        except OSError:
                            return
                        time.sleep(route.drip_s)
                    return
                self.wfile.write(body)

            def _big(self, size: int) -> None:
                self.send_response(200)
                self.send_header("Content-Type", "text/plain; version=0.0.4")
                self.end_headers()  # no Content-Length: the client must cap while reading
                line = b"# filler comment line to make the body large ..........................\n"
                sent = 0
                try:
                    while sent < size and not server._closing.is_set():
                        self.wfile.write(line * 1024)
                        sent += len(line) * 1024
                except OSError:
                    pass
                self.close_connection = True

        class Server(http.server.ThreadingHTTPServer):
            request_queue_size = 256  # the default backlog of 5 drops concurrent connects (1 s SYN retry)

        self.httpd = Server(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.port = self.httpd.server_address[1]
        self._thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self._thread.start()

    def route(self, path: str, **kwargs: object) -> str:
        self.routes[path] = Route(**kwargs)  # type: ignore[arg-type]
        return self.url(path)

    def url(self, path: str) -> str:
        return f"http://127.0.0.1:{self.port}{path}"

    def close(self) -> None:
        self._closing.set()
        self.httpd.shutdown()
        self.httpd.server_close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
