"""Is anything listening at a KV-event endpoint? ZMQ connects lazily and silently, so a SUB on a
dead address just receives nothing; a plain TCP connect (or, for ipc://, the socket file) tells
`tierpilot kv-events` to say so instead of printing empty tables."""
from __future__ import annotations

import os
import socket
from urllib.parse import urlsplit


def unreachable(endpoint: str, timeout_s: float = 1.0) -> str | None:
    """None when something accepts connections at `endpoint`; else why not (one short phrase).
    Schemes other than tcp:// and ipc:// are not checked (None)."""
    if endpoint.startswith("ipc://"):
        path = endpoint.removeprefix("ipc://")
        return None if os.path.exists(path) else "no such socket file"
    if not endpoint.startswith("tcp://"):
        return None
    parts = urlsplit(endpoint)
    host = parts.hostname
    if host in (None, "*"):
        return "no host to connect to"
    try:
        port = parts.port
    except ValueError:
        return "invalid port"
    if port is None:
        return "no port"
    try:
        with socket.create_connection((host, port), timeout=timeout_s):
            return None
    except ConnectionRefusedError:
        return "connection refused"
    except TimeoutError:
        return f"no answer within {timeout_s:g}s"
    except OSError as exc:
        return exc.strerror or type(exc).__name__
