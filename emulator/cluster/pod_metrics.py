"""Live metric state of one emulated vLLM pod (engine + in-process LMCache) and of Curvine.

The state objects turn request outcomes into the counters, gauges and histograms the real
processes keep, and hand out immutable `Snapshot`s for the renderers. A restart is a new state
object: counters start at zero and every `_created` series carries the new start time, exactly
like a restarted vLLM process.
"""
from __future__ import annotations

import dataclasses
import threading
from collections.abc import Callable, Iterable

from emulator.cluster import catalogue as cat
from emulator.cluster.exposition import HistogramValue, MetricSpec, SeriesKey, Snapshot, observe


@dataclasses.dataclass(frozen=True)
class RequestOutcome:
    """One finished request as the pod saw it (times in seconds, sizes in tokens)."""

    prompt_tokens: int
    gpu_hit_tokens: int
    cpu_hit_tokens: int
    l2_hit_tokens: int
    output_tokens: int
    ttft_s: float
    queue_s: float = 0.0
    l2_read_s: float = 0.0  # time spent reading the L2 hit from the shared pool
    cpu_load_s: float = 0.0  # time spent loading the L1 hit over PCIe
    stored_tokens: int = 0  # newly computed tokens stored to CPU and L2 (full chunks)
    chunk_tokens: int = 256
    itl_s: float = 0.02  # inter-token latency during decode

    @property
    def computed_tokens(self) -> int:
        return self.prompt_tokens - self.gpu_hit_tokens - self.cpu_hit_tokens - self.l2_hit_tokens


@dataclasses.dataclass(frozen=True)
class PodIdentity:
    model_name: str = "meta-llama/Llama-3.1-8B-Instruct"
    engines: int = 1  # data-parallel engine cores behind one API server
    max_model_len: int = 131072
    block_size: int = 16
    num_gpu_blocks: int = 2048
    worker_id: str = "0"
    kv_bytes_per_token: int = 131072
    ttft_buckets: tuple[float, ...] | None = None  # vLLM `custom_histogram_buckets` for TTFT


class _Store:
    """Counters/gauges/histograms keyed by (name, label values); not thread-safe on its own."""

    def __init__(self, specs: Iterable[MetricSpec]) -> None:
        self.specs = {s.name: s for s in specs}
        self.values: dict[SeriesKey, float] = {}
        self.hists: dict[SeriesKey, tuple[list[int], list[float]]] = {}

    def inc(self, name: str, labels: tuple[str, ...], amount: float = 1.0) -> None:
        if amount < 0:
            raise ValueError(f"{name}: counters only go up, got {amount}")
        key = (name, labels)
        self.values[key] = self.values.get(key, 0.0) + amount

    def set(self, name: str, labels: tuple[str, ...], value: float) -> None:
        self.values[(name, labels)] = float(value)

    def ensure(self, name: str, labels: tuple[str, ...]) -> None:
        spec = self.specs[name]
        if spec.kind == "histogram":
            self.hists.setdefault((name, labels), ([0] * (len(spec.buckets) + 1), [0.0]))
        else:
            self.values.setdefault((name, labels), 0.0)

    def observe(self, name: str, labels: tuple[str, ...], value: float) -> None:
        spec = self.specs[name]
        counts, total = self.hists.setdefault((name, labels), ([0] * (len(spec.buckets) + 1), [0.0]))
        observe(spec.buckets, counts, value)
        total[0] += value

    def snapshot(self, created: float) -> Snapshot:
        values: dict[SeriesKey, object] = dict(self.values)
        for key, (counts, total) in self.hists.items():
            values[key] = HistogramValue(tuple(counts), total[0])
        return Snapshot(tuple(self.specs.values()), values, created)  # type: ignore[arg-type]


class VllmPodMetrics:
    """Everything one vLLM pod's `/metrics` shows: the engine families and LMCache's."""

    def __init__(self, identity: PodIdentity, started_at: float) -> None:
        self.identity = identity
        self.started_at = started_at
        self._lock = threading.Lock()
        self._store = _Store(cat.vllm_specs(identity.max_model_len, identity.ttft_buckets) + cat.LMCACHE_SPECS)
        self._next_engine = 0
        self._lm = (identity.model_name, identity.worker_id, "worker", identity.model_name)
        self._init_series()

    def _init_series(self) -> None:
        """Series a freshly started vLLM shows before any request (children created eagerly)."""
        s, model = self._store, self.identity.model_name
        for e in range(self.identity.engines):
            base = (model, str(e))
            for spec in s.specs.values():
                if spec.name.startswith("lmcache:") or spec.name == "vllm:cache_config_info":
                    continue
                extra = spec.labels[2:]
                if not extra:
                    s.ensure(spec.name, base)
            for reason in cat.FINISHED_REASONS:
                s.ensure("vllm:request_success", base + (reason,))
            for src in cat.PROMPT_SOURCES:
                s.ensure("vllm:prompt_tokens_by_source", base + (src,))
            for src in cat.CACHED_SOURCES:
                s.ensure("vllm:prompt_tokens_cached_by_source", base + (src,))
            for reason in cat.WAITING_REASONS:
                s.ensure("vllm:num_requests_waiting_by_reason", base + (reason,))
            for state in cat.SLEEP_STATES:
                s.set("vllm:engine_sleep_state", base + (state,), 1.0 if state == "awake" else 0.0)
            info = {"block_size": str(self.identity.block_size), "cache_dtype": "auto",
                    "enable_prefix_caching": "True", "engine": str(e), "gpu_memory_utilization": "0.9",
                    "num_gpu_blocks": str(self.identity.num_gpu_blocks), "prefix_caching_hash_algo": "sha256"}
            s.set("vllm:cache_config_info", tuple(info[k] for k in cat.CACHE_CONFIG_LABELS), 1.0)
        # LMCache logs every counter and gauge each stats interval (inc(0) included), so all of
        # them exist from the first log on; its histograms appear with their first observation.
        for spec in cat.LMCACHE_SPECS:
            if spec.kind != "histogram":
                s.ensure(spec.name, self._lm)
        s.set("lmcache:lmcache_is_healthy", self._lm, 1.0)

    # -- updates ---------------------------------------------------------------------------------
    def record(self, o: RequestOutcome) -> None:
        """Account one finished request. Data-parallel pods spread requests over engines."""
        with self._lock:
            engine = str(self._next_engine % self.identity.engines)
            self._next_engine += 1
            self._record(o, (self.identity.model_name, engine))

    def _record(self, o: RequestOutcome, base: tuple[str, str]) -> None:
        s, lm = self._store, self._lm
        external = o.cpu_hit_tokens + o.l2_hit_tokens
        computed = o.computed_tokens
        if computed < 0:
            raise ValueError(f"hit tokens exceed the prompt ({o.prompt_tokens} tokens)")
        bpt = self.identity.kv_bytes_per_token
        s.inc("vllm:prefix_cache_queries", base, o.prompt_tokens)
        s.inc("vllm:prefix_cache_hits", base, o.gpu_hit_tokens)
        s.inc("vllm:external_prefix_cache_queries", base, o.prompt_tokens - o.gpu_hit_tokens)
        s.inc("vllm:external_prefix_cache_hits", base, external)
        s.inc("vllm:prompt_tokens", base, o.prompt_tokens)
        s.inc("vllm:prompt_tokens_by_source", base + ("local_compute",), computed)
        s.inc("vllm:prompt_tokens_by_source", base + ("local_cache_hit",), o.gpu_hit_tokens)
        s.inc("vllm:prompt_tokens_by_source", base + ("external_kv_transfer",), external)
        s.inc("vllm:prompt_tokens_cached", base, o.gpu_hit_tokens + external)
        s.inc("vllm:prompt_tokens_cached_by_source", base + ("device",), o.gpu_hit_tokens)
        # LMCache's connectors keep vLLM's default tier for connector hits, `external_unspecified`
        # (kv_connector/v1/base.py): `host` and `disk` stay 0 with LMCache, as on a real pod
        s.inc("vllm:prompt_tokens_cached_by_source", base + ("external_unspecified",), external)
        s.inc("vllm:generation_tokens", base, o.output_tokens)
        s.inc("vllm:request_success", base + ("length",), 1)
        prefill_s = max(o.ttft_s - o.queue_s, 0.0)
        decode_s = o.itl_s * max(o.output_tokens - 1, 0)
        s.observe("vllm:time_to_first_token_seconds", base, o.ttft_s)
        s.observe("vllm:request_queue_time_seconds", base, o.queue_s)
        s.observe("vllm:request_prefill_time_seconds", base, prefill_s)
        s.observe("vllm:request_decode_time_seconds", base, decode_s)
        s.observe("vllm:request_inference_time_seconds", base, prefill_s + decode_s)
        s.observe("vllm:e2e_request_latency_seconds", base, o.ttft_s + decode_s)
        if o.output_tokens > 1:
            s.observe("vllm:request_time_per_output_token_seconds", base, o.itl_s)
            s.observe("vllm:inter_token_latency_seconds", base, o.itl_s)
        s.observe("vllm:request_prompt_tokens", base, o.prompt_tokens)
        s.observe("vllm:request_generation_tokens", base, o.output_tokens)
        s.observe("vllm:request_max_num_generation_tokens", base, o.output_tokens)
        s.observe("vllm:request_params_max_tokens", base, o.output_tokens)
        s.observe("vllm:request_params_n", base, 1)
        s.observe("vllm:request_prefill_kv_computed_tokens", base, computed)
        s.observe("vllm:iteration_tokens_total", base, min(o.prompt_tokens, 16384) + 1)
        # LMCache (in-process connector): lookup over the whole prompt, retrieve of what vLLM missed.
        requested = o.prompt_tokens - o.gpu_hit_tokens
        s.inc("lmcache:num_lookup_requests", lm)
        s.inc("lmcache:num_lookup_tokens", lm, o.prompt_tokens)
        s.inc("lmcache:num_lookup_hits", lm, o.gpu_hit_tokens + external)
        s.inc("lmcache:num_prompt_tokens", lm, o.prompt_tokens)
        s.inc("lmcache:num_vllm_hit_tokens", lm, o.gpu_hit_tokens)
        if external == 0:
            s.inc("lmcache:lookup_0_hit_requests", lm)
        if requested > 0:
            s.inc("lmcache:num_retrieve_requests", lm)
            s.inc("lmcache:num_requested_tokens", lm, requested)
            s.inc("lmcache:num_hit_tokens", lm, external)
            s.observe("lmcache:time_to_retrieve", lm, o.cpu_load_s + o.l2_read_s)
            s.observe("lmcache:request_cache_hit_rate", lm, external / requested)
            s.set("lmcache:retrieve_hit_rate", lm, external / requested)
        if o.prompt_tokens:
            s.set("lmcache:lookup_hit_rate", lm, (o.gpu_hit_tokens + external) / o.prompt_tokens)
        if o.l2_hit_tokens:
            chunks = -(-o.l2_hit_tokens // o.chunk_tokens)
            s.inc("lmcache:num_remote_read_requests", lm, chunks)
            s.inc("lmcache:num_remote_read_bytes", lm, o.l2_hit_tokens * bpt)
            s.observe("lmcache:remote_time_to_get", lm, o.l2_read_s * 1000.0)
        if o.stored_tokens:
            chunks = -(-o.stored_tokens // o.chunk_tokens)
            s.inc("lmcache:num_store_requests", lm)
            s.inc("lmcache:num_stored_tokens", lm, o.stored_tokens)
            s.inc("lmcache:num_remote_write_requests", lm, chunks)
            s.inc("lmcache:num_remote_write_bytes", lm, o.stored_tokens * bpt)
            s.observe("lmcache:time_to_store", lm, o.stored_tokens * bpt / 25e9)
            s.observe("lmcache:remote_time_to_put", lm, 1000.0 * o.stored_tokens * bpt / 2e9)

    def record_cpu_evictions(self, chunks: int) -> None:
        if chunks <= 0:
            return
        with self._lock:
            self._store.inc("lmcache:local_cpu_evict_count", self._lm)
            self._store.inc("lmcache:local_cpu_evict_keys_count", self._lm, chunks)

    def set_load(self, *, running: int, waiting: int, gpu_usage: float, cpu_bytes: float,
                 l2_bytes: float) -> None:
        """Scheduler and cache gauges (engine 0 carries the whole pod in the emulation)."""
        with self._lock:
            s = self._store
            for e in range(self.identity.engines):
                base = (self.identity.model_name, str(e))
                share = 1.0 / self.identity.engines
                s.set("vllm:num_requests_running", base, round(running * share))
                s.set("vllm:num_requests_waiting", base, round(waiting * share))
                s.set("vllm:num_requests_waiting_by_reason", base + ("capacity",), round(waiting * share))
                s.set("vllm:kv_cache_usage_perc", base, min(max(gpu_usage, 0.0), 1.0))
            s.set("lmcache:local_cache_usage", self._lm, cpu_bytes)
            s.set("lmcache:remote_cache_usage", self._lm, l2_bytes)
            s.set("lmcache:active_memory_objs_count", self._lm, round(cpu_bytes / max(self.identity.kv_bytes_per_token, 1) / 256))

    def snapshot(self) -> Snapshot:
        with self._lock:
            return self._store.snapshot(self.started_at)


@dataclasses.dataclass(frozen=True)
class L2Status:
    capacity_bytes: float
    used_bytes: float
    tracked_files: int = 0


class CurvineFuseMetrics:
    """One pod's Curvine FUSE mount: backend I/O latency (us), bytes and requests."""

    def __init__(self, started_at: float) -> None:
        self.started_at = started_at
        self._lock = threading.Lock()
        self._store = _Store(cat.CURVINE_FUSE_SPECS)
        for io in ("read", "write"):
            self._store.ensure("curvine_fuse_io_duration_us", (io, "curvine", "success"))
            self._store.ensure("curvine_fuse_io_bytes_total", (io, "curvine", "success"))
            self._store.ensure("curvine_fuse_io_requests_total", (io, "curvine", "success"))
            self._store.set("curvine_fuse_stream_io_inflight", (io,), 0)

    def record_io(self, io_type: str, nbytes: int, latencies_us: Iterable[float]) -> None:
        key = (io_type, "curvine", "success")
        with self._lock:
            n = 0
            for lat in latencies_us:
                self._store.observe("curvine_fuse_io_duration_us", key, lat)
                n += 1
            self._store.inc("curvine_fuse_io_requests_total", key, n)
            self._store.inc("curvine_fuse_io_bytes_total", key, nbytes)

    def set_files(self, files: int) -> None:
        with self._lock:
            self._store.set("inode_num", (), files)
            self._store.set("file_handle_num", (), 0)

    def snapshot(self) -> Snapshot:
        with self._lock:
            return self._store.snapshot(self.started_at)


class CurvineMasterMetrics:
    """The Curvine master: cluster capacity and quota-eviction counters."""

    def __init__(self, started_at: float, workers: int = 1) -> None:
        self.started_at = started_at
        self._lock = threading.Lock()
        self._store = _Store(cat.CURVINE_MASTER_SPECS)
        for name in ("eviction_trigger_count", "eviction_files_deleted", "eviction_bytes_freed"):
            self._store.ensure(name, ())
        self._store.set("worker_num", ("live",), workers)
        self._store.set("worker_num", ("lost",), 0)

    def set_usage(self, status: L2Status) -> None:
        with self._lock:
            s = self._store
            s.set("capacity", (), status.capacity_bytes)
            s.set("fs_used", (), status.used_bytes)
            s.set("available", (), max(status.capacity_bytes - status.used_bytes, 0.0))
            s.set("eviction_lru_cache_size", (), status.tracked_files)
            s.set("inode_file_num", (), status.tracked_files)

    def record_eviction(self, files: int, bytes_freed: float) -> None:
        if files <= 0:
            return
        with self._lock:
            self._store.inc("eviction_trigger_count", ())
            self._store.inc("eviction_files_deleted", (), files)
            self._store.inc("eviction_bytes_freed", (), bytes_freed)

    def snapshot(self) -> Snapshot:
        with self._lock:
            return self._store.snapshot(self.started_at)


Renderer = Callable[[], bytes]
