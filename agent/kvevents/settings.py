"""Typed, frozen settings of the KV-event subscriber, and where the endpoints come from
(a YAML/dict config, or pod annotations found by discovery).

The agent always connects; it never binds. An endpoint must therefore name a reachable host:
vLLM's own `tcp://*:5557` is a bind address and is rejected here with a hint.
"""
from __future__ import annotations

import math
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

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


MAX_SKETCH_BYTES = 512 * 2**20  # every model's "ever seen" sketch together


def sketch_bytes(capacity: int, fp_rate: float, generations: int) -> int:
    """What `SeenSketch(capacity, fp_rate, generations)` allocates (bits rounded up to 2^n)."""
    want_bits = -capacity * math.log(fp_rate) / (math.log(2) ** 2)
    return generations * max(64, 1 << math.ceil(math.log2(want_bits))) // 8


class LimitsSpec(BaseModel):
    """Memory budgets of the block index: per pod (shared by its data-parallel ranks, whatever
    `dp_size` says) and for the whole fleet (shared by every engine of every pod)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    resident_per_pod: int = Field(262_144, ge=2, le=16_777_216, description="resident block hashes per pod")
    history_per_pod: int = Field(262_144, ge=2, le=16_777_216, description="removed hashes remembered per pod")
    fleet_resident: int = Field(1_048_576, ge=2, le=67_108_864, description="resident hashes, whole fleet")
    fleet_history: int = Field(1_048_576, ge=2, le=67_108_864, description="removed hashes, whole fleet")
    max_models: int = Field(4, ge=1, le=64, description="models indexed (each has its own sketch)")
    seen_capacity: int = Field(8_000_000, ge=2, le=100_000_000, description="hashes per 'ever seen' Bloom generation")
    seen_generations: int = Field(2, ge=1, le=8, description="Bloom generations kept (ageing)")
    seen_fp_rate: float = Field(0.001, ge=1e-6, lt=0.5, description="Bloom false-positive rate at capacity")
    shadow_l2: int = Field(1_048_576, ge=2, le=16_777_216,
                           description="hashes whose store order is kept to infer L2 hits, whole fleet")
    capacity_curve_blocks: int = Field(1_000_000, ge=1, le=16_777_216,
                                       description="GPU-stored blocks kept per model for the CPU capacity curve "
                                                   "(20 bytes each)")

    @model_validator(mode="before")
    @classmethod
    def _renamed(cls, data: Any) -> Any:
        """`resident_per_engine` / `history_per_engine` (before the budgets were per pod) are read
        as the per-pod budgets."""
        if isinstance(data, Mapping):
            data = dict(data)
            for old, new in (("resident_per_engine", "resident_per_pod"), ("history_per_engine", "history_per_pod")):
                if old in data and new not in data:
                    data[new] = data.pop(old)
        return data

    @model_validator(mode="after")
    def _sketch_budget(self) -> LimitsSpec:
        total = self.max_models * sketch_bytes(self.seen_capacity, self.seen_fp_rate, self.seen_generations)
        if total > MAX_SKETCH_BYTES:
            raise ValueError(f"seen_capacity x seen_generations x max_models needs {total / 2**20:.0f} MiB of "
                             f"sketches, more than {MAX_SKETCH_BYTES // 2**20} MiB: lower one of them")
        return self

    def engine_caps(self, dp_size: int, engines: int) -> tuple[int, int]:
        """(resident, history) cap of one engine of a pod with `dp_size` ranks in a fleet of
        `engines` engines: its share of the pod budget and of the fleet budget, whichever is less."""
        engines = max(1, engines)
        return (max(2, min(self.resident_per_pod // dp_size, self.fleet_resident // engines)),
                max(2, min(self.history_per_pod // dp_size, self.fleet_history // engines)))

    def to_limits(self) -> IndexLimits:
        from agent.kvevents.index import IndexLimits

        return IndexLimits(self.resident_per_pod, self.history_per_pod, self.seen_capacity, self.seen_generations,
                           self.seen_fp_rate, self.shadow_l2)


class RebuildSpec(BaseModel):
    """The block-stream recorder and the planning workload rebuilt from it
    (agent/kvevents/rebuild/)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    retain_s: float = Field(3600.0, gt=0, le=7 * 86400.0, description="stored chains kept this long")
    max_refs: int = Field(48_000_000, ge=1024, le=2_000_000_000,
                          description="block references kept, every model; beyond it the recorder samples "
                                      "requests by hash (about 16 bytes a reference at the peak of a compaction)")
    engine_refs_per_s: float = Field(50_000.0, gt=0, le=1e9,
                                     description="block references one engine may record per second (a token "
                                                 "bucket of 10 s); beyond it its chains are dropped and counted")
    engine_share: float = Field(2.0, ge=1.0, le=1000.0,
                                description="an engine's block references in a rebuilt window are capped at "
                                            "this multiple of the median engine's")
    join_s: float = Field(1.0, ge=0, le=60.0,
                          description="a store that continues an engine's chain within this many seconds "
                                      "belongs to the same request (chunked prefill)")
    output_tokens: int = Field(250, ge=1, le=1_000_000,
                               description="output length given to rebuilt requests (the events carry none; the fitted "
                                           "workload's mean)")


class KvEventsSettings(BaseModel):
    """Everything the KV-event subscriber needs; validated once, then frozen."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    endpoints: tuple[EndpointSpec, ...] = ()
    limits: LimitsSpec = LimitsSpec()
    rebuild: RebuildSpec = RebuildSpec()
    group_idx: int = Field(0, ge=0, le=1024, description="KV-cache group indexed (hybrid models have several)")
    replay_timeout_s: float = Field(2.0, gt=0, le=60.0, description="give up a replay request after this")
    replay_on_join: bool = Field(False, description="on the first message, replay the engine's buffer")
    reorder_hold_s: float = Field(0.05, ge=0, le=10.0, description="hold batches this long to merge pods by ts")
    overlap_window_s: float = Field(300.0, gt=0, le=7 * 86400.0, description="window of the overlap signal")
    rcvhwm: int = Field(10_000, ge=1, le=1_000_000,
                        description="ZMQ receive high-water mark (messages) per pod, shared by its DP ranks")
    max_message_bytes: int = Field(8 * 2**20, ge=4096, le=256 * 2**20,
                                   description="ZMQ_MAXMSGSIZE: a larger frame disconnects its publisher")
    max_sequence_jump: int = Field(1_000_000, ge=1, le=2**40,
                                   description="a forward jump beyond this is a broken stream, not a gap")
    replay_pending_bytes: int = Field(64 * 2**20, ge=2**20, le=2**30,
                                      description="live bytes queued behind replays, whole fleet")
    queue_bytes: int = Field(128 * 2**20, ge=2**20, le=4 * 2**30,
                             description="wire bytes of received batches waiting for the index, whole fleet; "
                                         "beyond it new batches are shed (counted)")

    @classmethod
    def from_mapping(cls, data: Mapping[str, Any], source: str = "<settings>") -> KvEventsSettings:
        try:
            return cls.model_validate(dict(data))
        except ValidationError as exc:
            raise SettingsError(f"{source}: invalid KV-event settings: {one_line(exc, 'kv_events')}") from None

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


def one_line(exc: ValidationError, prefix: str = "") -> str:
    """Pydantic's errors as one line, each naming its key (`kv_events.limits.seen_capacity`)."""
    parts = []
    for err in exc.errors():
        key = ".".join(str(p) for p in (prefix, *err["loc"]) if p != "")
        msg = err["msg"].removeprefix("Value error, ")
        parts.append(f"{key}: {msg}" + (f" (got {err['input']!r})" if not isinstance(err["input"], (dict, list)) else ""))
    return "; ".join(parts)


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
