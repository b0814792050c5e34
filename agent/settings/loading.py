"""The whole agent's settings (`AgentSettings`: every section, environment overrides) and how they
are loaded (`load_settings`) and refused (`SettingsError`, one line naming the source and the keys)."""
from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import Field, ValidationError, model_validator
from pydantic_settings import BaseSettings, PydanticBaseSettingsSource, SettingsConfigDict

from agent.settings.collection import (
    ExportSettings,
    KvEventsSection,
    PrometheusSourceSettings,
    ScrapeSettings,
    ServerSettings,
    ShardSettings,
    StoreSettings,
    TargetSettings,
    TierSettings,
)
from agent.settings.tuner import ActuationSection, TunerSection
from exporters.settings import OtelSettings

ENV_PREFIX = "TIERPILOT_"


class SettingsError(ValueError):
    """Invalid configuration; the message names the source and the key."""


class AgentSettings(BaseSettings):
    """All agent settings. Build with `load_settings`."""

    model_config = SettingsConfigDict(
        frozen=True, extra="forbid", env_prefix=ENV_PREFIX, env_nested_delimiter="__",
    )

    scrape: ScrapeSettings = ScrapeSettings()
    store: StoreSettings = StoreSettings()
    server: ServerSettings = ServerSettings()
    otel: OtelSettings = OtelSettings()
    targets: TargetSettings = TargetSettings()
    tiers: TierSettings = TierSettings()
    mappings: tuple[Path, ...] = Field((), description="extra mapping files (added to the built-in ones)")
    source: Literal["scrape", "prometheus"] = Field(
        "scrape", description="scrape: fetch every target's /metrics; prometheus: query `prometheus.url`")
    prometheus: PrometheusSourceSettings = PrometheusSourceSettings()
    shard: ShardSettings = ShardSettings()
    export: ExportSettings = ExportSettings()
    log_level: Literal["DEBUG", "INFO", "WARNING", "ERROR"] = "INFO"
    kv_events: KvEventsSection = KvEventsSection()
    tuner: TunerSection = TunerSection()
    actuation: ActuationSection = ActuationSection()
    dry_run: bool = Field(False, description="propose and log changes, apply nothing ($TIERPILOT_DRY_RUN)")

    @classmethod
    def settings_customise_sources(
        cls, settings_cls: type[BaseSettings], init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource, dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        return (env_settings, init_settings)  # environment wins over the file

    @model_validator(mode="after")
    def _one_exporter_per_series(self) -> AgentSettings:
        if self.export.fleet == "leader" and self.shard.count > 1:
            raise ValueError("export.fleet 'leader' with shard.count > 1 would hide the other shards' series; "
                             "with sharding every replica exports its own shard: use export.fleet 'all'")
        return self

    @model_validator(mode="after")
    def _source_has_url(self) -> AgentSettings:
        if self.source == "prometheus" and not self.prometheus.url:
            raise ValueError("source 'prometheus' needs prometheus.url")
        return self

    @property
    def cpu_capacity_bytes(self) -> float | None:
        gib = self.tiers.cpu_capacity_gib
        return gib * 2**30 if gib else None


MAX_SHOWN_ERRORS = 8  # a config with more problems than this names the first ones and counts the rest


def _describe(exc: ValidationError, origin: str) -> str:
    """Every problem of the config on one line (at most MAX_SHOWN_ERRORS, then a count)."""
    errors = exc.errors()
    parts = []
    for err in errors[:MAX_SHOWN_ERRORS]:
        key = ".".join(str(p) for p in err["loc"]) or "(top level)"
        msg = "unknown key" if err["type"] == "extra_forbidden" else err["msg"]
        parts.append(f"key {key!r}: {msg}")
    rest = len(errors) - MAX_SHOWN_ERRORS
    extra = f" (and {rest} more)" if rest > 0 else ""
    return f"{origin}: " + "; ".join(parts) + extra


def load_settings(path: Path | str | None = None, env: Mapping[str, str] | None = None,
                  **overrides: Any) -> AgentSettings:
    """Settings from `path` (YAML), then `TIERPILOT_*` environment variables, then overrides."""
    data: dict[str, Any] = {}
    origin = "settings"
    if path is not None:
        path = Path(path)
        origin = str(path)
        try:
            loaded = yaml.safe_load(path.read_text())
        except OSError as exc:
            raise SettingsError(f"{path}: cannot read: {exc.strerror}") from exc
        except yaml.YAMLError as exc:
            raise SettingsError(f"{path}: not valid YAML: {exc}") from exc
        if loaded is None:
            loaded = {}
        if not isinstance(loaded, dict):
            raise SettingsError(f"{path}: expected a mapping at the top level, got {type(loaded).__name__}")
        data = loaded
    data.update(overrides)
    saved = None
    if env is not None:  # evaluate against an explicit environment (tests)
        saved = {k: v for k, v in os.environ.items() if k.startswith(ENV_PREFIX)}
        for k in saved:
            del os.environ[k]
        os.environ.update({k: v for k, v in env.items() if k.startswith(ENV_PREFIX)})
    try:
        return AgentSettings(**data)
    except ValidationError as exc:
        env_keys = _settings_env_keys(env if env is not None else os.environ)
        where = origin + (f" (with environment {', '.join(env_keys)})" if env_keys else "")
        raise SettingsError(_describe(exc, where)) from exc
    finally:
        if saved is not None:
            for k in [k for k in os.environ if k.startswith(ENV_PREFIX)]:
                del os.environ[k]
            os.environ.update(saved)


def _settings_env_keys(environ: Mapping[str, str]) -> list[str]:
    """The `TIERPILOT_*` variables that name a settings field (others, such as
    `TIERPILOT_SHARED` or `TIERPILOT_K8S_TARGETS`, belong to other tools and are not config)."""
    fields = {name.upper() for name in AgentSettings.model_fields}
    return sorted(k for k in environ
                  if k.startswith(ENV_PREFIX) and k[len(ENV_PREFIX):].split("__", 1)[0] in fields)
