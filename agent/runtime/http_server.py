"""The agent's HTTP application: the fixed paths (`/`, `/metrics`, `/healthz`, `/readyz`,
`/snapshot`), a component's added route behind the guard endpoints.py gives its path, and the
`/window` query.

    app = web_application(agent, exported=lambda: snapshot)     # agent: what ServedAgent names
    app.router.add_get("/window", guarded("/window", "loopback", handler, peer_token))
    window_response(store, {"window_s": "60"})                  # -> (Arrow IPC bytes, content type)
"""
from __future__ import annotations

import asyncio
import math
from collections.abc import Awaitable, Callable
from typing import Any, Protocol

from aiohttp import web
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_PLAIN_0_0_4

from agent.collect.store import WindowStore
from agent.runtime.endpoints import Endpoint, Guard, index_page, is_loopback
from agent.runtime.health import Health, health_json
from agent.runtime.payloads import snapshot_json, window_ipc
from agent.runtime.peer_auth import REALM, PeerToken
from agent.settings import AgentSettings
from contracts.jsonsafe import dumps as json_dumps
from contracts.tier_model import Snapshot

RouteHandler = Callable[[dict[str, str]], tuple[bytes, str]]
Serve = Callable[[web.Request], Awaitable[web.Response]]


class ServedAgent(Protocol):
    """What the fixed paths read from the agent (agent.runtime.app.Agent)."""

    settings: AgentSettings
    registry: CollectorRegistry

    def endpoints(self) -> list[Endpoint]: ...
    def health(self) -> Health: ...
    def checks(self) -> dict[str, str]: ...
    def info(self) -> dict[str, Any]: ...


def web_application(agent: ServedAgent, exported: Callable[[], Snapshot]) -> web.Application:
    """An aiohttp application serving the fixed paths; `exported()` is the snapshot as exported."""
    async def serve_index(_request: web.Request) -> web.Response:
        return web.Response(body=index_page(agent.endpoints()), content_type="text/html")

    async def serve_metrics(_request: web.Request) -> web.Response:
        body = await asyncio.get_running_loop().run_in_executor(None, generate_latest, agent.registry)
        return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_PLAIN_0_0_4})

    async def serve_health(_request: web.Request) -> web.Response:
        h = agent.health()
        body = health_json(h, agent.checks(), exported())
        body["info"] = agent.info()
        return web.json_response(body, status=200 if h.live else 503, dumps=json_dumps)

    async def serve_ready(_request: web.Request) -> web.Response:
        h = agent.health()
        return web.json_response(h.as_json(), status=200 if h.ready else 503, dumps=json_dumps)

    async def serve_snapshot(request: web.Request) -> web.Response:
        """Everything the agent knows, as JSON: only with `server.snapshot: true`, and only to
        loopback clients (kubectl port-forward, `tierpilot` on the same host)."""
        if not agent.settings.server.snapshot:
            return web.Response(status=404, text="/snapshot is off (server.snapshot: true enables it)\n")
        if not is_loopback(request.remote):
            return web.Response(status=403, text="/snapshot answers loopback clients only\n")
        return web.Response(text=snapshot_json(exported()), content_type="application/json")

    app = web.Application()
    app.router.add_get("/", serve_index)
    app.router.add_get("/metrics", serve_metrics)
    app.router.add_get("/healthz", serve_health)
    app.router.add_get("/readyz", serve_ready)
    app.router.add_get("/snapshot", serve_snapshot)
    return app


def guarded(path: str, guard: Guard, handler: RouteHandler, peer_token: PeerToken | None) -> Serve:
    """`handler` served at `path` behind `guard` (agent/runtime/endpoints.py), run in a worker
    thread; a ValueError is a 400 with its message."""
    async def serve(request: web.Request) -> web.Response:
        if guard == "token" and not peer_token.accepts(request.headers.get("Authorization")):  # type: ignore[union-attr]
            return web.Response(status=401, headers={"WWW-Authenticate": REALM},
                                text=f"{path} needs the replicas' bearer token (shard.token_file)\n")
        if guard == "loopback" and not is_loopback(request.remote):
            return web.Response(status=403, text=f"{path} answers loopback clients only without "
                                                 "shard.token_file (set it to serve the replicas)\n")
        try:
            body, ctype = await asyncio.get_running_loop().run_in_executor(None, handler, dict(request.query))
        except ValueError as exc:
            return web.Response(status=400, text=f"{exc}\n")
        return web.Response(body=body, headers={"Content-Type": ctype})
    return serve


def window_response(store: WindowStore, query: dict[str, str]) -> tuple[bytes, str]:
    """GET /window?window_s=S (the last S seconds) or /window?since=T0&until=T1 (exactly that
    span, wall-clock seconds): this replica's window aggregate as Arrow IPC (a sharded
    leader's tuner concatenates the shards' windows: agent/collect/fleetstore.py)."""
    def number(key: str) -> float:
        try:
            value = float(query[key])
        except ValueError:
            raise ValueError(f"{key} must be a number of seconds, got {query[key]!r}") from None
        if not math.isfinite(value):
            raise ValueError(f"{key} must be finite, got {query[key]!r}")
        return value

    ipc = "application/vnd.apache.arrow.file"
    if "since" in query or "until" in query:
        if "since" not in query or "until" not in query or "window_s" in query:
            raise ValueError("give since and until together, or window_s")
        since, until = number("since"), number("until")
        if not until >= since:
            raise ValueError("until must not be before since")
        return window_ipc(store.window_between(since, until)), ipc
    window_s = number("window_s") if "window_s" in query else None
    if window_s is not None and not window_s > 0:
        raise ValueError("window_s must be positive")
    return window_ipc(store.window(window_s)), ipc


__all__ = ["RouteHandler", "ServedAgent", "guarded", "web_application", "window_response"]
