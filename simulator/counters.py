"""The twin's accumulators and their names in the real systems' metrics.

`PodTotals` and `L2Totals` are plain counters the engine increments; `pod_metrics` and
`l2_metrics` render them under the names vLLM 0.33, LMCache 0.5.6 (in-process `lmcache:*` and
multiprocess `lmcache_mp_*`) and Curvine use on the wire (see docs/twin.md for the mapping).
Labelled series are keyed as `name{label="value"}`. `MissTotals` is the ground truth of miss
attribution (it is not a real metric and survives pod restarts).
"""
from __future__ import annotations

import dataclasses


class PodTotals:
    """Cumulative per-pod counters (reset when the pod restarts)."""

    __slots__ = (
        "computed_tokens",
        "cpu_evict_events",
        "cpu_evicted_chunks",
        "cpu_hit_chunks",
        "cpu_hit_tokens",
        "cpu_stored_chunks",
        "ext_query_tokens",
        "generation_tokens",
        "gpu_evicted_chunks",
        "gpu_hit_tokens",
        "l2_hit_chunks",
        "l2_hit_tokens",
        "l2_read_bytes",
        "l2_read_chunks",
        "l2_read_requests",
        "l2_write_bytes",
        "l2_write_chunks",
        "l2_write_requests",
        "prompt_tokens",
        "requests",
        "retrieve_requests",
        "store_requests",
        "zero_hit_lookups",
    )

    def __init__(self) -> None:
        for name in self.__slots__:
            setattr(self, name, 0)

    def as_dict(self) -> dict[str, int]:
        return {name: getattr(self, name) for name in self.__slots__}


class L2Totals:
    __slots__ = (
        "evicted_chunks",
        "eviction_runs",
        "read_bytes",
        "read_chunks",
        "read_time_s",
        "write_bytes",
        "write_chunks",
        "write_time_s",
    )

    def __init__(self) -> None:
        for name in self.__slots__:
            setattr(self, name, 0)


@dataclasses.dataclass
class MissTotals:
    """Ground truth, in tokens (definitions in docs/twin.md, "Truth signals").

    prompt = hit + cold + capacity + routing + tail, where hit = GPU + CPU + L2 hit tokens and
    tail = tokens of the partial last chunk (never reusable). overlap = seen-chunk tokens / prompt.
    """

    requests: int = 0
    prompt_tokens: int = 0
    hit_tokens: int = 0
    cold_tokens: int = 0
    capacity_tokens: int = 0
    routing_tokens: int = 0
    tail_tokens: int = 0
    seen_tokens: int = 0  # tokens of full chunks seen in any earlier request (hit or not)

    @property
    def miss_tokens(self) -> int:
        return self.cold_tokens + self.capacity_tokens + self.routing_tokens + self.tail_tokens

    @property
    def overlap(self) -> float:
        """1 - tokens in never-seen chunks (the partial tail counts as never seen) / prompt tokens."""
        return self.seen_tokens / self.prompt_tokens if self.prompt_tokens else 0.0

    def add(self, other: MissTotals) -> None:
        for f in dataclasses.fields(self):
            setattr(self, f.name, getattr(self, f.name) + getattr(other, f.name))

    def as_dict(self) -> dict[str, float]:
        d: dict[str, float] = dataclasses.asdict(self)
        d["overlap"] = self.overlap
        return d


def pod_metrics(
    t: PodTotals, *, connector: bool, chunk_tokens: int, kv_bytes_per_token: int, gpu_used: int, gpu_cap: int,
    cpu_used: int, cpu_cap: int, running: int, waiting: int,
) -> dict[str, float]:
    """Render one pod's counters and gauges under the real metric names."""
    ext_hit = t.cpu_hit_tokens + t.l2_hit_tokens
    hit = t.gpu_hit_tokens + ext_hit
    m: dict[str, float] = {
        # vLLM 0.33 (engine /metrics)
        "vllm:prefix_cache_queries_total": t.prompt_tokens,
        "vllm:prefix_cache_hits_total": t.gpu_hit_tokens,
        "vllm:prompt_tokens_total": t.prompt_tokens,
        "vllm:generation_tokens_total": t.generation_tokens,
        "vllm:prompt_tokens_cached_total": hit,
        'vllm:prompt_tokens_by_source_total{source="local_compute"}': t.computed_tokens,
        'vllm:prompt_tokens_by_source_total{source="local_cache_hit"}': t.gpu_hit_tokens,
        'vllm:prompt_tokens_by_source_total{source="external_kv_transfer"}': ext_hit,
        'vllm:request_success_total{finished_reason="length"}': t.requests,
        "vllm:num_requests_running": running,
        "vllm:num_requests_waiting": waiting,
        "vllm:kv_cache_usage_perc": gpu_used / gpu_cap if gpu_cap else 0.0,
    }
    if connector:
        cpu_bytes = cpu_used * chunk_tokens * kv_bytes_per_token
        m.update({
            "vllm:external_prefix_cache_queries_total": t.ext_query_tokens,
            "vllm:external_prefix_cache_hits_total": ext_hit,
            # LMCache in-process (counters get _total on the wire)
            "lmcache:num_lookup_requests": t.requests,
            "lmcache:num_retrieve_requests": t.retrieve_requests,
            "lmcache:num_store_requests": t.store_requests,
            "lmcache:num_requested_tokens": t.ext_query_tokens,
            "lmcache:num_hit_tokens": ext_hit,
            "lmcache:num_vllm_hit_tokens": t.gpu_hit_tokens,
            "lmcache:num_prompt_tokens": t.prompt_tokens,
            "lmcache:num_stored_tokens": t.cpu_stored_chunks * chunk_tokens,
            "lmcache:lookup_0_hit_requests": t.zero_hit_lookups,
            "lmcache:local_cpu_evict_count": t.cpu_evict_events,
            "lmcache:local_cpu_evict_keys_count": t.cpu_evicted_chunks,
            "lmcache:num_remote_read_requests": t.l2_read_requests,
            "lmcache:num_remote_read_bytes": t.l2_read_bytes,
            "lmcache:num_remote_write_requests": t.l2_write_requests,
            "lmcache:num_remote_write_bytes": t.l2_write_bytes,
            "lmcache:local_cache_usage": cpu_bytes,
            # LMCache multiprocess mode (Prometheus names): the per-tier split
            "lmcache_mp_lookup_requested_tokens_total": t.ext_query_tokens,
            "lmcache_mp_lookup_hit_tokens_total": ext_hit,
            "lmcache_mp_lookup_hit_l1_tokens_total": t.cpu_hit_tokens,
            "lmcache_mp_lookup_hit_l2_tokens_total": t.l2_hit_tokens,
            "lmcache_mp_lookup_hit_l1_keys_total": t.cpu_hit_chunks,
            "lmcache_mp_lookup_hit_l2_keys_total": t.l2_hit_chunks,
            "lmcache_mp_lookups_requests_total": t.requests,
            "lmcache_mp_l1_write_chunks_total": t.cpu_stored_chunks,
            "lmcache_mp_l1_read_chunks_total": t.cpu_hit_chunks,
            "lmcache_mp_l1_evicted_chunks_total": t.cpu_evicted_chunks,
            "lmcache_mp_l1_usage_ratio": cpu_used / cpu_cap if cpu_cap else 0.0,
        })
    # Not a real metric: vLLM has no GPU eviction counter. Kept for the twin's own summaries.
    m["twin:gpu_evicted_chunks_total"] = t.gpu_evicted_chunks
    return m


def l2_metrics(t: L2Totals, *, used_chunks: int, cap_chunks: int, chunk_bytes: int) -> dict[str, float]:
    """The shared pool under Curvine master/worker names (bytes, microseconds, operations)."""
    cap = cap_chunks * chunk_bytes
    used = used_chunks * chunk_bytes
    return {
        "capacity": cap,
        "fs_used": used,
        "available": cap - used,
        "eviction_trigger_count": t.eviction_runs,
        "eviction_files_deleted": t.evicted_chunks,
        "eviction_bytes_freed": t.evicted_chunks * chunk_bytes,
        "read_bytes": t.read_bytes,
        "read_count": t.read_chunks,
        "read_time_us": t.read_time_s * 1e6,
        "write_bytes": t.write_bytes,
        "write_count": t.write_chunks,
        "write_time_us": t.write_time_s * 1e6,
        "lmcache_mp_l2_evicted_chunks_total": t.evicted_chunks,
    }
