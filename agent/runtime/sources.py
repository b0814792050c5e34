"""Where the agent's samples come from: its targets as configured (static, a file, Kubernetes
discovery; this replica's share of them when sharded) and the cycle `source` asks for (direct
scraping or a Prometheus query API)."""
from __future__ import annotations

from collections.abc import Callable
from typing import Any

from agent.collect.discovery import (
    CombinedTargets,
    FileTargets,
    KubernetesTargets,
    StaticTargets,
    TargetSource,
)
from agent.collect.jobs import ScrapeCycle
from agent.collect.mapping import MappingSet
from agent.collect.store import WindowStore
from agent.settings import AgentSettings


def targets_from_settings(settings: AgentSettings, pod_api: Any = None) -> TargetSource:
    """Static list + optional file + optional Kubernetes discovery, as configured (through
    `pod_api`, else an in-cluster or kubeconfig client of its own). With `source: prometheus` the
    query API names the pods: no pod watch for scrape targets."""
    sources: list[TargetSource] = [StaticTargets(settings.targets.static)]
    if settings.targets.file is not None:
        sources.append(FileTargets(settings.targets.file))
    if settings.targets.kubernetes.enabled and settings.source == "scrape":
        if pod_api is None:
            from agent.collect.discovery import kubernetes_pod_api

            pod_api = kubernetes_pod_api(settings.targets.kubernetes.in_cluster)
        sources.append(KubernetesTargets(pod_api, settings.targets.kubernetes))
    return CombinedTargets(sources)


def shard_targets(source: TargetSource, settings: AgentSettings) -> TargetSource:
    """This replica's share of `source` when scraping is sharded (`shard.count` > 1 with
    `source: scrape`), else `source` itself."""
    if settings.shard.count > 1 and settings.source == "scrape":
        from agent.collect.shard import ShardedTargets, shard_index

        return ShardedTargets(source, shard_index(settings.shard.index, settings.shard.count),
                              settings.shard.count)
    return source


def make_cycle(settings: AgentSettings, mappings: MappingSet, store: WindowStore,
               clock: Callable[[], float]) -> Any:
    """The cycle `settings.source` asks for: direct scraping, or a Prometheus query API."""
    if settings.source == "prometheus":
        from agent.collect.prom.source import PrometheusCycle

        if settings.prometheus.aggregate == "server":
            from agent.collect.prom.aggregate import AggregatedCycle

            return AggregatedCycle(settings, mappings, store, clock)
        return PrometheusCycle(settings, mappings, store, clock)
    return ScrapeCycle(settings, mappings, store, clock)


async def close_cycle(cycle: Any) -> None:
    close = getattr(cycle, "aclose", None)
    if close is not None:
        await close()


__all__ = ["close_cycle", "make_cycle", "shard_targets", "targets_from_settings"]
