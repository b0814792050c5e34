"""Typed, frozen settings of the Kubernetes actuator, loaded once from a YAML file.

Example (`deploy/overlays/plain-vllm/targets.yaml`)::

    namespace: llm
    targets:
      - {kind: deployment-env, name: vllm-llama, container: vllm}
      - kind: curvine-configmap
        name: curvine-config
        key: curvine-cluster.toml
        restart: [{kind: StatefulSet, name: curvine-master}]
    fixed_knobs: {router: roundrobin}
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from agent.k8s.mapping import KNOB_NAMES, KindMapping, load_mappings
from contracts.knobs import KnobError, Knobs

TARGETS_ENV = "TIERPILOT_K8S_TARGETS"
DRY_RUN_ENV = "TIERPILOT_DRY_RUN"


class ActuationConfigError(ValueError):
    """The actuator settings file is invalid. The message names the file and the key."""


class _Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class WorkloadRef(_Frozen):
    """A workload whose pods must restart to pick up a changed config file."""

    kind: Literal["Deployment", "StatefulSet"] = "Deployment"
    name: str = Field(min_length=1)


class EnvSourceRef(_Frozen):
    """A ConfigMap or Secret the target's containers take variables from (`envFrom`, `valueFrom`)."""

    kind: Literal["ConfigMap", "Secret"] = "ConfigMap"
    name: str = Field(min_length=1)


class TargetSpec(_Frozen):
    """One object the actuator patches."""

    kind: str = Field(description="A kind from agent/k8s/mappings.yaml, e.g. deployment-env.")
    name: str = Field(min_length=1, description="metadata.name of the object.")
    namespace: str | None = Field(None, description="Defaults to the settings' namespace.")
    container: str | None = Field(None, description="deployment-env: the vLLM container name.")
    key: str | None = Field(None, description="ConfigMap kinds: the data key holding the file.")
    restart: tuple[WorkloadRef, ...] = Field((), description="Workloads rolled after a file change.")
    knobs: tuple[str, ...] | None = Field(None, description="Subset of the kind's knobs to own.")
    session_key: str | None = Field(None, description="router-configmap: written with routing_logic=session.")
    env_sources: tuple[EnvSourceRef, ...] = Field(
        (), description="ConfigMaps and Secrets the containers of this target (or of its `restart` workloads) take "
                        "managed variables from: the Role grants get on each by name, so the agent reads what runs.")

    @field_validator("knobs")
    @classmethod
    def _known_knobs(cls, v: tuple[str, ...] | None) -> tuple[str, ...] | None:
        for k in v or ():
            if k not in KNOB_NAMES:
                raise ValueError(f"unknown knob {k!r}; valid knobs: {', '.join(KNOB_NAMES)}")
        return v


class LeaseSettings(_Frozen):
    enabled: bool = True
    name: str = "tierpilot-leader"
    duration_s: float = Field(15.0, gt=0, description="A lease not renewed for this long may be taken.")
    renew_deadline_s: float = Field(10.0, gt=0, description="The leader stops acting if it cannot renew.")
    retry_period_s: float = Field(2.0, gt=0)

    @model_validator(mode="after")
    def _ordered(self) -> LeaseSettings:
        if not self.retry_period_s < self.renew_deadline_s < self.duration_s:
            raise ValueError("need retry_period_s < renew_deadline_s < duration_s")
        return self


class ActuationSettings(_Frozen):
    namespace: str = Field(min_length=1)
    identity: str = Field(default_factory=lambda: os.environ.get("POD_NAME") or os.uname().nodename)
    dry_run: bool = Field(False, description="Global dry-run: every write is a server-side dry-run.")
    targets: tuple[TargetSpec, ...] = Field(min_length=1)
    fixed_knobs: dict[str, Any] = Field(default_factory=dict, description="Values of knobs no target owns.")
    field_manager: str = "tierpilot"
    rollout_timeout_s: float = Field(600.0, gt=0)
    rollout_poll_s: float = Field(5.0, gt=0)
    conflict_retries: int = Field(3, ge=0, description="Re-read and retry after a 409 / failed test.")
    backoff_base_s: float = Field(1.0, gt=0)
    backoff_max_s: float = Field(300.0, gt=0)
    reapply_limit: int = Field(3, ge=0, description="Re-applies of a reverted setting per window.")
    reapply_window_s: float = Field(3600.0, gt=0)
    watch_timeout_s: int = Field(300, gt=0)
    lease: LeaseSettings = LeaseSettings()

    @field_validator("fixed_knobs")
    @classmethod
    def _valid_fixed(cls, v: dict[str, Any]) -> dict[str, Any]:
        try:
            Knobs.from_mapping(v, source="fixed_knobs")
        except KnobError as exc:
            raise ValueError(str(exc)) from None
        return v

    def check_against(self, mappings: dict[str, KindMapping]) -> None:
        """Cross-checks against the mapping: kinds exist, keys/containers given where needed."""
        for i, t in enumerate(self.targets):
            where = f"targets[{i}] ({t.kind} {t.name})"
            if t.kind not in mappings:
                raise ActuationConfigError(f"{where}: unknown kind; valid kinds: {', '.join(mappings)}")
            m = mappings[t.kind]
            if m.resource == "ConfigMap" and not t.key:
                raise ActuationConfigError(f"{where}: `key` (the ConfigMap data key) is required")
            if m.takes_effect == "restart-workloads" and not t.restart:
                raise ActuationConfigError(
                    f"{where}: `restart` is required: the file is read at start, name the workloads to roll"
                )
            for k in t.knobs or ():
                if k not in m.knobs:
                    raise ActuationConfigError(f"{where}: knob {k!r} is not mapped by {t.kind}; it maps: "
                                               f"{', '.join(m.knobs)}")

    def ns(self, target: TargetSpec) -> str:
        return target.namespace or self.namespace


def load_settings(path: str | Path, **overrides: Any) -> ActuationSettings:
    """Load and validate; errors name the file and the key path."""
    p = Path(path)
    try:
        data = yaml.safe_load(p.read_text()) or {}
    except OSError as exc:
        raise ActuationConfigError(f"{p}: cannot read: {exc.strerror or exc}") from None
    except yaml.YAMLError as exc:
        raise ActuationConfigError(f"{p}: not valid YAML: {exc}") from None
    if not isinstance(data, dict):
        raise ActuationConfigError(f"{p}: expected a mapping at the top level")
    data.update(overrides)
    return settings_from_mapping(data, source=str(p))


def settings_from_mapping(data: dict[str, Any], *, source: str = "settings") -> ActuationSettings:
    try:
        settings = ActuationSettings.model_validate(data)
    except ValidationError as exc:
        first = exc.errors()[0]
        loc = ".".join(str(x) for x in first["loc"]) or "(top level)"
        raise ActuationConfigError(f"{source}: {loc}: {first['msg']}") from None
    settings.check_against(load_mappings())
    return settings


def settings_from_env() -> ActuationSettings:
    """Settings from $TIERPILOT_K8S_TARGETS; $TIERPILOT_DRY_RUN=true forces global dry-run."""
    path = os.environ.get(TARGETS_ENV)
    if not path:
        raise ActuationConfigError(f"${TARGETS_ENV} is not set (path of the actuator targets YAML)")
    overrides: dict[str, Any] = {}
    if os.environ.get(DRY_RUN_ENV, "").lower() in ("1", "true", "yes"):
        overrides["dry_run"] = True
    return load_settings(path, **overrides)
