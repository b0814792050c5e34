"""Block-level workload signals from vLLM KV events (docs/kv-events.md).

Public API (what the agent, the drift detector and the demo use):

- `KvEventManager(settings, clock=time.time)`: subscribes to every engine stream; `start()` /
  `stop()` run it in a background thread; `set_endpoints(specs)` follows discovery;
  `observe_counters(pod, model, PodCounters(prompt_tokens, local_compute_tokens,
  external_hit_tokens))` (or `observe_prompt_tokens(pod, model, total)`) feeds vLLM's counters;
  `current_overlap(model=None, window_s=None) -> OverlapReading | None`; `snapshot() -> KvSnapshot`.
- `KvEventsCollector(manager.snapshot)`: a prometheus_client Collector for the agent's registry.
- `workload_overlap(manager, model=None, window_s=None) -> float | None`: the drift detector's
  `reuse_ratio` signal (None when no KV events or prompt counters are available: fall back).
- `KvEventsSettings`, `EndpointSpec`, `endpoint_from_annotations(...)`: configuration.
"""
from __future__ import annotations

from agent.kvevents.collector import KvEventsCollector
from agent.kvevents.index import IndexLimits
from agent.kvevents.manager import KvEventManager
from agent.kvevents.settings import (
    EndpointSpec,
    KvEventsSettings,
    SettingsError,
    endpoint_from_annotations,
)
from agent.kvevents.signals import EngineId, KvSignals, KvSnapshot
from agent.kvevents.workload import OverlapReading, PodCounters

__all__ = [
    "EndpointSpec",
    "EngineId",
    "IndexLimits",
    "KvEventManager",
    "KvEventsCollector",
    "KvEventsSettings",
    "KvSignals",
    "KvSnapshot",
    "OverlapReading",
    "PodCounters",
    "SettingsError",
    "endpoint_from_annotations",
    "workload_overlap",
]


def workload_overlap(manager: KvEventManager | None, model: str | None = None,
                     window_s: float | None = None) -> float | None:
    """The workload's prefix overlap (0..1) from KV events, or None when unavailable."""
    if manager is None:
        return None
    reading = manager.current_overlap(model, window_s)
    return None if reading is None else reading.ratio
