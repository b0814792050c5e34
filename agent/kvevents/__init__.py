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

import importlib
from typing import TYPE_CHECKING, Any

# Loaded on first use (PEP 562), so `agent.kvevents.settings` (which agent.settings needs) does not
# pull in the manager, ZMQ and polars: `tierpilot run` without KV events starts faster.
_EXPORTS = {
    "KvEventsCollector": "agent.kvevents.collector",
    "IndexLimits": "agent.kvevents.index",
    "KvEventManager": "agent.kvevents.manager",
    "EndpointSpec": "agent.kvevents.settings",
    "KvEventsSettings": "agent.kvevents.settings",
    "SettingsError": "agent.kvevents.settings",
    "endpoint_from_annotations": "agent.kvevents.settings",
    "EngineId": "agent.kvevents.signals",
    "KvSignals": "agent.kvevents.signals",
    "KvSnapshot": "agent.kvevents.signals",
    "OverlapReading": "agent.kvevents.workload",
    "PodCounters": "agent.kvevents.workload",
}

if TYPE_CHECKING:
    from agent.kvevents.fleet_overlap import FleetOverlap
    from agent.kvevents.manager import KvEventManager


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


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


def workload_overlap(manager: KvEventManager | FleetOverlap | None, model: str | None = None,
                     window_s: float | None = None) -> float | None:
    """The workload's prefix overlap (0..1) from KV events, or None when unavailable (`manager`:
    anything with `current_overlap`, e.g. a sharded agent's `fleet_overlap.FleetOverlap`)."""
    if manager is None:
        return None
    reading = manager.current_overlap(model, window_s)
    return None if reading is None else reading.ratio
