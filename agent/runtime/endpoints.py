"""What the agent's HTTP port serves and who may read each path: the start-up banner, the `/`
index page and the guard of every route come from the same table.

Access, per path:
- `/metrics`, `/healthz`, `/readyz`, `/`: open (what Prometheus and the kubelet read);
- `/snapshot`: only with `server.snapshot: true`, and only to loopback clients;
- `/window`, `/kv/sketch` (every pod's window): with `shard.token_file`, only to holders of the
  replicas' shared bearer token; sharded without a token (`shard.allow_unauthenticated`), to
  anyone who reaches the port; otherwise (one replica, no token) to loopback clients only.
"""
from __future__ import annotations

import html
import ipaddress
from dataclasses import dataclass
from typing import Literal

Guard = Literal["open", "loopback", "token", "off"]

DESCRIPTIONS = {
    "/metrics": "Prometheus metrics (text format 0.0.4)",
    "/healthz": "liveness, readiness and degraded checks (JSON)",
    "/readyz": "readiness (JSON; 503 until the first scrape cycle)",
    "/snapshot": "the latest unified snapshot (JSON)",
    "/window": "this replica's window aggregate (Arrow IPC; ?window_s=S or ?since=T0&until=T1)",
    "/kv/sketch": "KV block sketches for the fleet merge (sharded KV events)",
    "/kv/rebuilt": "this replica's rebuilt planning workload (msgpack; ?since=T0&until=T1) for the leader's merge",
    "/proposals": "changes the tuner holds back for a person (tuner.apply; JSON)",
}
PEER_PATHS = ("/window", "/kv/sketch", "/kv/rebuilt")
ACCESS_TEXT = {
    "open": "open",
    "loopback": "loopback clients only",
    "token": "bearer token (shard.token_file)",
    "off": "off",
}


@dataclass(frozen=True, slots=True)
class Endpoint:
    path: str
    guard: Guard
    description: str

    @property
    def access(self) -> str:
        return ACCESS_TEXT[self.guard]


def peer_guard(*, has_token: bool, sharded: bool) -> Guard:
    """Who may read `/window` and `/kv/sketch` (see the module docstring)."""
    if has_token:
        return "token"
    return "open" if sharded else "loopback"


def endpoint_table(routes: list[str], *, snapshot: bool, has_token: bool, sharded: bool) -> list[Endpoint]:
    """Every path served, in a stable order, with its guard."""
    out = [Endpoint(p, "open", DESCRIPTIONS[p]) for p in ("/metrics", "/healthz", "/readyz")]
    out.append(Endpoint("/snapshot", "loopback" if snapshot else "off", DESCRIPTIONS["/snapshot"]))
    for path in routes:
        guard = peer_guard(has_token=has_token, sharded=sharded) if path in PEER_PATHS else "open"
        out.append(Endpoint(path, guard, DESCRIPTIONS.get(path, "")))
    return out


def banner_lines(endpoints: list[Endpoint], base_url: str) -> list[str]:
    """One line per path: where it is served and how it is protected."""
    width = max(len(e.path) for e in endpoints)
    return [f"  {base_url}{e.path:<{width}}  {e.access}" for e in endpoints]


def index_page(endpoints: list[Endpoint]) -> bytes:
    """A small HTML page listing the endpoints (what `GET /` answers)."""
    rows = "\n".join(
        f'<li><a href="{html.escape(e.path)}">{html.escape(e.path)}</a>: {html.escape(e.description)}'
        f" ({html.escape(e.access)})</li>" for e in endpoints if e.guard != "off")
    return (f"<!doctype html>\n<html><head><title>tierpilot agent</title></head><body>\n"
            f"<h1>tierpilot agent</h1>\n<ul>\n{rows}\n</ul>\n"
            f'<p>Metric catalogue: docs/metrics.md. Health: <a href="/healthz">/healthz</a>.</p>\n'
            f"</body></html>\n").encode()


def is_loopback(remote: str | None) -> bool:
    try:
        return remote is not None and ipaddress.ip_address(remote).is_loopback
    except ValueError:
        return False
