"""A TCP forwarder on 127.0.0.1 that can cut the network to a real server (PostgreSQL) and bring
it back, for outage tests:

    with TcpProxy("127.0.0.1", pg_port) as proxy:
        url = pg_url.replace(f":{pg_port}/", f":{proxy.port}/")
        proxy.cut()       # open connections are reset; new ones are accepted and closed at once
        proxy.restore()   # forwarding again
"""
from __future__ import annotations

import contextlib
import socket
import threading
from typing import Self


class TcpProxy:
    def __init__(self, host: str, port: int) -> None:
        self.upstream = (host, port)
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.down = threading.Event()
        self._closing = threading.Event()
        self._conns: list[socket.socket] = []
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._accept, daemon=True, name="tcp-proxy")
        self._thread.start()

    def _accept(self) -> None:
        while not self._closing.is_set():
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            if self.down.is_set():
                _close(client)
                continue
            try:
                server = socket.create_connection(self.upstream, timeout=5)
            except OSError:
                _close(client)
                continue
            with self._lock:
                self._conns += [client, server]
            for a, b in ((client, server), (server, client)):
                threading.Thread(target=self._pump, args=(a, b), daemon=True).start()

    def _pump(self, src: socket.socket, dst: socket.socket) -> None:
        try:
            while True:
                data = src.recv(65536)
                if not data or self.down.is_set():
                    break
                dst.sendall(data)
        except OSError:
            pass
        finally:
            _close(src)
            _close(dst)

    def cut(self) -> None:
        self.down.set()
        with self._lock:
            conns, self._conns = self._conns, []
        for c in conns:
            _close(c)

    def restore(self) -> None:
        self.down.clear()

    def close(self) -> None:
        self._closing.set()
        self.cut()
        _close(self.listener)

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _close(sock: socket.socket) -> None:
    with contextlib.suppress(OSError):
        sock.shutdown(socket.SHUT_RDWR)
    with contextlib.suppress(OSError):
        sock.close()
