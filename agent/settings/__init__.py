"""Typed, frozen agent settings: a YAML file, overridden by environment variables.

Environment overrides use the prefix `TIERPILOT_` and `__` between levels, e.g.
`TIERPILOT_SCRAPE__TIMEOUT_S=3` or `TIERPILOT_SERVER__PORT=9500`. Settings are validated once at
start; a bad value or an unknown key is one `SettingsError` naming the file and the key.

One schema, one concern per module:
- `collection.py`: what the agent collects and serves (`scrape:`, `store:`, `server:`, `targets:`,
  `prometheus:`, `shard:`, `tiers:`, `kv_events:`, `export:`);
- `tuner.py`: the `tuner:` sections, the one home of every tuner default, and `actuation:`;
- `loading.py`: `AgentSettings` (every section, environment overrides), `load_settings`, `SettingsError`;
- `frozen.py`: the base of every section (frozen, unknown keys refused).
"""
from __future__ import annotations

from agent.settings.collection import (
    DEFAULT_PORTS,
    BasicAuth,
    ExportSettings,
    KubernetesSettings,
    KvEventsSection,
    PrometheusSourceSettings,
    RoleDiscovery,
    ScrapeSettings,
    ServerSettings,
    ShardSettings,
    StaticTarget,
    StoreSettings,
    TargetSettings,
    TierSettings,
    TlsSettings,
)
from agent.settings.loading import ENV_PREFIX, MAX_SHOWN_ERRORS, AgentSettings, SettingsError, load_settings
from agent.settings.tuner import (
    DRIFT_SIGNAL_NAMES,
    ActuationSection,
    DriftSection,
    DriftSignal,
    FleetBoundsSection,
    GuardrailsSection,
    LimitsSection,
    LiveSection,
    PlannerSection,
    RegressionSection,
    ShadowSection,
    TunerSection,
    WarmStartSection,
)
from contracts.tier_model import ROLES

__all__ = [
    "DEFAULT_PORTS",
    "DRIFT_SIGNAL_NAMES",
    "ENV_PREFIX",
    "MAX_SHOWN_ERRORS",
    "ROLES",
    "ActuationSection",
    "AgentSettings",
    "BasicAuth",
    "DriftSection",
    "DriftSignal",
    "ExportSettings",
    "FleetBoundsSection",
    "GuardrailsSection",
    "KubernetesSettings",
    "KvEventsSection",
    "LimitsSection",
    "LiveSection",
    "PlannerSection",
    "PrometheusSourceSettings",
    "RegressionSection",
    "RoleDiscovery",
    "ScrapeSettings",
    "ServerSettings",
    "SettingsError",
    "ShadowSection",
    "ShardSettings",
    "StaticTarget",
    "StoreSettings",
    "TargetSettings",
    "TierSettings",
    "TlsSettings",
    "TunerSection",
    "WarmStartSection",
    "load_settings",
]
