"""Mapping files: which raw metric of which source feeds which unified signal.

One YAML file per source and version lives in `agent/collect/mappings/`. The signal vocabulary below is
fixed in code (tiers.py derives the tier model from it); the files say where each signal comes
from. A file is validated when loaded, and a bad file is one error naming the file and key.
"""
from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from functools import cached_property
from importlib import resources
from pathlib import Path
from typing import Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from contracts.tier_model import ROLES, Role

# signal -> (kind, meaning). "histogram" signals are stored per bucket plus :sum and :count.
SIGNALS: dict[str, tuple[str, str]] = {
    "gpu_lookup_tokens": ("counter", "tokens looked up in the GPU prefix cache"),
    "gpu_hit_tokens": ("counter", "tokens hit in the GPU prefix cache"),
    "gpu_usage_ratio": ("gauge", "fraction of GPU KV blocks in use"),
    "gpu_hit_ratio_gauge": ("gauge", "V0 GPU prefix-cache hit rate gauge; negative = no data"),
    "connector_lookup_tokens": ("counter", "tokens vLLM queried through the KV connector (L1+L2)"),
    "connector_hit_tokens": ("counter", "tokens the KV connector supplied (L1+L2)"),
    "lmcache_lookup_tokens": ("counter", "LMCache in-process: tokens requested for retrieve (L1+L2)"),
    "lmcache_hit_tokens": ("counter", "LMCache in-process: tokens hit on retrieve (L1+L2)"),
    "mp_lookup_tokens": ("counter", "LMCache MP: tokens asked in lookup"),
    "mp_hit_l1_tokens": ("counter", "LMCache MP: tokens hit in L1"),
    "mp_hit_l2_tokens": ("counter", "LMCache MP: tokens hit in L2"),
    "cached_host_tokens": ("counter", "vLLM: cached prompt tokens supplied by host memory"),
    "cached_disk_tokens": ("counter", "vLLM: cached prompt tokens supplied by disk"),
    "l2_read_bytes": ("counter", "bytes read from the L2 pool by this pod"),
    "cpu_evicted_chunks": ("counter", "chunks evicted from L1 (CPU)"),
    "l2_evicted_chunks": ("counter", "chunks evicted from L2 (LMCache MP L2 adapter)"),
    "l2_evicted_files": ("counter", "files evicted from the L2 pool (Curvine quota eviction)"),
    "l2_evicted_bytes": ("counter", "bytes freed by L2 pool eviction (Curvine quota eviction)"),
    "cpu_usage_ratio": ("gauge", "fraction of the L1 (CPU) buffer in use"),
    "cpu_used_bytes": ("gauge", "bytes in the L1 (CPU) buffer"),
    "l2_used_bytes": ("gauge", "bytes used in the L2 pool"),
    "l2_capacity_bytes": ("gauge", "bytes of L2 pool capacity"),
    "prompt_tokens": ("counter", "prefill (prompt) tokens"),
    "prompt_computed_tokens": ("counter", "prompt tokens computed (not served from any cache)"),
    "requests": ("counter", "finished requests"),
    "prefill_seconds": ("histogram", "request prefill time, seconds"),
    "ttft_seconds": ("histogram", "time to first token, seconds"),
    "prompt_length_tokens": ("histogram", "prompt length per request, tokens"),
    "l2_read_latency_seconds": ("histogram", "L2 read latency per I/O, seconds"),
    "l2_write_latency_seconds": ("histogram", "L2 write latency per I/O, seconds"),
    "cached_device_tokens": ("counter", "vLLM: cached prompt tokens supplied by the GPU prefix cache"),
    "cached_external_tokens": ("counter", "vLLM: cached tokens from a connector naming no tier (LMCache)"),
    "prompt_local_hit_tokens": ("counter", "vLLM: prompt tokens served by the local (GPU) prefix cache"),
    "prompt_external_tokens": ("counter", "vLLM: prompt tokens received over the KV connector"),
    "preemptions": ("counter", "vLLM: requests preempted (their KV blocks reclaimed, recomputed later)"),
    "requests_waiting": ("gauge", "vLLM: requests waiting to be scheduled"),
    "gpu_blocks": ("gauge", "vLLM: GPU KV blocks (cache_config_info num_gpu_blocks: the real capacity)"),
    "gpu_block_size": ("gauge", "vLLM: tokens per GPU KV block (cache_config_info block_size)"),
    "gpu_block_lifetime_seconds": ("histogram", "GPU KV block lifetime, allocation to eviction (sampled)"),
    "gpu_idle_before_evict_seconds": ("histogram", "GPU KV block idle time before eviction (sampled)"),
    "gpu_reuse_gap_seconds": ("histogram", "GPU KV block gap between reuses (sampled)"),
    "cpu_block_lifetime_seconds": ("histogram", "L1 (CPU) chunk lifetime, allocation to eviction (sampled)"),
    "cpu_idle_before_evict_seconds": ("histogram", "L1 (CPU) chunk idle time before eviction (sampled)"),
    "cpu_reuse_gap_seconds": ("histogram", "L1 (CPU) chunk gap between reuses (sampled)"),
    "offload_load_bytes": ("counter", "vLLM native offload: bytes loaded from CPU into the GPU"),
    "offload_store_bytes": ("counter", "vLLM native offload: bytes stored from the GPU to CPU"),
    "cached_p2p_tokens": ("counter", "vLLM: cached prompt tokens transferred from another vLLM instance"),
    "offload_load_seconds": ("counter", "vLLM native offload: seconds spent loading from CPU into the GPU"),
    "offload_store_seconds": ("counter", "vLLM native offload: seconds spent storing from the GPU to CPU"),
    # vLLM native tiering (TieringOffloadingSpec): the primary (CPU) tier is L1, the fs tier L2
    "l1_chunk_queries": ("counter", "native tiering: chunk lookups resolved in the primary (CPU) tier"),
    "l1_chunk_hits": ("counter", "native tiering: chunk lookup hits in the primary (CPU) tier"),
    "l2_chunk_queries": ("counter", "native tiering: chunk lookups resolved in the fs tier"),
    "l2_chunk_hits": ("counter", "native tiering: chunk lookup hits in the fs tier"),
    "l2_read_seconds": ("counter", "native tiering: seconds spent reading fs-tier chunks into the CPU tier"),
    "l2_write_bytes": ("counter", "native tiering: bytes written from the CPU tier to the fs tier"),
    "l2_write_seconds": ("counter", "native tiering: seconds spent writing CPU-tier chunks to the fs tier"),
    "l2_promotion_failures": ("counter", "native tiering: failed fs-tier promotion (read) jobs"),
    "l2_cascade_failures": ("counter", "native tiering: failed fs-tier cascade (write) jobs"),
    "l1_promotion_allocation_failures": ("counter", "native tiering: promotions the CPU tier had no room for"),
    "l1_lookup_seconds": ("histogram", "native tiering: blocking time of one CPU-tier chunk lookup, seconds"),
    "l2_lookup_seconds": ("histogram", "native tiering: blocking time of one fs-tier chunk lookup, seconds"),
    "l2_lookup_async_seconds": ("histogram", "native tiering: first retry to resolution of an fs-tier lookup, s"),
    "l2_promotion_l1_usage_ratio": ("gauge", "native tiering: share of the CPU tier held by fs-tier reads"),
    "l2_cascade_l1_usage_ratio": ("gauge", "native tiering: share of the CPU tier held by fs-tier writes"),
    "l2_promotion_jobs": ("gauge", "native tiering: fs-tier read (promotion) jobs in flight"),
    "l2_cascade_jobs": ("gauge", "native tiering: fs-tier write (cascade) jobs in flight"),
    "router_requests": ("counter", "requests the router received"),
    "router_latency_seconds": ("histogram", "request latency measured at the router, seconds"),
}

WireType = Literal["counter", "gauge", "histogram"]
Aggregation = Literal["sum", "mean", "max"]


class MappingError(ValueError):
    """A mapping file is invalid; the message names the file and the key."""


class MetricRule(BaseModel):
    """One raw metric (or a label-filtered part of it) feeding one signal."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str = Field(description="wire name as written with the file's canonical prefix, e.g. vllm:x_total")
    signal: str
    type: WireType = "counter"
    where: dict[str, str] = Field(default_factory=dict, description="label equality filter")
    scale: float = Field(default=1.0, gt=0, description="multiply values (and `le`) by this, e.g. 1e-6 for us")
    agg: Aggregation | None = Field(default=None, description="how series of one pod+model combine")
    fallback_only: bool = Field(default=False, description="use only if no other rule gave this signal")
    buckets: bool = Field(default=True, description="histograms: keep the buckets (False: only sum/count)")
    value_from_label: str | None = Field(
        default=None, description="gauges: the value is this label's number (info metrics such as "
                                  "vllm:cache_config_info); series whose label is not a number are skipped")

    @field_validator("signal")
    @classmethod
    def _known_signal(cls, v: str) -> str:
        if v not in SIGNALS:
            raise ValueError(f"unknown signal {v!r}; valid: {', '.join(sorted(SIGNALS))}")
        return v

    @model_validator(mode="after")
    def _type_matches(self) -> MetricRule:
        kind = SIGNALS[self.signal][0]
        if (kind == "histogram") != (self.type == "histogram"):
            raise ValueError(f"signal {self.signal!r} is a {kind}; rule type is {self.type!r}")
        if self.value_from_label is not None and self.type != "gauge":
            raise ValueError("value_from_label needs type gauge")
        return self

    @property
    def aggregation(self) -> Aggregation:
        return self.agg or ("mean" if self.type == "gauge" else "sum")


class Mapping(BaseModel):
    """One source (and version): which roles it applies to and its metric rules."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    source: str = Field(pattern=r"^[a-z0-9_]+$", description="value of the `source` label")
    description: str = ""
    roles: tuple[Role, ...]
    preference: int = Field(default=100, description="lower wins when two sources give one signal")
    prefixes: dict[str, str] = Field(default_factory=dict, description="wire prefix aliases -> canonical")
    model_labels: tuple[str, ...] = ("model_name",)
    reject_labels: tuple[str, ...] = ()
    metrics: tuple[MetricRule, ...]

    @field_validator("roles")
    @classmethod
    def _roles(cls, v: tuple[str, ...]) -> tuple[str, ...]:
        bad = [r for r in v if r not in ROLES]
        if bad:
            raise ValueError(f"unknown role(s) {bad}; valid: {', '.join(ROLES)}")
        return v

    def wire_names(self) -> dict[str, list[MetricRule]]:
        """Every wire name this file reads (histogram suffixes and prefix aliases included)."""
        out: dict[str, list[MetricRule]] = {}
        for rule in self.metrics:
            bases = [rule.name] + [
                alias + rule.name[len(canon):]
                for alias, canon in self.prefixes.items()
                if rule.name.startswith(canon)
            ]
            for base in bases:
                if rule.type != "histogram":
                    names = [base]
                elif rule.buckets:
                    names = [base + "_bucket", base + "_sum", base + "_count"]
                else:
                    names = [base + "_sum", base + "_count"]
                for n in names:
                    out.setdefault(n, []).append(rule)
        return out


@dataclass(frozen=True)
class MappingSet:
    """All loaded mappings, with the lookup tables the normaliser needs."""

    mappings: tuple[Mapping, ...]

    @cached_property
    def by_role(self) -> dict[str, tuple[Mapping, ...]]:
        return {role: tuple(m for m in self.mappings if role in m.roles) for role in ROLES}

    @cached_property
    def wanted(self) -> dict[str, frozenset[str]]:
        """Per role: the wire names worth decoding."""
        return {
            role: frozenset(n for m in maps for n in m.wire_names())
            for role, maps in self.by_role.items()
        }

    @cached_property
    def rule_names(self) -> dict[int, tuple[tuple[str, ...], frozenset[str]]]:
        """id(rule) -> (its base names with the mapping's prefix aliases, every wire name it can
        read: a histogram's `_bucket`/`_sum`/`_count`). The normaliser skips a rule none of whose
        wire names is in a payload (most rules, on most pods)."""
        out: dict[int, tuple[tuple[str, ...], frozenset[str]]] = {}
        for m in self.mappings:
            for r in m.metrics:
                names = (r.name,) + tuple(alias + r.name[len(canon):] for alias, canon in m.prefixes.items()
                                          if r.name.startswith(canon))
                suffixes = ("_bucket", "_sum", "_count") if r.type == "histogram" else ("",)
                out[id(r)] = (names, frozenset(n + sfx for n in names for sfx in suffixes))
        return out

    @cached_property
    def source_rank(self) -> dict[tuple[str, str], tuple[bool, int, str]]:
        """(source, signal) -> sort key: fallback-only rules last, then preference, then name."""
        fallback = {(m.source, r.signal) for m in self.mappings for r in m.metrics if r.fallback_only}
        return {
            (m.source, r.signal): ((m.source, r.signal) in fallback, m.preference, m.source)
            for m in self.mappings for r in m.metrics
        }

    def source(self, name: str) -> Mapping:
        for m in self.mappings:
            if m.source == name:
                return m
        raise KeyError(name)


def load_mapping(path: Path | str, text: str | None = None) -> Mapping:
    """Load and validate one mapping file."""
    path = Path(path)
    try:
        raw = yaml.safe_load(text if text is not None else path.read_text())
    except yaml.YAMLError as exc:
        raise MappingError(f"{path}: not valid YAML: {exc}") from exc
    if not isinstance(raw, dict):
        raise MappingError(f"{path}: expected a mapping at the top level")
    try:
        return Mapping.model_validate(raw)
    except ValidationError as exc:
        first = exc.errors()[0]
        key = ".".join(str(p) for p in first["loc"])
        raise MappingError(f"{path}: key {key!r}: {first['msg']}") from exc


def builtin_mapping_paths() -> list[Path]:
    folder = resources.files("agent.collect") / "mappings"
    return sorted(Path(str(p)) for p in folder.iterdir() if str(p).endswith(".yaml"))


def load_mappings(paths: Iterable[Path | str] | None = None) -> MappingSet:
    """Load the built-in mappings (or the given files); sources must be unique."""
    loaded = tuple(load_mapping(p) for p in (paths if paths is not None else builtin_mapping_paths()))
    seen: set[str] = set()
    for m in loaded:
        if m.source in seen:
            raise MappingError(f"duplicate mapping source {m.source!r}")
        seen.add(m.source)
    return MappingSet(loaded)
