"""The unified tier model: signals of one pod and model -> per-tier counts. Pure functions.

Input is a dict of signal -> value (counters as lifetime totals or as increases over a window;
gauges as their latest value) and the source each signal came from. The same function serves
both: lifetime totals feed the `_total` counters, window increases feed the ratios.

Tiers: `gpu` (vLLM prefix cache), `cpu` (LMCache L1), `l2` (shared pool). `lookup` is the tokens
that reached a tier's lookup, `hit` the tokens that tier served, so the tier-conditional hit
ratio is hit / lookup. A token only reaches the CPU tier after missing on the GPU, and the L2 tier
after missing both.

The L1/L2 split has several possible sources, tried in this fixed order (the winner is the
`source` label; an estimate says so in its name):

1. `lmcache_mp`: LMCache MP per-tier lookup hits (exact);
   `vllm_tiering`: vLLM's native tiering, per-tier chunk lookups and hits of the CPU
   primary tier (L1) and the fs tier (L2), exact: the hit ratios are the engine's own. Chunks become
   tokens at the offload chunk size, `offload_chunk_tokens`;
2. `vllm_by_source`: vLLM `prompt_tokens_cached_by_source{source=host|disk}` (exact when the
   connector labels its hits by tier);
   LMCache's connectors never do: their hits are `external_unspecified` (vLLM's
   `kv_connector/v1/base.py` default), `host`/`disk` stay 0, and this source is skipped;
3. `vllm_native_offload`: vLLM's own OffloadingConnector (`vllm:kv_offload_*` present) has one
   offload tier, CPU memory: every connector hit is an L1 hit and there is no `l2` row;
4. `estimated_l2_read_bytes`: L2 read bytes (Curvine FUSE, else LMCache remote reads) divided by
   KV bytes per token gives L2 hit tokens; the rest of the connector hits are L1;
5. `connector_combined`: no split known: the `cpu` tier reports L1 and L2 together, no `l2` row
   (and no `cpu` row either while the connector has never seen a token).
"""
from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from dataclasses import dataclass

from agent.collect.counter_math import ratio
from contracts.tier_model import TIERS, Tier

SPLIT_ORDER: tuple[str, ...] = ("lmcache_mp", "vllm_tiering", "vllm_by_source", "vllm_native_offload", "estimated_l2_read_bytes",
                                 "connector_combined")
NATIVE_OFFLOAD_SIGNALS = ("offload_load_bytes", "offload_store_bytes")


@dataclass(frozen=True, slots=True)
class TierCounts:
    tier: Tier
    source: str
    lookup: float | None = None
    hit: float | None = None
    evicted_chunks: float | None = None
    evicted_files: float | None = None
    evicted_bytes: float | None = None
    usage: float | None = None
    read_seconds: float | None = None  # time spent reading this tier into the one above (native tiering)
    read_chunks: float | None = None  # chunks read in that time
    hit_ratio_gauge: float | None = None  # only when no counters exist (vLLM V0 hit-rate gauge)

    @property
    def hit_ratio(self) -> float | None:
        r = ratio(self.hit, self.lookup)
        return r if r is not None else self.hit_ratio_gauge

    @property
    def read_latency(self) -> float | None:
        """Mean seconds to read one chunk from this tier."""
        return ratio(self.read_seconds, self.read_chunks)


def _connector(values: Mapping[str, float], sources: Mapping[str, str]) -> tuple[float, float, str] | None:
    if "connector_lookup_tokens" in values and "connector_hit_tokens" in values:
        return values["connector_lookup_tokens"], values["connector_hit_tokens"], sources["connector_hit_tokens"]
    if "lmcache_lookup_tokens" in values and "lmcache_hit_tokens" in values:
        return values["lmcache_lookup_tokens"], values["lmcache_hit_tokens"], sources["lmcache_hit_tokens"]
    return None


def offload_chunk_tokens(values: Mapping[str, float]) -> float:
    """Tokens per native-tiering chunk: the tokens vLLM counted as cached from host and disk per
    chunk hit in the CPU and fs tiers, rounded to a multiple of the engine's block size (the offload
    `block_size` must be one); the engine's block size while no chunk has hit; 1 (count chunks)
    without either."""
    block = values.get("gpu_block_size") or 0.0
    hits = values.get("l1_chunk_hits", 0.0) + values.get("l2_chunk_hits", 0.0)
    tokens = values.get("cached_host_tokens", 0.0)
    if "l2_chunk_hits" in values:
        tokens += values.get("cached_disk_tokens", 0.0)
    if hits > 0 and tokens > 0:
        per_chunk = tokens / hits
        return max(1.0, round(per_chunk / block)) * block if block > 0 else per_chunk
    return block if block > 0 else 1.0


def _native_tiering(values: Mapping[str, float]
                    ) -> tuple[str, tuple[float, float], tuple[float, float] | None] | None:
    # vLLM creates a tier's hit counter at its first hit: queries without hits are 0 hits
    if "l1_chunk_queries" not in values:
        return None
    per = offload_chunk_tokens(values)
    l1 = (values["l1_chunk_queries"] * per, values.get("l1_chunk_hits", 0.0) * per)
    l2 = None
    if "l2_chunk_queries" in values:
        l2 = (values["l2_chunk_queries"] * per, values.get("l2_chunk_hits", 0.0) * per)
    return "vllm_tiering", l1, l2


def split_l1_l2(
    values: Mapping[str, float], sources: Mapping[str, str], kv_bytes_per_token: float | None
) -> tuple[str, tuple[float, float], tuple[float, float] | None] | None:
    """(source, (cpu lookup, cpu hit), (l2 lookup, l2 hit) or None) by the fixed preference."""
    if "mp_lookup_tokens" in values and "mp_hit_l1_tokens" in values:
        asked, l1 = values["mp_lookup_tokens"], values["mp_hit_l1_tokens"]
        l2 = values.get("mp_hit_l2_tokens", 0.0)
        return "lmcache_mp", (asked, l1), (max(asked - l1, 0.0), l2)
    native = _native_tiering(values)
    if native is not None:
        return native
    conn = _connector(values, sources)
    if conn is None:
        return None
    c_lookup, c_hit, _ = conn
    host = values.get("cached_host_tokens")
    disk = values.get("cached_disk_tokens")
    if (host is not None or disk is not None) and ((host or 0.0) + (disk or 0.0) > 0 or c_hit == 0):
        host, disk = host or 0.0, disk or 0.0
        return "vllm_by_source", (c_lookup, host), (max(c_lookup - host, 0.0), disk)
    if any(k in values for k in NATIVE_OFFLOAD_SIGNALS):
        return "vllm_native_offload", (c_lookup, c_hit), None
    read = values.get("l2_read_bytes")
    if read is not None and kv_bytes_per_token:
        l2_hit = min(read / kv_bytes_per_token, c_hit)
        l1_hit = c_hit - l2_hit
        return "estimated_l2_read_bytes", (c_lookup, l1_hit), (max(c_lookup - l1_hit, 0.0), l2_hit)
    if c_lookup == 0 and c_hit == 0:
        return None  # the connector never saw a token: no KV connector configured
    return "connector_combined", (c_lookup, c_hit), None


def derive_tiers(
    values: Mapping[str, float],
    sources: Mapping[str, str],
    *,
    kv_bytes_per_token: float | None = None,
    cpu_capacity_bytes: float | None = None,
) -> list[TierCounts]:
    """Per-tier counts for one pod and model, in tier order. Tiers without any data are absent."""
    out: dict[str, TierCounts] = {}
    # GPU
    gpu_usage = values.get("gpu_usage_ratio")
    if "gpu_lookup_tokens" in values and "gpu_hit_tokens" in values:
        out["gpu"] = TierCounts(
            "gpu", sources["gpu_lookup_tokens"], values["gpu_lookup_tokens"], values["gpu_hit_tokens"],
            usage=gpu_usage,
        )
    elif values.get("gpu_hit_ratio_gauge", -1.0) >= 0:
        out["gpu"] = TierCounts(
            "gpu", sources["gpu_hit_ratio_gauge"], usage=gpu_usage,
            hit_ratio_gauge=min(1.0, values["gpu_hit_ratio_gauge"]),
        )
    elif gpu_usage is not None:
        out["gpu"] = TierCounts("gpu", sources["gpu_usage_ratio"], usage=gpu_usage)
    # CPU and L2 lookups and hits
    split = split_l1_l2(values, sources, kv_bytes_per_token)
    if split is not None:
        src, (c_lookup, c_hit), l2 = split
        out["cpu"] = TierCounts("cpu", src, c_lookup, c_hit)
        if l2 is not None:
            out["l2"] = TierCounts("l2", src, l2[0], l2[1])
    # evictions (by unit: LMCache chunks, Curvine files and bytes; never added together) and usage
    l2_usage = None
    if "l2_used_bytes" in values and values.get("l2_capacity_bytes", 0) > 0:
        l2_usage = values["l2_used_bytes"] / values["l2_capacity_bytes"]
    cpu_usage = values.get("cpu_usage_ratio")
    if cpu_usage is None and "cpu_used_bytes" in values and cpu_capacity_bytes:
        cpu_usage = values["cpu_used_bytes"] / cpu_capacity_bytes
    for tier, evicted, usage, usage_src in (
        ("cpu", (values.get("cpu_evicted_chunks"), None, None), cpu_usage,
         sources.get("cpu_usage_ratio") or sources.get("cpu_used_bytes") or sources.get("cpu_evicted_chunks")),
        ("l2", (values.get("l2_evicted_chunks"), values.get("l2_evicted_files"), values.get("l2_evicted_bytes")),
         l2_usage, sources.get("l2_used_bytes") or sources.get("l2_evicted_chunks")
         or sources.get("l2_evicted_files") or sources.get("l2_evicted_bytes")),
    ):
        if all(v is None for v in evicted) and usage is None:
            continue
        chunks, files, nbytes = evicted
        cur = out.get(tier) or TierCounts(tier, usage_src or "")  # type: ignore[arg-type]
        out[tier] = TierCounts(cur.tier, cur.source, cur.lookup, cur.hit, evicted_chunks=chunks,
                               evicted_files=files, evicted_bytes=nbytes, usage=_clip(usage))
    if "l2" in out and "l2_read_seconds" in values:  # native tiering: fs-tier reads, one per chunk hit
        out["l2"] = dataclasses.replace(out["l2"], read_seconds=values["l2_read_seconds"],
                                        read_chunks=values.get("l2_chunk_hits", 0.0))
    return [out[t] for t in TIERS if t in out]


def _clip(v: float | None) -> float | None:
    return None if v is None or not math.isfinite(v) else min(1.0, max(0.0, v))


def prompt_lookups(values: Mapping[str, float]) -> float | None:
    """Tokens that entered the cache hierarchy: GPU lookups, else prompt tokens."""
    if "gpu_lookup_tokens" in values:
        return values["gpu_lookup_tokens"]
    return values.get("prompt_tokens")


def cumulative_hit_ratios(tiers: list[TierCounts], prompt_tokens: float | None) -> dict[str, float]:
    """Share of prompt tokens served by each tier or one above it (gpu <= cpu <= l2)."""
    out: dict[str, float] = {}
    served = 0.0
    for t in tiers:
        if t.hit is None:
            continue
        served += t.hit
        r = ratio(served, prompt_tokens)
        if r is not None:
            out[t.tier] = r
    return out


def l2_break_even_tokens(
    prefill_seconds: float | None,
    computed_tokens: float | None,
    l2_read_seconds: float | None,
    l2_read_bytes: float | None,
    l2_fixed_seconds: float | None,
    kv_bytes_per_token: float | None,
) -> float | None:
    """Prompt length above which reading a prefix from L2 beats recomputing it.

    Recompute costs `c_p` s/token (prefill seconds per computed token); an L2 read costs a fixed
    `a` (median latency of one read I/O) plus `c_r` s/token (read seconds per byte times KV bytes
    per token). Break-even n = a / (c_p - c_r); None when L2 never wins or data is missing."""
    if not (prefill_seconds and computed_tokens and l2_read_seconds and l2_read_bytes and kv_bytes_per_token):
        return None
    if l2_fixed_seconds is None or not math.isfinite(l2_fixed_seconds):
        return None
    c_p = prefill_seconds / computed_tokens
    c_r = l2_read_seconds / l2_read_bytes * kv_bytes_per_token
    if c_p <= c_r:
        return None
    return l2_fixed_seconds / (c_p - c_r)


def gpu_capacity_tokens(values: Mapping[str, float]) -> float | None:
    """GPU KV capacity in tokens from `vllm:cache_config_info` (blocks x block size), or None."""
    blocks, size = values.get("gpu_blocks"), values.get("gpu_block_size")
    if not blocks or not size or blocks <= 0 or size <= 0:
        return None
    return blocks * size
