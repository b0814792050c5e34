"""Typed, frozen settings of the KV-event subscriber, and where the endpoints come from
(a YAML/dict config, or pod annotations found by discovery).

The agent always connects; it never binds. An endpoint must therefore name a reachable host:
vLLM's own `tcp://*:5557` is a bind address and is rejected here with a hint.
"""
from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

if TYPE_CHECKING:  # index and signals load numpy: imported where used, so agent.settings stays light
    from agent.kvevents.index import IndexLimits
    from agent.kvevents.signals import EngineId

ANNOTATION_PREFIX = "tierpilot.io/"
ANNOTATIONS = {
    "kv-events-port": "PUB port vLLM binds (`endpoint` tcp://*:PORT in --kv-events-config)",
    "kv-events-replay-port": "ROUTER port (`replay_endpoint`), optional",
    "kv-events-topic": "topic prefix to subscribe to, optional (default: all)",
    "kv-events-dp-size": "data-parallel size; rank r publishes on PORT + r, optional (default 1)",
    "model": "served model name (label on every signal)",
}


class SettingsError(ValueError):
    """Invalid KV-event settings; the message names the key and what is accepted."""


def offset_endpoint(endpoint: str, dp_rank: int) -> str:
    """The endpoint of data-parallel rank `dp_rank`, as vLLM derives it: tcp port + rank
    (port 0 untouched), inproc gets a `_dp<rank>` suffix."""
    if dp_rank == 0:
        return endpoint
    if endpoint.startswith("inproc://"):
        return f"{endpoint}_dp{dp_rank}"
    if endpoint.startswith("tcp://"):
        host, _, port = endpoint.rpartition(":")
        return endpoint if int(port) == 0 else f"{host}:{int(port) + dp_rank}"
    return endpoint


def _check_connectable(value: str, key: str) -> str:
    if not value.startswith(("tcp://", "ipc://", "inproc://")):
        raise ValueError(f"{key} must start with tcp://, ipc:// or inproc://, got {value!r}")
    if "*" in value:
        raise ValueError(f"{key} {value!r} is a bind address; the agent connects, so give the pod's "
                         f"address, e.g. tcp://10.0.0.5:5557")
    if value.startswith("tcp://"):
        port = value.rpartition(":")[2]
        if not port.isdigit() or not 0 < int(port) < 65536:
            raise ValueError(f"{key} {value!r} needs a port in 1..65535")
    return value


class EndpointSpec(BaseModel):
    """One vLLM pod's event stream(s)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    pod: str = Field(min_length=1, description="pod name (label `pod` on every signal)")
    model: str = Field(min_length=1, description="served model name (label `model`)")
    endpoint: str = Field(description="PUB address to connect to, e.g. tcp://10.0.0.5:5557")
    replay_endpoint: str | None = Field(None, description="ROUTER address for gap catch-up")
    topic: str = Field("", description="subscription prefix; '' receives every topic")
    dp_size: int = Field(1, ge=1, le=256, description="data-parallel ranks; rank r uses port + r")

    @field_validator("endpoint")
    @classmethod
    def _endpoint(cls, v: str) -> str:
        return _check_connectable(v, "endpoint")

    @field_validator("replay_endpoint")
    @classmethod
    def _replay(cls, v: str | None) -> str | None:
        return None if v is None else _check_connectable(v, "replay_endpoint")

    def engines(self) -> list[tuple[EngineId, str, str | None]]:
        """(engine, endpoint, replay endpoint) for every data-parallel rank."""
        from agent.kvevents.signals import EngineId

        return [
            (EngineId(self.pod, self.model, r), offset_endpoint(self.endpoint, r),
             None if self.replay_endpoint is None else offset_endpoint(self.replay_endpoint, r))
            for r in range(self.dp_size)
        ]


class LimitsSpec(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    resident_per_engine: int = Field(262_144, ge=2, description="block hashes kept per engine")
    history_per_engine: int = Field(262_144, ge=2, description="removed hashes remembered per engine")
    seen_capacity: int = Field(8_000_000, ge=2, description="hashes per 'ever seen' Bloom generation")
    seen_generations: int = Field(2, ge=1, le=8, description="Bloom generations kept (ageing)")
    seen_fp_rate: float = Field(0.001, gt=0, lt=0.5, description="Bloom false-positive rate at capacity")
    shadow_l2: int = Field(1_048_576, ge=2, description="hashes whose store order is kept to infer L2 hits")

    def to_limits(self) -> IndexLimits:
        from agent.kvevents.index import IndexLimits

        return IndexLimits(**self.model_dump())


class KvEventsSettings(BaseModel):
    """Everything the KV-event subscriber needs; validated once, then frozen."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    endpoints: tuple[EndpointSpec, ...] = ()
    limits: LimitsSpec = LimitsSpec()
    group_idx: int = Field(0, ge=0, description="KV-cache group indexed (hybrid models have several)")
    replay_timeout_s: float = Field(2.0, gt=0, description="give up a replay request after this")
    replay_on_join: bool = Field(False, description="on the first message, replay the engine's buffer")
    reorder_hold_s: float = Field(0.05, ge=0, description="hold batches this long to merge pods by ts")
    overlap_window_s: float = Field(300.0, gt=0, description="window of the overlap signal")
    rcvhwm: int = Field(100_000, ge=1, description="ZMQ receive high-water mark per stream")

    @classmethod
    def from_mapping(cls, data: Mapping[str, Any], source: str = "<settings>") -> KvEventsSettings:
        try:
            return cls.model_validate(dict(data))
        except ValidationError as exc:
            lines = [f"{source}: invalid KV-event settings:"]
            for err in exc.errors():
                key = ".".join(str(p) for p in err["loc"])
                lines.append(f"  {key}: {err['msg']}")
            raise SettingsError("\n".join(lines)) from None

    @classmethod
    def from_yaml(cls, path: str | Path) -> KvEventsSettings:
        p = Path(path)
        try:
            data = yaml.safe_load(p.read_text()) or {}
        except (OSError, yaml.YAMLError) as exc:
            raise SettingsError(f"{p}: cannot read KV-event settings: {exc}") from None
        if not isinstance(data, dict):
            raise SettingsError(f"{p}: top level must be a mapping with keys {sorted(cls.model_fields)}")
        data = data.get("kv_events", data)
        return cls.from_mapping(data, str(p))


def endpoint_from_annotations(pod: str, pod_ip: str, annotations: Mapping[str, str],
                              default_model: str | None = None) -> EndpointSpec | None:
    """The event stream a pod advertises through `tierpilot.io/kv-events-*` annotations, or None
    when it advertises none. Raises SettingsError naming the annotation when one is invalid."""
    get = (lambda k: annotations.get(ANNOTATION_PREFIX + k))
    port = get("kv-events-port")
    if port is None:
        return None
    model = get("model") or default_model
    if not model:
        raise SettingsError(f"pod {pod}: annotation {ANNOTATION_PREFIX}model is required with "
                            f"{ANNOTATION_PREFIX}kv-events-port")
    host = f"[{pod_ip}]" if ":" in pod_ip else pod_ip
    data: dict[str, Any] = {"pod": pod, "model": model, "endpoint": f"tcp://{host}:{port}"}
    if (rp := get("kv-events-replay-port")) is not None:
        data["replay_endpoint"] = f"tcp://{host}:{rp}"
    if (topic := get("kv-events-topic")) is not None:
        data["topic"] = topic
    if (dp := get("kv-events-dp-size")) is not None:
        if not dp.isdigit():
            raise SettingsError(f"pod {pod}: {ANNOTATION_PREFIX}kv-events-dp-size must be an integer, got {dp!r}")
        data["dp_size"] = int(dp)
    try:
        return EndpointSpec.model_validate(data)
    except ValidationError as exc:
        msgs = "; ".join(f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in exc.errors())
        raise SettingsError(f"pod {pod}: invalid kv-events annotations ({msgs})") from None
