"""The runtime's KV-event pieces (`kv_events.enabled`): the manager with its collectors and the
GPU stores' capacity curve, the block recorder the planning workload is rebuilt from, the
per-scrape feed of the vLLM token counters, endpoint discovery from pod annotations and, when
sharded, the fleet's mergeable block sketches."""
from __future__ import annotations

import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from agent.collect.discovery import PodApi
from agent.collect.scheduler import JobSpec
from agent.settings import AgentSettings

if TYPE_CHECKING:
    from agent.kvevents import KvEventManager
    from agent.runtime.assembly import Runtime
    from agent.runtime.workload_fit import ObservedWorkload

log = logging.getLogger("tierpilot.runtime")


def _kv_shard(settings: AgentSettings) -> Callable[[str], bool]:
    """Whether this replica follows the KV events of a pod (the scrape shard's rule)."""
    count = settings.shard.count
    if count == 1:
        return lambda _pod: True
    from agent.collect.shard import shard_index, shard_of

    mine = shard_index(settings.shard.index, count)
    return lambda pod: shard_of(pod, count) == mine


def add_kv_events(rt: Runtime, settings: AgentSettings, pod_api: PodApi | None,
                   clock: Callable[[], float], context: Any) -> None:
    from agent.kvevents import EndpointSpec, KvEventManager, KvEventsCollector
    from agent.runtime.tuning_bridge import feed_kv_counters, kv_endpoints_from_pods

    cfg = settings.kv_events
    kv = KvEventManager(cfg.manager_settings(), clock=clock, context=context)
    rt.kv = kv
    rt.agent.add_collector(KvEventsCollector(kv.snapshot), fleet=True)
    from agent.kvevents.store_curve import StoreCurveCollector, StoreStream

    stores = StoreStream(cfg.limits.capacity_curve_blocks)  # the GPU stores: what a CPU buffer of N GiB would hit
    kv.enable_store_curve(stores)
    curve = StoreCurveCollector(stores, settings.tiers.kv_bytes_per_token or 131072.0)
    rt.agent.add_collector(curve, fleet=True)
    rt.agent.add_job(JobSpec("kv_capacity_curve", curve.refresh_s, curve.rebuild))  # never in a render
    _add_block_recorder(rt, settings, kv, clock)
    interval = settings.scrape.interval_s
    rt.kv_feed = lambda: feed_kv_counters(rt.agent.store, kv, window_s=interval * 2.5, ts=clock())
    rt.agent.add_job(JobSpec("kv_counters", interval, rt.kv_feed))
    mine = _kv_shard(settings)
    if settings.shard.count > 1:
        kv.set_endpoints(tuple(s for s in cfg.endpoints if mine(s.pod)))
        _add_fleet_sketches(rt, settings, kv, clock)
    vllm = settings.targets.kubernetes.roles.get("vllm")
    if not (cfg.discovery and settings.targets.kubernetes.enabled and vllm is not None and pod_api is not None):
        if cfg.discovery and not cfg.endpoints:
            log.warning("kv_events: discovery needs targets.kubernetes with a vllm role; no endpoints configured")
        return
    static = tuple(cfg.endpoints)
    namespace = settings.targets.kubernetes.namespace

    def refresh() -> int:
        pods, _version = pod_api.list_pods(namespace, vllm.selector)
        found, errors = kv_endpoints_from_pods(pods, cfg.default_model)
        for err in errors:
            log.warning("kv_events: %s", err)
        merged: dict[str, EndpointSpec] = {s.pod: s for s in found}
        merged.update({s.pod: s for s in static})  # the config wins for a pod named in both
        kv.set_endpoints(tuple(s for s in merged.values() if mine(s.pod)))
        return len(merged)

    rt.kv_refresh = refresh
    rt.agent.add_job(JobSpec("kv_endpoints", cfg.discovery_interval_s, refresh, first_run_now=True))


def _add_block_recorder(rt: Runtime, settings: AgentSettings, kv: KvEventManager, clock: Callable[[], float]) -> None:
    """The block stream recorded for the planning workload rebuilt from it (agent/kvevents/rebuild/),
    with the counters of this replica's own pods."""
    from agent.kvevents.rebuild import BlockRecorder, RebuildCollector, RebuiltHistory, store_counts

    cfg = settings.kv_events
    recorder = BlockRecorder.from_settings(cfg.rebuild, group_idx=cfg.group_idx, clock=clock)
    kv.enable_block_recorder(recorder)
    rt.block_recorder = recorder
    local = RebuiltHistory.from_settings(recorder, store_counts(rt.agent.store), clock, cfg.rebuild)
    rt.rebuilt_history = local
    if settings.shard.count > 1:  # each replica rebuilds its pods; the leader plans on the merge
        from agent.kvevents.rebuild.merge import MergedHistory, peer_states, serve_state

        rt.agent.add_route("/kv/rebuilt", serve_state(local))
        rt.rebuilt_history = MergedHistory(local, peer_states(rt.shard_peers, rt.agent.peer_fetch,
                                                              settings.shard.peer_timeout_s))
    rt.agent.add_collector(RebuildCollector(recorder, lambda: local.outliers, lambda: local.counter_outliers),
                           fleet=True)


def _add_fleet_sketches(rt: Runtime, settings: AgentSettings, kv: KvEventManager,
                        clock: Callable[[], float]) -> None:
    """Sharded KV events: keep mergeable block sketches, serve them on /kv/sketch, and export
    the fleet-wide overlap, distinct blocks and duplication merged from every shard."""
    from agent.kvevents.fleet import BlockSketches, FleetBlocksCollector, state_json
    from agent.kvevents.fleet_overlap import FleetOverlap

    window_s = settings.kv_events.overlap_window_s
    kv.enable_block_sketches(BlockSketches(window_s=window_s, clock=clock))

    def serve(query: dict[str, str]) -> tuple[bytes, str]:
        try:
            w = float(query.get("window_s", window_s))
        except ValueError:
            raise ValueError(f"window_s must be a number of seconds, got {query['window_s']!r}") from None
        if not w > 0:
            raise ValueError("window_s must be positive")
        return state_json(kv.block_sketch_state(w)), "application/json"

    rt.agent.add_route("/kv/sketch", serve)
    fetch = rt.agent.peer_fetch  # with the replicas' token (peer_auth.py)
    rt.agent.add_collector(FleetBlocksCollector(kv.block_sketch_state, rt.shard_peers, fetch,
                                                settings.shard.peer_timeout_s, window_s))
    rt.fleet_overlap = FleetOverlap(kv.block_sketch_state, rt.shard_peers, fetch, settings.shard.peer_timeout_s)


def observed_workload(store: Any, kv: Any, window_s: float) -> ObservedWorkload:
    """The signals the synthetic warm-start workload is fitted to. Without KV events the
    overlap falls back to the cache's cumulative hit ratio (a lower bound)."""
    from agent.collect.window import bucket_increases, bucket_shares
    from agent.runtime.tuning_bridge import drift_signals, gpu_observations
    from agent.runtime.workload_fit import ObservedWorkload

    signals = drift_signals(store, kv, window_s)
    overlap = signals.get("reuse_ratio", signals.get("hit_ratio"))
    window = store.window(window_s)
    gpu = gpu_observations(window)
    return ObservedWorkload(signals.get("arrival_rate"), tuple(bucket_shares(bucket_increases(window, "prompt_length_tokens"))),
                            None if overlap is None else min(max(overlap, 0.0), 1.0),
                            gpu_tokens=int(gpu["gpu_tokens"]) if "gpu_tokens" in gpu else None,
                            requests_waiting=gpu.get("requests_waiting"), preemption_rate=gpu.get("preemption_rate"))


__all__ = ["add_kv_events", "observed_workload"]
