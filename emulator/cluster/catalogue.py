"""What each emulated endpoint declares: names, types, help texts, labels and default buckets.

Taken from `reference/metrics-and-knobs.md`: vLLM 0.33 `PrometheusStatLogger` (section 1),
LMCache 0.5.6 in-process `PrometheusLogger` (section 2.1) and Curvine's FUSE client and master
(sections 3.1 and 3.3). Names are the declared ones: prometheus_client appends `_total` to
counters on the wire, the Rust crate appends nothing.
"""
from __future__ import annotations

from emulator.cluster.exposition import MetricSpec

VLLM_BASE_LABELS = ("model_name", "engine")
LMCACHE_LABELS = ("model_name", "worker_id", "role", "served_model_name")

TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5,
                10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0)
ITL_BUCKETS = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
               20.0, 40.0, 80.0)
REQUEST_LATENCY_BUCKETS = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0,
                           60.0, 120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0)
ITERATION_TOKEN_BUCKETS = (1, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384)
PARAMS_N_BUCKETS = (1, 2, 5, 10, 20)
LMCACHE_SECONDS_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5,
                           5.0, 7.5, 10.0)
LMCACHE_MS_BUCKETS = (1, 5, 10, 20, 40, 60, 80, 100, 250, 500, 750, 1000, 2500, 5000, 7500, 10000)
LMCACHE_HIT_RATE_BUCKETS = (0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0)
CURVINE_IO_US_BUCKETS = (10, 50, 100, 250, 500, 1e3, 2.5e3, 5e3, 1e4, 2.5e4, 5e4, 1e5, 2.5e5, 5e5, 1e6,
                         2.5e6, 5e6, 1e7)
CURVINE_IO_S_BUCKETS = tuple(b / 1e6 for b in CURVINE_IO_US_BUCKETS)  # the same bounds in seconds

PROMPT_SOURCES = ("local_compute", "local_cache_hit", "external_kv_transfer")
CACHED_SOURCES = ("device", "host", "p2p", "disk", "external_unspecified")
FINISHED_REASONS = ("stop", "length", "abort", "error", "repetition")
WAITING_REASONS = ("capacity", "deferred")
SLEEP_STATES = ("awake", "weights_offloaded", "discard_all")
CACHE_CONFIG_LABELS = ("block_size", "cache_dtype", "enable_prefix_caching", "engine",
                       "gpu_memory_utilization", "num_gpu_blocks", "prefix_caching_hash_algo")


def build_1_2_5_buckets(max_value: int) -> tuple[int, ...]:
    """vLLM's 1-2-5 series capped at `max_value` (e.g. 1, 2, 5, 10, 20, 50, ...)."""
    out: list[int] = []
    exponent = 0
    while True:
        for mantissa in (1, 2, 5):
            value = mantissa * 10 ** exponent
            if value > max_value:
                return tuple(out)
            out.append(value)
        exponent += 1


def _c(name: str, help: str, extra: tuple[str, ...] = ()) -> MetricSpec:
    return MetricSpec(name, "counter", help, VLLM_BASE_LABELS + extra)


def _g(name: str, help: str, extra: tuple[str, ...] = ()) -> MetricSpec:
    return MetricSpec(name, "gauge", help, VLLM_BASE_LABELS + extra)


def _h(name: str, help: str, buckets: tuple[float, ...]) -> MetricSpec:
    return MetricSpec(name, "histogram", help, VLLM_BASE_LABELS, tuple(float(b) for b in buckets))


def vllm_specs(max_model_len: int, ttft_buckets: tuple[float, ...] | None = None) -> tuple[MetricSpec, ...]:
    """vLLM 0.33 engine families (V1 `PrometheusStatLogger`), in registration order.

    `ttft_buckets` replaces the TTFT default buckets, as vLLM's observability config
    `custom_histogram_buckets` (family `time_to_first_token`) does."""
    tokens = build_1_2_5_buckets(max_model_len)
    return (
        _g("vllm:num_requests_running", "Number of requests in model execution batches."),
        _g("vllm:num_requests_waiting", "Number of requests waiting to be processed."),
        _g("vllm:num_requests_waiting_by_reason",
           "Number of requests waiting to be processed, by reason.", ("reason",)),
        _g("vllm:engine_sleep_state", "Engine sleep state; awake = 0 means engine is sleeping.",
           ("sleep_state",)),
        _g("vllm:kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage."),
        _c("vllm:prefix_cache_queries", "Prefix cache queries, in terms of number of queried tokens."),
        _c("vllm:prefix_cache_hits", "Prefix cache hits, in terms of number of cached tokens."),
        _c("vllm:external_prefix_cache_queries",
           "External prefix cache queries from KV connector cross-instance cache sharing, "
           "in terms of number of queried tokens."),
        _c("vllm:external_prefix_cache_hits",
           "External prefix cache hits from KV connector cross-instance cache sharing, "
           "in terms of number of cached tokens."),
        _c("vllm:num_preemptions", "Cumulative number of preemption from the engine."),
        _c("vllm:prompt_tokens", "Number of prefill tokens processed."),
        _c("vllm:prompt_tokens_by_source", "Number of prompt tokens by source.", ("source",)),
        _c("vllm:prompt_tokens_cached", "Number of cached prompt tokens (local + external)."),
        _c("vllm:prompt_tokens_cached_by_source",
           "Number of cached prompt tokens by the tier that supplied them; sums to prefix cache "
           "hits plus external prefix cache hits.", ("source",)),
        _c("vllm:generation_tokens", "Number of generation tokens processed."),
        _c("vllm:request_success", "Count of successfully processed requests.", ("finished_reason",)),
        _h("vllm:request_prompt_tokens", "Number of prefill tokens processed.", tokens),
        _h("vllm:request_generation_tokens", "Number of generation tokens processed.", tokens),
        _h("vllm:iteration_tokens_total", "Histogram of number of tokens per engine_step.",
           ITERATION_TOKEN_BUCKETS),
        _h("vllm:request_max_num_generation_tokens",
           "Histogram of maximum number of requested generation tokens.", tokens),
        _h("vllm:request_params_n", "Histogram of the n request parameter.", PARAMS_N_BUCKETS),
        _h("vllm:request_params_max_tokens", "Histogram of the max_tokens request parameter.", tokens),
        _h("vllm:time_to_first_token_seconds", "Histogram of time to first token in seconds.",
           ttft_buckets or TTFT_BUCKETS),
        _h("vllm:inter_token_latency_seconds", "Histogram of inter-token latency in seconds.",
           ITL_BUCKETS),
        _h("vllm:request_time_per_output_token_seconds",
           "Histogram of time_per_output_token_seconds per request.", ITL_BUCKETS),
        _h("vllm:e2e_request_latency_seconds", "Histogram of e2e request latency in seconds.",
           REQUEST_LATENCY_BUCKETS),
        _h("vllm:request_queue_time_seconds", "Histogram of time spent in WAITING phase for request.",
           REQUEST_LATENCY_BUCKETS),
        _h("vllm:request_inference_time_seconds",
           "Histogram of time spent in RUNNING phase for request.", REQUEST_LATENCY_BUCKETS),
        _h("vllm:request_prefill_time_seconds",
           "Histogram of time spent in PREFILL phase for request.", REQUEST_LATENCY_BUCKETS),
        _h("vllm:request_decode_time_seconds",
           "Histogram of time spent in DECODE phase for request.", REQUEST_LATENCY_BUCKETS),
        _h("vllm:request_prefill_kv_computed_tokens",
           "Histogram of new KV tokens computed during prefill (excluding cached tokens).", tokens),
        MetricSpec("vllm:cache_config_info", "gauge", "Information of the LLMEngine CacheConfig",
                   CACHE_CONFIG_LABELS),
    )


def _lc(name: str, help: str) -> MetricSpec:
    return MetricSpec(name, "counter", help, LMCACHE_LABELS)


def _lg(name: str, help: str) -> MetricSpec:
    return MetricSpec(name, "gauge", help, LMCACHE_LABELS)


def _lh(name: str, help: str, buckets: tuple[float, ...]) -> MetricSpec:
    return MetricSpec(name, "histogram", help, LMCACHE_LABELS, tuple(float(b) for b in buckets))


LMCACHE_SPECS: tuple[MetricSpec, ...] = (
    _lc("lmcache:num_retrieve_requests", "Total number of retrieve requests sent to lmcache"),
    _lc("lmcache:num_store_requests", "Total number of store requests sent to lmcache"),
    _lc("lmcache:num_lookup_requests", "Total number of lookup requests sent to lmcache"),
    _lc("lmcache:num_requested_tokens", "Total number of tokens requested from lmcache"),
    _lc("lmcache:num_hit_tokens", "Total number of tokens hit in lmcache"),
    _lc("lmcache:num_stored_tokens", "Total number of tokens stored in lmcache including evicted ones"),
    _lc("lmcache:num_lookup_tokens", "Total number of tokens requested in lookup from lmcache"),
    _lc("lmcache:num_lookup_hits", "Total number of tokens hit in lookup from lmcache"),
    _lc("lmcache:num_vllm_hit_tokens", "Number of hit tokens in vllm"),
    _lc("lmcache:num_prompt_tokens", "Number of prompt tokens in lmcache"),
    _lc("lmcache:num_remote_read_requests", "Total number of requests read from remote backends in lmcache"),
    _lc("lmcache:num_remote_read_bytes", "Total number of bytes read from remote backends in lmcache"),
    _lc("lmcache:num_remote_write_requests", "Total number of requests write to remote backends in lmcache"),
    _lc("lmcache:num_remote_write_bytes", "Total number of bytes write to remote backends in lmcache"),
    _lc("lmcache:local_cpu_evict_count", "Total number of evict in local cpu backend"),
    _lc("lmcache:local_cpu_evict_keys_count", "Total number of evict keys in local cpu backend"),
    _lc("lmcache:local_cpu_evict_failed_count", "Total number of failed eviction in local cpu backend"),
    _lc("lmcache:lookup_0_hit_requests", "Total number of lookup requests with 0 hit"),
    _lg("lmcache:retrieve_hit_rate", "Hit rate of lmcache retrieve requests since last log"),
    _lg("lmcache:lookup_hit_rate", "Hit rate of lmcache lookup requests since last log"),
    _lg("lmcache:local_cache_usage", "Local cache usage (bytes) of lmcache"),
    _lg("lmcache:remote_cache_usage", "Remote cache usage (bytes) of lmcache"),
    _lg("lmcache:local_storage_usage", "Local storage usage (bytes) of lmcache"),
    _lg("lmcache:active_memory_objs_count", "The number of active memory objects"),
    _lg("lmcache:pinned_memory_objs_count", "The number of pinned memory objects"),
    _lg("lmcache:lmcache_is_healthy", "Whether lmcache is healthy (1) or not (0)"),
    _lh("lmcache:time_to_retrieve", "Time to retrieve from lmcache (seconds)", LMCACHE_SECONDS_BUCKETS),
    _lh("lmcache:time_to_store", "Time to store to lmcache (seconds)", LMCACHE_SECONDS_BUCKETS),
    _lh("lmcache:remote_time_to_get", "Time to get from remote backends (ms)", LMCACHE_MS_BUCKETS),
    _lh("lmcache:remote_time_to_put", "Time to put to remote backends (ms)", LMCACHE_MS_BUCKETS),
    _lh("lmcache:request_cache_hit_rate", "lmcache request cache hit rate", LMCACHE_HIT_RATE_BUCKETS),
)

FUSE_IO_LABELS = ("io_type", "path_type", "status")
CURVINE_FUSE_SPECS: tuple[MetricSpec, ...] = (
    MetricSpec("curvine_fuse_io_duration_us", "histogram",
               "FUSE backend read/write latency in microseconds", FUSE_IO_LABELS,
               tuple(float(b) for b in CURVINE_IO_US_BUCKETS)),
    MetricSpec("curvine_fuse_io_bytes_total", "counter",
               "FUSE backend bytes transferred (successful I/O only)", FUSE_IO_LABELS),
    MetricSpec("curvine_fuse_io_requests_total", "counter",
               "FUSE backend read/write attempts, including errors", FUSE_IO_LABELS),
    MetricSpec("curvine_fuse_stream_io_inflight", "gauge", "In-flight stream I/O operations", ("io_type",)),
    MetricSpec("inode_num", "gauge", "Number of inodes cached by the FUSE client", ()),
    MetricSpec("file_handle_num", "gauge", "Number of open file handles", ()),
)

CURVINE_MASTER_SPECS: tuple[MetricSpec, ...] = (
    MetricSpec("capacity", "gauge", "Total capacity of the cluster in bytes", ()),
    MetricSpec("available", "gauge", "Available capacity of the cluster in bytes", ()),
    MetricSpec("fs_used", "gauge", "Used capacity of the cluster in bytes", ()),
    MetricSpec("eviction_lru_cache_size", "gauge", "Number of files tracked for quota eviction", ()),
    MetricSpec("eviction_trigger_count", "counter", "Number of times quota eviction ran", ()),
    MetricSpec("eviction_files_deleted", "counter", "Number of files removed by quota eviction", ()),
    MetricSpec("eviction_bytes_freed", "counter", "Bytes freed by quota eviction", ()),
    MetricSpec("inode_file_num", "gauge", "Number of file inodes", ()),
    MetricSpec("worker_num", "gauge", "Number of workers by status", ("tag",)),
)
