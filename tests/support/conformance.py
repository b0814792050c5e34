"""Ask a real Prometheus which exposition payloads it accepts.

One loopback HTTP server serves every case at `/case/<id>` with its format's Content-Type; one
Prometheus scrapes them all as separate targets (1 s interval), and each target's health and
`lastError` after its first scrape that reached the payload is the verdict. Used by
tests/test_parse_conformance.py and bench/exposition_conformance.py.
"""
from __future__ import annotations

import http.server
import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from tests.support.exposition_cases import CONTENT_TYPES, Case
from tests.support.prometheus import start_prometheus


@dataclass(frozen=True, slots=True)
class Verdict:
    accepted: bool
    error: str  # Prometheus' lastError ("" when accepted)


@contextmanager
def serve_cases(cases: Sequence[Case]) -> Iterator[int]:
    """Serve each case's body at /case/<id>; yields the port."""
    by_path = {f"/case/{c.id}": (c.body.encode("utf-8"), CONTENT_TYPES[c.fmt]) for c in cases}

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            body, ctype = by_path.get(self.path, (b"", ""))
            self.send_response(200 if ctype else 404)
            self.send_header("Content-Type", ctype or "text/plain")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    class Server(http.server.ThreadingHTTPServer):
        def handle_error(self, request: object, client_address: object) -> None:
            pass  # Prometheus may close a connection early (a scrape timing out): not ours to log

    server = Server(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield int(server.server_address[1])
    finally:
        server.shutdown()
        server.server_close()


def prometheus_verdicts(cases: Sequence[Case], workdir: Path, timeout_s: float = 60.0) -> dict[str, Verdict]:
    """Each case's verdict from one real Prometheus scraping all of them at once."""
    with serve_cases(cases) as port:
        address = f"127.0.0.1:{port}"
        groups = [{"targets": [address], "labels": {"__metrics_path__": f"/case/{c.id}", "case": c.id}}
                  for c in cases]
        prom = start_prometheus([], workdir, static_configs=groups, wait_for_first_scrape=False)
        try:
            deadline = time.monotonic() + timeout_s
            while True:
                seen = _scraped(prom.api("targets", state="active"))
                if len(seen) >= len(cases) or time.monotonic() > deadline:
                    break
                time.sleep(0.5)
        finally:
            prom.stop()
    missing = [c.id for c in cases if c.id not in seen]
    if missing:
        raise RuntimeError(f"Prometheus did not scrape {len(missing)} cases in {timeout_s:.0f}s: {missing[:5]}")
    return seen


# A scrape that failed on the way (the case server, in this busy test process, answered late or
# not at all) says nothing of the payload: wait for a scrape that read it. Go's HTTP client
# reports those as `Get "<url>": <cause>`; a payload's error never starts so.
TRANSPORT_ERROR = 'Get "'


def _scraped(data: dict) -> dict[str, Verdict]:
    out: dict[str, Verdict] = {}
    for target in data.get("activeTargets", []):
        case = target.get("labels", {}).get("case")
        error = target.get("lastError", "")
        if target.get("health") == "down" and error.startswith(TRANSPORT_ERROR):
            continue
        if case and target.get("health") in ("up", "down"):
            out[case] = Verdict(target["health"] == "up", error)
    return out
