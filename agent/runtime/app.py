"""The agent: settings + a target source -> scrape jobs, the window store, /metrics, OTLP.

    agent = Agent(settings, targets=StaticTargets([...]), collectors=[tuner_collector],
                  jobs=[JobSpec("drift", 30, detector.check)])
    agent.start()            # background event loop: scheduler, HTTP server, discovery
    agent.url                # e.g. http://127.0.0.1:40123/metrics
    agent.snapshot           # the latest unified view (a frozen record)
    agent.store              # the window store (read API for the tuner and drift detector)
    agent.stop()

`run_forever()` does the same in the foreground and stops cleanly on SIGTERM or SIGINT.
`scrape_now()` runs one cycle synchronously (tests, `tierpilot scrape-once`).
What its port serves is in http_server.py (handlers) and endpoints.py (paths and guards).
"""
from __future__ import annotations

import asyncio
import collections
import dataclasses
import logging
import threading
import time
from collections.abc import Callable, Iterable
from typing import Any, Self

import aiohttp
from aiohttp import web
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.registry import Collector

from agent.collect.discovery import (
    KubernetesTargets,
    TargetSource,
)
from agent.collect.mapping import MappingSet, builtin_mapping_paths, load_mappings
from agent.collect.scheduler import JobSpec, build_scheduler, is_running
from agent.collect.scrape import new_session
from agent.collect.store import WindowStore
from agent.runtime.clock import SteadyWallClock
from agent.runtime.endpoints import Endpoint, banner_lines, endpoint_table
from agent.runtime.health import Health, component_checks, component_info, judge
from agent.runtime.http_server import RouteHandler, guarded, web_application, window_response
from agent.runtime.isolation import CollectorHealth, IsolatedCollector, collector_name
from agent.runtime.job_stats import JobStats
from agent.runtime.lifecycle import run_until_signalled, start_error
from agent.runtime.peer_auth import PeerFetch, PeerToken
from agent.runtime.sources import close_cycle, make_cycle, shard_targets, targets_from_settings
from agent.runtime.target_watch import Blindness, TargetLog
from agent.settings import AgentSettings
from contracts.tier_model import Snapshot
from exporters.fleet import FleetExport
from exporters.prom import SnapshotCollector
from exporters.selfinfo import register_self_metrics

log = logging.getLogger(__name__)


class Agent:
    """Builds and runs the agent. Not started by the constructor."""

    def __init__(
        self,
        settings: AgentSettings,
        targets: TargetSource | None = None,
        *,
        collectors: Iterable[Collector] = (),
        jobs: Iterable[JobSpec | tuple[str, float, Callable[[], Any]]] = (),
        mappings: MappingSet | None = None,
        clock: Callable[[], float] | None = None,
        otel_exporter: Any = None,
        monotonic: Callable[[], float] = time.monotonic,
        stamp_clock: Callable[[], float] | None = None,
    ):
        self.settings = settings
        # /window and /kv/sketch: with shard.token_file only for holders of the shared token
        # (peer_auth.py; PeerTokenError, a config error, when the file cannot be used)
        sh = settings.shard
        self.peer_token = PeerToken(sh.token_file, grace_s=sh.token_grace_s, monotonic=monotonic) \
            if sh.token_file is not None else None
        self.peer_fetch = PeerFetch(self.peer_token)
        source = targets if targets is not None else targets_from_settings(settings)
        self.target_source = shard_targets(source, settings)
        self.mappings = mappings or load_mappings([*builtin_mapping_paths(), *settings.mappings])
        # the data clock: wall time that advances with the monotonic clock (agent/runtime/clock.py)
        clock = clock if clock is not None else SteadyWallClock(time.time, monotonic)
        self.clock = clock
        self.store = WindowStore(settings.store.retention_s, settings.store.window_s, clock)
        self.cycle = make_cycle(settings, self.mappings, self.store, clock)
        self._snapshot = Snapshot.empty()
        # what exporters stamp as the snapshot's time: `clock` unless a separate wall clock is given
        # (the demo's data clock is the emulated cluster's; Prometheus must see wall time)
        self.stamp_clock = stamp_clock
        self._exported = self._snapshot
        self.stamps: collections.deque[tuple[float, float]] = collections.deque(maxlen=64)  # (stamp, data time)
        self.job_stats = JobStats()
        self.collector_health = CollectorHealth()
        self.health_checks: dict[str, Callable[[], str | None]] = {}
        self.target_log = TargetLog()  # one log line per change of a target's state
        self.blindness = Blindness(settings.scrape.blind_after_cycles)
        self.add_health_check("targets", self.blindness.problem)
        self.health_info: dict[str, Callable[[], Any]] = {}
        # export.fleet=leader: the runtime points this at the Lease (exporters/fleet.py)
        self.is_fleet_exporter: Callable[[], bool] | None = None
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(self._fleet(SnapshotCollector(lambda: self._exported)))
        self.registry.register(self.job_stats)
        self.registry.register(self.collector_health)
        register_self_metrics(self.registry)
        if sh.count > 1 or self.peer_token is not None:
            self.registry.register(self.peer_fetch.collector())
        for c in collectors:
            self.add_collector(c)
        self.jobs = [j if isinstance(j, JobSpec) else JobSpec(*j) for j in jobs]
        self.routes: dict[str, RouteHandler] = {"/window": self._window_ipc}
        self._otel_exporter = otel_exporter
        self.otel = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._runner: web.AppRunner | None = None
        self._session: aiohttp.ClientSession | None = None
        self._scheduler = None
        self._started = threading.Event()
        self._cycle_lock: asyncio.Lock | None = None
        self.port: int | None = None
        self.cycles = 0
        self.monotonic = monotonic  # health only: liveness is wall time, whatever `clock` says
        self._started_at: float | None = None
        self._last_cycle_at: float | None = None

    # -- state ---------------------------------------------------------------------------------
    @property
    def snapshot(self) -> Snapshot:
        return self._snapshot

    @property
    def url(self) -> str:
        if self.port is None:
            raise RuntimeError("the agent is not started")
        host = self.settings.server.host
        host = "127.0.0.1" if host in ("0.0.0.0", "") else host
        return f"http://{host}:{self.port}/metrics"

    def metrics_text(self) -> str:
        """Exactly what /metrics serves (classic text format)."""
        return generate_latest(self.registry).decode()

    def pod_namespaces(self) -> dict[str, str]:
        """pod -> the namespace it was discovered in (the `namespace` label of the fleet series)."""
        return {st.target.pod: st.target.namespace for st in self._snapshot.targets if st.target.namespace}

    def exporting_fleet(self) -> bool:
        """Whether this replica serves the fleet series now (always, unless export.fleet=leader)."""
        return self.is_fleet_exporter is None or self.is_fleet_exporter()

    def _fleet(self, collector: Collector) -> FleetExport:
        return FleetExport(collector, is_exporter=self.exporting_fleet, pod_namespaces=self.pod_namespaces)

    def add_collector(self, collector: Collector, name: str | None = None, *, fleet: bool = False) -> None:
        """Register an extra collector, isolated: if it raises, only its series are missing.
        `fleet`: its series describe the scraped pods (served by the exporting replica only, with
        the pods' namespace; exporters/fleet.py)."""
        name = name or collector_name(collector)
        wrapped = IsolatedCollector(self._fleet(collector) if fleet else collector, name)
        self.collector_health.add(wrapped)
        self.add_health_check(f"collector:{wrapped.name}", wrapped.problem)

    def add_health_check(self, name: str, check: Callable[[], str | None]) -> None:
        """A component's own health in /healthz `checks` (None = ok, else the problem). Degraded
        components do not fail liveness: the agent keeps serving everything else."""
        self.health_checks[name] = check

    def add_health_info(self, name: str, info: Callable[[], Any]) -> None:
        """A component's state shown in /healthz `info` (JSON-safe, None when it has none yet)."""
        self.health_info[name] = info

    def info(self) -> dict[str, Any]:
        return component_info(self.health_info)

    def checks(self) -> dict[str, str]:
        return component_checks(self.health_checks)

    def health(self) -> Health:
        """Liveness and readiness now (agent.runtime.health)."""
        running = is_running(self._scheduler)
        return judge(now=self.monotonic(), started_at=self._started_at, last_cycle_at=self._last_cycle_at,
                     cycles=self.cycles, interval_s=self.settings.scrape.interval_s, scheduler_running=running)

    def add_route(self, path: str, handler: RouteHandler) -> None:
        """Serve GET `path`: `handler(query parameters) -> (body, content type)`, run in a worker
        thread; a ValueError is a 400 with its message."""
        if self._runner is not None:
            raise RuntimeError("add routes before start()")
        self.routes[path] = handler

    def endpoints(self) -> list[Endpoint]:
        """Every path this agent serves, with who may read it (agent/runtime/endpoints.py)."""
        return endpoint_table(list(self.routes), snapshot=self.settings.server.snapshot,
                              has_token=self.peer_token is not None, sharded=self.settings.shard.count > 1)

    def _route(self, path: str, handler: RouteHandler) -> Callable[..., Any]:
        guard = next(e.guard for e in self.endpoints() if e.path == path)
        return guarded(path, guard, handler, self.peer_token)

    def _window_ipc(self, query: dict[str, str]) -> tuple[bytes, str]:
        """GET /window: this replica's window aggregate as Arrow IPC (http_server.window_response)."""
        return window_response(self.store, query)

    def add_job(self, spec: JobSpec) -> None:
        if self._scheduler is not None:
            raise RuntimeError("add jobs before start()")
        self.jobs.append(spec)

    # -- one cycle -----------------------------------------------------------------------------
    async def _scrape(self) -> Snapshot:
        assert self._cycle_lock is not None and self._session is not None
        async with self._cycle_lock:
            targets = self.target_source.targets()
            self._snapshot = await self.cycle.run(self._session, targets)
            self._exported = self._stamped(self._snapshot)
            self.cycles += 1
            self.blindness.observe(self._snapshot.targets)
            if self._scheduler is not None:  # the running agent logs; a one-shot scrape prints
                self.target_log.observe(self._snapshot.targets)
            self._last_cycle_at = self.monotonic()
            return self._snapshot

    def _stamped(self, snap: Snapshot) -> Snapshot:
        """The snapshot as exported: stamped by `stamp_clock` when one is given."""
        if self.stamp_clock is None:
            return snap
        stamp = self.stamp_clock()
        self.stamps.append((stamp, snap.taken_at))
        return dataclasses.replace(snap, taken_at=stamp)

    def data_time_of(self, stamp: float) -> float | None:
        """The data clock's time of the cycle exported with `stamp` (None if too old or unknown)."""
        for s, data in reversed(self.stamps):
            if s == stamp:
                return data
        return None

    def scrape_now(self, timeout: float | None = None) -> Snapshot:
        """Run one scrape cycle and return the new snapshot (started or not)."""
        if self._loop is not None and self._thread is not None and self._thread.is_alive():
            fut = asyncio.run_coroutine_threadsafe(self._scrape(), self._loop)
            return fut.result(timeout)

        got: list[Snapshot] = []

        async def once() -> None:
            self._cycle_lock = asyncio.Lock()
            async with new_session(self.settings.scrape.concurrency) as session:
                self._session = session
                try:
                    got.append(await self._scrape())
                finally:
                    self._session = None
                    await close_cycle(self.cycle)
        # the snapshot is not the task's result: Python 3.11's asyncio.run formats a repr of its
        # main task (result included) when it restores the SIGINT handler, ~0.4 s at 2,000 pods
        asyncio.run(once())
        return got[0]

    # -- lifecycle -----------------------------------------------------------------------------
    def start(self, timeout: float = 30.0) -> None:
        """Start the event loop thread, /metrics, discovery, OTLP export and the scheduler."""
        if self._thread is not None:
            raise RuntimeError("already started")
        for src in getattr(self.target_source, "sources", (self.target_source,)):
            if isinstance(src, KubernetesTargets):
                src.start()
        if self.settings.otel.endpoint or self._otel_exporter is not None:
            from exporters.otel import OtelExporter

            self.otel = OtelExporter(lambda: self._exported, self.settings.otel, self._otel_exporter)
        self._loop = asyncio.new_event_loop()
        error: list[BaseException] = []
        self._thread = threading.Thread(target=self._run_loop, args=(error,), name="tierpilot-agent", daemon=True)
        self._thread.start()
        if not self._started.wait(timeout) or error:
            self.stop()
            raise start_error(error[0] if error else None, self.settings.server.host, self.settings.server.port)

    def _run_loop(self, error: list[BaseException]) -> None:
        loop = self._loop
        assert loop is not None
        asyncio.set_event_loop(loop)
        try:
            loop.run_until_complete(self._setup())
        except BaseException as exc:  # noqa: BLE001 - reported to start()
            error.append(exc)
            loop.run_until_complete(self._teardown())  # the HTTP session and runner, closed
            loop.close()
            self._started.set()
            return
        self._started.set()
        loop.run_forever()
        loop.run_until_complete(self._teardown())
        loop.close()

    async def _setup(self) -> None:
        self._cycle_lock = asyncio.Lock()
        self._session = new_session(self.settings.scrape.concurrency)
        app = web_application(self, exported=lambda: self._exported)
        for path, handler in self.routes.items():
            app.router.add_get(path, self._route(path, handler))
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, self.settings.server.host, self.settings.server.port)
        await site.start()
        server = site._server
        self.port = server.sockets[0].getsockname()[1] if server and server.sockets else self.settings.server.port
        jobs = [JobSpec("scrape", self.settings.scrape.interval_s, self._scrape, first_run_now=True), *self.jobs]
        self._scheduler = build_scheduler(asyncio.get_running_loop(), jobs, self.job_stats.record)
        self._scheduler.start()
        self._started_at = self.monotonic()
        sock = server.sockets[0].getsockname() if server and server.sockets else (self.settings.server.host, self.port)
        base = self.url.removesuffix("/metrics")
        log.info("agent listening on %s:%s; local URL %s\n%s", sock[0], sock[1], self.url,
                 "\n".join(banner_lines([e for e in self.endpoints() if e.guard != "off"], base)))

    async def _teardown(self) -> None:
        if self._scheduler is not None:
            self._scheduler.shutdown(wait=False)
        if self._runner is not None:
            await self._runner.cleanup()
        if self._session is not None:
            await self._session.close()
        await close_cycle(self.cycle)
        tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    def stop(self, timeout: float = 15.0) -> None:
        """Stop everything started by `start()`; safe to call twice."""
        for src in getattr(self.target_source, "sources", (self.target_source,)):
            if isinstance(src, KubernetesTargets):
                src.stop()
        if self._loop is not None and self._thread is not None:
            if self._loop.is_running():
                self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(timeout)
        self._thread = None
        self._loop = None
        self._scheduler = None
        if self.otel is not None:
            try:
                self.otel.shutdown()
            except Exception:
                log.warning("OpenTelemetry shutdown failed", exc_info=True)
            self.otel = None

    def is_alive(self) -> bool:
        """True while the agent's event loop thread runs."""
        return self._thread is not None and self._thread.is_alive()

    def run_forever(self) -> None:
        """Start, then block until SIGTERM or SIGINT; then stop cleanly."""
        run_until_signalled(self.start, self.stop, self.is_alive)

    def __enter__(self) -> Self:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
