"""The tunable cache-tier settings ("knobs") as one frozen record.

This is the contract shared by the twin (`tierpilot replay --config`), the tuner (which writes
`best.yaml` in this format), the actuators (Kubernetes and the demo's local one) and the
exported `tierpilot_config_info` metric. Defaults are LMCache's own defaults (chunk 256 tokens,
5 GiB CPU buffer, LRU) with round-robin routing.
"""
from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml

CHUNK_TOKEN_CHOICES: tuple[int, ...] = (64, 128, 256, 512, 1024, 2048)
# Every value some deployment mode accepts; which ones a given deployment offers is the actuator
# mapping's business (agent/k8s/mappings.yaml): LMCache in-process `cache_policy` takes LRU/LFU/FIFO,
# the LMCache MP server's `--eviction-policy` LRU/ARC/IsolatedLRU/noop.
CPU_EVICTION_CHOICES: tuple[str, ...] = ("lru", "lfu", "fifo", "arc", "isolated_lru", "noop")
L2_EVICTION_CHOICES: tuple[str, ...] = ("lru", "lfu", "fifo", "s3fifo", "arc")
# production-stack / HyperPod strategies, then vllm-project/router's policies (`--policy`; it
# spells roundrobin and kvaware as round_robin and kv_aware).
ROUTER_CHOICES: tuple[str, ...] = ("roundrobin", "session", "prefixaware", "kvaware",
                                   "random", "cache_aware", "power_of_two", "consistent_hash")
L2_MIN_PROMPT_TOKENS_MAX = 1 << 20


FLOAT_KNOBS: tuple[str, ...] = ("cpu_gib", "router_temperature", "kv_penalty_host", "kv_penalty_external")


class KnobError(ValueError):
    """An invalid knob value or config file. The message names the key and the valid values."""


@dataclasses.dataclass(frozen=True)
class Knobs:
    """One candidate configuration of the KV-cache tiers.

    chunk_tokens: LMCache `chunk_size` (`LMCACHE_CHUNK_SIZE`), tokens per KV chunk.
    cpu_gib: LMCache `max_local_cpu_size` (`LMCACHE_MAX_LOCAL_CPU_SIZE`), GiB per pod; 0 disables L1.
    cpu_eviction: LMCache `cache_policy` for the CPU tier.
    l2_eviction: eviction policy of the shared L2 pool (Curvine `quota_eviction_policy`).
    l2_high_watermark / l2_low_watermark: Curvine `quota_eviction_high_rate` / `_low_rate`:
        eviction starts when L2 usage reaches high x capacity and frees down to low x capacity.
        1.0 / 1.0 means "evict just enough on demand".
    router: routing strategy (HyperPod `routingStrategy`, production-stack `routing_logic`,
        vllm-project/router `--policy`).
    l2_min_prompt_tokens: prompts shorter than this do not read from L2 (they recompute).
    router_temperature / kv_penalty_host / kv_penalty_external: vllm-project/router `kv_aware`'s
        `--router-temperature` (softmax temperature over worker costs, 0 = minimum cost) and its
        KV transfer credits for host-tier and external-tier KV (0..1). Defaults are the router's.
    """

    chunk_tokens: int = 256
    cpu_gib: float = 5.0
    cpu_eviction: str = "lru"
    l2_eviction: str = "lru"
    l2_high_watermark: float = 1.0
    l2_low_watermark: float = 1.0
    router: str = "roundrobin"
    l2_min_prompt_tokens: int = 0
    router_temperature: float = 0.0
    kv_penalty_host: float = 0.8
    kv_penalty_external: float = 0.6

    def __post_init__(self) -> None:
        _check_choice("chunk_tokens", self.chunk_tokens, CHUNK_TOKEN_CHOICES)
        _check_choice("cpu_eviction", self.cpu_eviction, CPU_EVICTION_CHOICES)
        _check_choice("l2_eviction", self.l2_eviction, L2_EVICTION_CHOICES)
        _check_choice("router", self.router, ROUTER_CHOICES)
        if not isinstance(self.cpu_gib, (int, float)) or isinstance(self.cpu_gib, bool) or self.cpu_gib < 0:
            raise KnobError(f"cpu_gib: must be a number >= 0 (GiB), got {self.cpu_gib!r}")
        for key in ("l2_high_watermark", "l2_low_watermark"):
            v = getattr(self, key)
            if not isinstance(v, (int, float)) or isinstance(v, bool) or not 0.0 < v <= 1.0:
                raise KnobError(f"{key}: must be a fraction in (0, 1], got {v!r}")
        if self.l2_low_watermark > self.l2_high_watermark:
            raise KnobError(
                f"l2_low_watermark ({self.l2_low_watermark}) must not exceed "
                f"l2_high_watermark ({self.l2_high_watermark})"
            )
        for key, high in (("router_temperature", None), ("kv_penalty_host", 1.0), ("kv_penalty_external", 1.0)):
            v = getattr(self, key)
            if (not isinstance(v, (int, float)) or isinstance(v, bool) or not math.isfinite(v) or v < 0
                    or (high is not None and v > high)):
                span = f"in 0..{high:g}" if high is not None else ">= 0"
                raise KnobError(f"{key}: must be a number {span}, got {v!r}")
        v = self.l2_min_prompt_tokens
        if not isinstance(v, int) or isinstance(v, bool) or not 0 <= v <= L2_MIN_PROMPT_TOKENS_MAX:
            raise KnobError(f"l2_min_prompt_tokens: must be an integer in 0..{L2_MIN_PROMPT_TOKENS_MAX}, got {v!r}")

    # -- conversions -------------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def replace(self, **changes: Any) -> Knobs:
        return dataclasses.replace(self, **changes)

    def diff(self, other: Knobs) -> dict[str, tuple[Any, Any]]:
        """Keys whose values differ, as {key: (self value, other value)}."""
        a, b = self.to_dict(), other.to_dict()
        return {k: (a[k], b[k]) for k in a if a[k] != b[k]}

    @classmethod
    def from_mapping(cls, data: Mapping[str, Any], *, source: str = "config") -> Knobs:
        """Build from a mapping; unknown keys are an error that lists the valid keys."""
        if not isinstance(data, Mapping):
            raise KnobError(f"{source}: expected a mapping of knob names to values, got {type(data).__name__}")
        valid = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(data) - valid)
        if unknown:
            raise KnobError(f"{source}: unknown key(s) {', '.join(unknown)}; valid keys: {', '.join(sorted(valid))}")
        values = dict(data)
        for key in FLOAT_KNOBS:
            if key in values and isinstance(values[key], int) and not isinstance(values[key], bool):
                values[key] = float(values[key])
        try:
            return cls(**values)
        except KnobError as exc:
            raise KnobError(f"{source}: {exc}") from None

    def to_yaml(self) -> str:
        return yaml.safe_dump(self.to_dict(), sort_keys=False)

    @classmethod
    def from_yaml_file(cls, path: str | Path) -> Knobs:
        p = Path(path)
        try:
            text = p.read_text()
        except OSError as exc:
            raise KnobError(f"{p}: cannot read config file: {exc.strerror or exc}") from None
        try:
            data = yaml.safe_load(text)
        except yaml.YAMLError as exc:
            raise KnobError(f"{p}: not valid YAML: {exc}") from None
        if data is None:
            data = {}
        # The tuner's output may wrap knobs under a `knobs:` key next to metadata.
        if isinstance(data, Mapping) and "knobs" in data and isinstance(data["knobs"], Mapping):
            data = data["knobs"]
        return cls.from_mapping(data, source=str(p))



def _check_choice(key: str, value: Any, choices: tuple[Any, ...]) -> None:
    if value not in choices or isinstance(value, bool):
        raise KnobError(f"{key}: invalid value {value!r}; valid choices: {', '.join(map(str, choices))}")


DEFAULT_KNOBS = Knobs()

# The router's own knobs: a change to them restarts no process that holds KV cache (the router's
# dynamic config is hot-reloaded; at most the router process restarts). Every other knob is read
# by the engines (LMCache) or the L2 master at start: changing it restarts them and empties their
# caches. The one list `tuner.apply: hot` and the planner's restart pricing go by.
ROUTER_KNOBS: frozenset[str] = frozenset({"router", "router_temperature", "kv_penalty_host", "kv_penalty_external"})


def restarting_knobs(before: Knobs, after: Knobs) -> tuple[str, ...]:
    """The knobs of the change `before` -> `after` that restart cache-holding processes (sorted)."""
    return tuple(sorted(set(before.diff(after)) - ROUTER_KNOBS))
