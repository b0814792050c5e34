"""The agent for the demo: the `Agent` app with static targets (the emulated endpoints),
exporting on 127.0.0.1, plus the KV-event manager; the tuner's collector is exported too.

Its data clock is the emulated cluster's (trace seconds), so windows, rates and the tuner's live
windows all speak cluster time. What Prometheus sees is wall time: the snapshot timestamp
(`tierpilot_snapshot_timestamp_seconds`, the heartbeat the TierpilotAgentStale alert reads) is
stamped by the wall clock, and the KV streams' last-event timestamps are mapped from cluster to
wall time, so a healthy demo agent never looks stale. The bridge to the tuner and the KV-event subsystem is the
production agent's own (`agent.runtime.tuning_bridge`): the same window source, drift signals and
per-scrape KV counter feed as `tierpilot run`.
"""
from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Callable, Sequence

from prometheus_client.registry import Collector

from agent.collect.scheduler import JobSpec
from agent.kvevents import EndpointSpec, KvEventManager, KvEventsCollector, KvEventsSettings
from agent.kvevents.signals import KvSnapshot
from agent.runtime.app import Agent
from agent.runtime.fleet_robust import RobustFleet, planning_view
from agent.runtime.tuning.workload import WorkloadSource, planning_workload, record_blocks
from agent.runtime.tuning_bridge import StoreWindowSource, drift_signals, feed_kv_counters
from agent.settings import AgentSettings, load_settings
from contracts.tier_model import Target

log = logging.getLogger("tierpilot.demo.agent")


class DemoAgent:
    """The real agent (`agent.runtime.app.Agent`) on the cluster clock, with static targets, plus
    the KV-event manager (`agent.kvevents`) whose collector it exports too. `wall_of(t)`: the wall
    time of cluster time t (default: t itself), for the exported KV timestamps."""

    def __init__(self, targets: Sequence[Target], *, clock: Callable[[], float], port: int = 9400,
                 scrape_interval_s: float = 0.5, kv_endpoints: Sequence[EndpointSpec] = (),
                 kv_bytes_per_token: float | None = None, window_s: float = 120.0, retention_s: float = 1800.0,
                 extra_collectors: tuple[Collector, ...] = (),
                 wall_clock: Callable[[], float] = time.time,
                 wall_of: Callable[[float], float] | None = None) -> None:
        self.clock = clock
        self.wall_clock = wall_clock
        self.wall_of = wall_of or (lambda t: t)
        self.kv = KvEventManager(KvEventsSettings(endpoints=tuple(kv_endpoints), overlap_window_s=window_s),
                                 clock=clock) if kv_endpoints else None
        self._collectors = extra_collectors + ((KvEventsCollector(self._kv_snapshot),) if self.kv else ())
        # the KV counter feed takes each pod's latest scrape within the store window (cluster
        # seconds: the scrape interval is wall time, the store runs on the cluster clock)
        self._window_s = window_s
        self._overrides = {
            "scrape": {"interval_s": scrape_interval_s, "timeout_s": 2.0, "backoff_base_s": scrape_interval_s,
                    "backoff_max_s": 2.0},
            "store": {"retention_s": retention_s, "window_s": window_s},
            "server": {"host": "127.0.0.1", "port": port},
            "targets": {"static": [{"url": t.url, "role": t.role, "pod": t.pod} for t in targets]},
            "tiers": {"kv_bytes_per_token": kv_bytes_per_token} if kv_bytes_per_token else {},
            "log_level": "WARNING"}
        self.port_message: str | None = None
        self.agent = self._make(port)
        self.store = self.agent.store
        self.window_source = StoreWindowSource(self.store)

    def _make(self, port: int) -> Agent:
        overrides = dict(self._overrides, server={"host": "127.0.0.1", "port": port})
        settings = load_settings(env={}, **overrides)
        jobs = [JobSpec("kv_counters", float(self._overrides["scrape"]["interval_s"]),  # type: ignore[index]
                        self._feed_kv)] if self.kv else []
        return Agent(settings, collectors=self._collectors, jobs=jobs, clock=self.clock, stamp_clock=self.wall_clock)

    def _kv_snapshot(self) -> KvSnapshot:
        """The KV snapshot as exported: engine timestamps in wall time (a real vLLM stamps its
        batches with time.time(); the emulated publishers stamp cluster time)."""
        assert self.kv is not None
        snap = self.kv.snapshot()
        engines = tuple(
            dataclasses.replace(e, stream=dataclasses.replace(e.stream, last_event_ts=self.wall_of(e.stream.last_event_ts)))
            if e.stream.last_event_ts is not None else e for e in snap.engines)
        return dataclasses.replace(snap, engines=engines)

    def cluster_time_of(self, stamp: float) -> float | None:
        """The cluster time of the scrape cycle the agent exported with wall `stamp`."""
        return self.agent.data_time_of(stamp)

    @property
    def url(self) -> str:
        return self.agent.url

    # -- lifecycle -----------------------------------------------------------------------------
    def start(self) -> None:
        wanted = self.agent.settings.server.port
        try:
            self.agent.start()
        except RuntimeError as exc:
            if wanted == 0:
                raise
            self.agent = self._make(0)
            self.store = self.agent.store
            self.window_source = StoreWindowSource(self.store)
            self.agent.start()
            self.port_message = (f"127.0.0.1:{wanted} is not available ({exc}); the agent exports on "
                                 f"{self.agent.url} instead")
        if self.kv is not None:
            self.kv.start()

    def stop(self) -> None:
        if self.kv is not None:
            self.kv.stop()
        self.agent.stop()

    def _feed_kv(self) -> None:
        """The scraped vLLM token counters the KV-event overlap and miss estimates divide by."""
        assert self.kv is not None
        feed_kv_counters(self.store, self.kv, window_s=self._window_s, ts=self.clock())

    # -- what the tuner reads ------------------------------------------------------------------------
    def tuner_inputs(self, settings: AgentSettings) -> tuple[RobustFleet, WorkloadSource]:
        """What `tierpilot run` hands its tuner, built by the agent's own code for the tuner's
        `settings`: the store's robust view (`planning_view`), on which the tuner plans, judges
        and watches for drift, and the planning workload: rebuilt from the pods' block streams
        (a block recorder on the KV-event manager; call before `start`), or fitted to the
        counters without KV events. Both follow the store if `start` remakes the agent."""
        store = _CurrentStore(self)
        view = planning_view(settings, store)
        rebuilt = (record_blocks(settings, self.kv, store, self.clock)
                   if self.kv is not None and settings.kv_events.enabled else None)
        workload, _fitted = planning_workload(settings, view, self.kv, self.clock, rebuilt)
        return view, workload

    def drift_signals(self, window_s: float | None = None, view: RobustFleet | None = None) -> dict[str, float]:
        """The drift detector's signals over `view` (the tuner's robust view) or the raw store."""
        return drift_signals(self.store if view is None else view, self.kv, window_s)


class _CurrentStore:
    """The demo agent's store of the moment (`DemoAgent.start` remakes the agent on a taken port)."""

    def __init__(self, owner: DemoAgent) -> None:
        self._owner = owner

    def __getattr__(self, name: str) -> object:
        return getattr(self._owner.agent.store, name)

