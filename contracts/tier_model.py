"""Frozen records shared by the agent: targets, raw samples, normalised signals, the snapshot.

Data flows one way: `Target` -> fetched text -> `Sample`s (parse.py) -> `Signal`s (normalise.py)
-> the window store (store.py) -> a `Snapshot` (snapshot.py) -> the exporters.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Literal, NamedTuple

from contracts.redact import redact_url

Role = Literal["vllm", "lmcache", "curvine-master", "curvine-worker", "curvine-fuse", "router"]
ROLES: tuple[Role, ...] = ("vllm", "lmcache", "curvine-master", "curvine-worker", "curvine-fuse", "router")
# A target given without a role: the scrape detects it from the payload (agent/collect/roles.py).
AUTO_ROLE = "auto"

Tier = Literal["gpu", "cpu", "l2"]
TIERS: tuple[Tier, ...] = ("gpu", "cpu", "l2")

QUANTILES: tuple[float, ...] = (0.5, 0.95, 0.99)


@dataclass(frozen=True, slots=True)
class Target:
    """One scrape endpoint. `pod` ties the endpoints of one pod together (vLLM, an LMCache
    sidecar, a Curvine FUSE client); `node` lets a per-node FUSE client be matched to a pod."""

    url: str
    role: Role  # or AUTO_ROLE until the first scrape detects it
    pod: str
    namespace: str = ""
    node: str = ""

    @property
    def key(self) -> str:
        """Stable identity, used as the `target` label: the URL with credentials redacted."""
        return redact_url(self.url)


class Sample(NamedTuple):
    """One exposition line: wire name (colons kept), labels, value, optional timestamp.
    `labels` is a fresh dict owned by the sample; treat it as read-only."""

    name: str
    labels: dict[str, str]
    value: float
    timestamp: float | None = None


class Signal(NamedTuple):
    """A normalised value for one pod and model, at one scrape.

    `name` is from the fixed signal vocabulary (see mapping.py); histograms are stored as one
    signal per bucket (`le` set) plus `<name>:sum` and `<name>:count` with `le` = NaN.
    `kind` is "counter" or "gauge" (buckets, sums and counts are counters)."""

    pod: str
    model: str
    name: str
    le: float
    value: float
    kind: str
    source: str


NO_LE = math.nan


@dataclass(frozen=True, slots=True)
class TierView:
    """The unified view of one tier of one pod and model."""

    pod: str
    model: str
    tier: Tier
    source: str
    lookup_tokens: float | None = None  # lifetime total
    hit_tokens: float | None = None  # lifetime total
    hit_ratio: float | None = None  # tier-conditional, over the window
    cumulative_hit_ratio: float | None = None  # share of prompt tokens served by this tier or above
    evicted_chunks: float | None = None  # lifetime total, LMCache chunks
    evicted_files: float | None = None  # lifetime total, Curvine files
    evicted_bytes: float | None = None  # lifetime total, Curvine bytes freed
    usage_ratio: float | None = None
    read_seconds: float | None = None  # lifetime total: time spent reading this tier (native tiering's fs tier)
    read_latency_seconds: float | None = None  # mean seconds per chunk read from this tier, over the window

    @property
    def estimated(self) -> bool:
        return self.source.startswith("estimated")


@dataclass(frozen=True, slots=True)
class PodView:
    """Per pod and model: traffic and latency."""

    pod: str
    model: str
    prompt_tokens: float | None = None  # lifetime total
    requests: float | None = None  # lifetime total
    ttft_quantiles: dict[float, float] = field(default_factory=dict)
    prompt_token_rate: float | None = None  # tokens/s over the window
    request_rate: float | None = None  # requests/s over the window
    l2_break_even_tokens: float | None = None
    # GPU pressure, from vLLM (the latency model's load term) and its real KV capacity
    gpu_capacity_tokens: float | None = None  # cache_config_info num_gpu_blocks x block_size
    requests_waiting: float | None = None  # latest gauge, summed over engines
    preemptions: float | None = None  # lifetime total
    preemption_rate: float | None = None  # preemptions/s over the window


EvictionMeasure = Literal["lifetime", "idle_before_evict", "reuse_gap"]
EVICTION_MEASURES: tuple[EvictionMeasure, ...] = ("lifetime", "idle_before_evict", "reuse_gap")


@dataclass(frozen=True, slots=True)
class EvictionAgeView:
    """Quantiles (seconds) of one sampled block-age histogram of one tier of one pod: vLLM's
    `kv_block_*` for `gpu`, LMCache MP's `l1_chunk_*` for `cpu`."""

    pod: str
    tier: Tier
    measure: EvictionMeasure
    quantiles: dict[float, float]


@dataclass(frozen=True, slots=True)
class HistogramView:
    """Lifetime cumulative buckets of one histogram (Prometheus and OTLP export): bounds, counts, sum."""

    pod: str
    model: str
    bounds: tuple[float, ...]  # finite upper bounds, ascending
    cumulative_counts: tuple[float, ...]  # one per bound, plus the +Inf bucket last
    total: float
    count: float


@dataclass(frozen=True, slots=True)
class L2IoView:
    """L2 I/O latency of one pod, in seconds: window quantiles and lifetime buckets. `source` says
    what was timed: `curvine_fuse` times each FUSE I/O (one chunk read or written), `lmcache_*`
    each LMCache remote request (a whole get or put, many chunks): one source per pod and op."""

    pod: str
    op: Literal["read", "write"]
    quantiles: dict[float, float]
    histogram: HistogramView | None = None
    source: str = ""


@dataclass(frozen=True, slots=True)
class TargetStatus:
    """What the last attempt at one target gave."""

    target: Target
    up: bool
    duration_s: float
    reason: str = ""  # failure reason when not up; "" when up
    detail: str = ""
    samples: int = 0
    errors: dict[str, int] = field(default_factory=dict)  # lifetime count per reason
    skipped: bool = False  # not attempted this cycle (back-off)
    # (reason, detail) pairs that do not mark the target down: `no_mapped_series` (the payload fed
    # no signal: what was seen is named), `lmcache_series_missing` (see docs/runbooks.md)
    warnings: tuple[tuple[str, str], ...] = ()


@dataclass(frozen=True, slots=True)
class Snapshot:
    """Everything the exporters serve, computed once per scrape cycle."""

    taken_at: float
    tiers: tuple[TierView, ...] = ()
    pods: tuple[PodView, ...] = ()
    l2_io: tuple[L2IoView, ...] = ()
    eviction_ages: tuple[EvictionAgeView, ...] = ()
    ttft_histograms: tuple[HistogramView, ...] = ()
    targets: tuple[TargetStatus, ...] = ()
    cycle_duration_s: float = 0.0
    store_rows: int = 0

    @staticmethod
    def empty() -> Snapshot:
        return Snapshot(taken_at=0.0)
