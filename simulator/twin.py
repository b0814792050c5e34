"""The digital twin: a per-request model of GPU / CPU (per pod) and shared L2 KV-cache tiers.

`Twin` processes requests one at a time in arrival order. For each request it routes, looks up
the prompt's chunks GPU -> CPU -> L2 with prefix semantics, promotes lower-tier hits into the
upper tiers, stores newly computed chunks to CPU and L2, queues the prefill on the pod and
computes the TTFT. All cache effects of a request happen at its arrival instant (the twin does
not model the window between arrival and the end of prefill). See docs/twin.md.
"""
from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from heapq import heapify
from itertools import takewhile
from typing import Any

from contracts.events import AllBlocksCleared, BlockRemoved, EventSink
from contracts.knobs import Knobs
from simulator.chunking import BLOCK_TOKENS, chunk_hashes
from simulator.cluster import Capacities, ClusterSpec
from simulator.counters import L2Totals, MissTotals, PodTotals, l2_metrics, pod_metrics
from simulator.policies import LRU, Policy, make_policy
from simulator.profile import HardwareProfile, get_profile
from simulator.records import Request, WorkloadError
from simulator.router import PlacedRouter, Router, make_router
from simulator.tier_lookup import cpu_l2_runs
from simulator.twin_step import step


@dataclasses.dataclass(frozen=True, slots=True)
class RequestOutcome:
    """What happened to one request (tokens; seconds)."""

    pod: str
    pod_index: int
    time_s: float
    prompt_tokens: int
    gpu_hit_tokens: int
    cpu_hit_tokens: int
    l2_hit_tokens: int
    computed_tokens: int
    queue_delay_s: float
    ttft_s: float
    l2_read_s: float  # L2 read on the critical path (0 when nothing was read)
    l2_write_s: float  # asynchronous L2 write of the computed chunks (0 when nothing was written)
    cold_tokens: int
    capacity_tokens: int
    routing_tokens: int
    tail_tokens: int

    @property
    def hit_tokens(self) -> int:
        return self.gpu_hit_tokens + self.cpu_hit_tokens + self.l2_hit_tokens


@dataclasses.dataclass
class PodObservations:
    """Latency samples of one pod since it started (or since the last drain), in seconds."""

    ttft_s: list[float] = dataclasses.field(default_factory=list)
    queue_delay_s: list[float] = dataclasses.field(default_factory=list)
    l2_read_s: list[float] = dataclasses.field(default_factory=list)  # requests that read L2
    l2_write_s: list[float] = dataclasses.field(default_factory=list)  # requests that wrote L2


class _Pod:
    __slots__ = ("cpu", "free_at", "gpu", "name", "obs", "totals", "truth")

    def __init__(self, name: str) -> None:
        self.name = name
        self.gpu: Policy | None = None
        self.cpu: Policy | None = None
        self.free_at = 0.0  # when the pod's prefill queue drains
        self.totals = PodTotals()
        self.truth = MissTotals()
        self.obs = PodObservations()


_EMPTY: list[int] = []


def _chunks_of(capacity_tokens: int, chunk_tokens: int) -> int:
    return capacity_tokens // chunk_tokens


class Twin:
    """The tiered-cache engine. Pods are addressed by index or by name."""

    def __init__(
        self,
        cluster: ClusterSpec,
        knobs: Knobs,
        profile: HardwareProfile | str | None = None,
        *,
        event_sink: EventSink | None = None,
    ) -> None:
        self.cluster = cluster
        self.profile: HardwareProfile = cluster.hardware if profile is None else get_profile(profile)
        self._sink = event_sink
        self._chunk_blocks: dict[int, tuple[int, ...]] = {}  # announced 512-token blocks of a chunk above 512
        self._pods = [_Pod(name) for name in cluster.names]
        self._index = {name: i for i, name in enumerate(cluster.names)}
        self._l2: Policy | None = None
        self._native = cluster.native_tiering
        self._l2_totals = L2Totals()
        self._seen: set[int] = set()
        self._heap: list[tuple[float, float, int]] = []  # in flight: (end of decode, start of prefill, pod)
        self._loads = [0] * len(self._pods)  # requests in flight per pod
        self._now = 0.0
        self.knobs = knobs
        self._configure(knobs, first=True)

    # -- configuration -------------------------------------------------------------------------
    def _configure(self, knobs: Knobs, *, first: bool) -> None:
        caps: Capacities = self.cluster.capacities(knobs, self.profile)
        old = None if first else self.knobs
        self.knobs = knobs
        self.capacities = caps
        self._chunk = c = knobs.chunk_tokens
        self._bpt = caps.kv_bytes_per_token
        self._chunk_bytes = c * caps.kv_bytes_per_token
        self._lat = lat = self.profile.latency
        cb = self._chunk_bytes
        self._prefill_s = lat.prefill_s_per_token
        self._attention_s = lat.attention_s_per_token2
        self._overhead_s = lat.overhead_free_s  # the pod does not wait for it
        self._overhead_busy_s = lat.overhead_busy_s  # it does (one core serves both)
        self._load_delay_s = float(self.cluster.load_delay_s)
        self._decode_s = lat.decode_s_per_token
        self._cpu_chunk_s = lat.cpu_load_chunk_s + cb / lat.pcie_bytes_per_s  # one chunk CPU -> GPU
        self._l2_chunk_s = lat.l2_read_chunk_s + cb / lat.l2_read_bytes_per_s  # one chunk L2 read
        self._l2_retrieve_s = lat.l2_retrieve_overhead_s
        self._cpu_fixed_s = lat.cpu_load_overhead_s
        self._w_chunk_s = lat.l2_write_chunk_s
        self._w_byte_s = 1.0 / lat.l2_write_bytes_per_s
        gpu_n, cpu_n, l2_n = (_chunks_of(caps.gpu_tokens, c), _chunks_of(caps.cpu_tokens, c),
                              _chunks_of(caps.l2_tokens, c))
        for pod in self._pods:
            pod.gpu = self._rebuild(pod.gpu, "lru", gpu_n, pod.name, "GPU")
            pod.cpu = self._rebuild(pod.cpu, knobs.cpu_eviction, cpu_n, pod.name, "CPU")
        self._l2 = self._rebuild(self._l2, knobs.l2_eviction, l2_n, None, None)
        self._l2_high = int(l2_n * knobs.l2_high_watermark)
        self._l2_low = int(l2_n * knobs.l2_low_watermark)
        self._l2_min = knobs.l2_min_prompt_tokens
        self._connector = self._l2 is not None or any(p.cpu is not None for p in self._pods)
        if old is None or old.router != knobs.router:
            self._router: Router = make_router(knobs.router, len(self._pods), self.cluster.router)

    def _rebuild(self, tier: Policy | None, policy: str, capacity: int, pod: str | None, medium: str | None):
        """A tier with a new policy/capacity, keeping what still fits (oldest evicted first)."""
        if tier is not None and tier.name == policy and tier.capacity == capacity:
            return tier
        if capacity <= 0:
            if tier is not None and pod is not None and self._sink and len(tier):
                for h in tier.keys_in_order():
                    self._sink(BlockRemoved(self._now, pod, self._chunk_blocks.get(h, (h,)), medium))
            return None
        new = LRU(capacity) if policy == "lru" else make_policy(policy, capacity)
        if tier is not None and len(tier):
            evicted = new.insert_many(tier.keys_in_order())
            if pod is not None and self._sink:
                for h in evicted:
                    self._sink(BlockRemoved(self._now, pod, self._chunk_blocks.get(h, (h,)), medium))
        return new

    def reconfigure(self, knobs: Knobs) -> None:
        """Apply new knobs without restarting pods (call `restart_pod` to model a rollout).

        CPU and L2 tiers are rebuilt with the new policy/capacity and keep what fits. After a chunk
        size change the resident chunks are stale (their hashes no longer match any prompt) and
        age out; every chunk counts as never seen again, as a real chunk-size change behaves.
        """
        self._configure(knobs, first=False)

    def place(self, placement: Sequence[int]) -> None:
        """Send the next requests to these pods, one each in arrival order, instead of routing them
        (`PlacedRouter`: a placement observed on the fleet, replayed as it happened)."""
        self._router = PlacedRouter(len(self._pods), self.cluster.router, placement)

    # -- pods ----------------------------------------------------------------------------------
    @property
    def pod_names(self) -> tuple[str, ...]:
        return tuple(p.name for p in self._pods)

    def _pod(self, pod: int | str) -> _Pod:
        if isinstance(pod, str):
            if pod not in self._index:
                raise KeyError(f"unknown pod {pod!r}; pods: {', '.join(self._index)}")
            return self._pods[self._index[pod]]
        return self._pods[pod]

    def restart_pod(self, pod: int | str, at: float, down_s: float = 0.0) -> None:
        """A rollout restart at time `at` (s): counters to zero, GPU and CPU cold, L2 survives.
        With `down_s` the pod starts no prefill before `at + down_s` (capacity lost while the new
        engine loads); requests routed to it meanwhile queue."""
        p = self._pod(pod)
        self._now = max(self._now, at)
        for tier in (p.gpu, p.cpu):
            if tier is not None:
                tier.clear()
        p.totals = PodTotals()
        p.obs = PodObservations()
        idx = self._pods.index(p)
        self._heap = [e for e in self._heap if e[2] != idx]
        heapify(self._heap)
        self._loads[idx] = 0
        p.free_at = at + max(down_s, 0.0)
        if self._sink:
            self._sink(AllBlocksCleared(at, p.name))

    # -- the engine ----------------------------------------------------------------------------
    def submit(self, request: Request | Mapping[str, Any]) -> RequestOutcome:
        """Process one request (a `Request` or a workload row as a mapping)."""
        if not isinstance(request, Request):
            request = Request(**{k: request[k] for k in ("timestamp_ms", "input_length", "output_length",
                                                          "hash_ids", "session_id", "phase") if k in request})
        if len(request.hash_ids) * BLOCK_TOKENS < request.input_length:
            raise WorkloadError(
                f"request at {request.timestamp_ms} ms: {len(request.hash_ids)} block hashes cannot cover "
                f"input_length {request.input_length}"
            )
        chunks = chunk_hashes(request.hash_ids, request.input_length, self._chunk)
        blocks = (chunk_hashes(request.hash_ids, request.input_length, BLOCK_TOKENS)
                  if self._sink is not None and self._chunk > BLOCK_TOKENS else None)
        row = self._process(request.timestamp_ms / 1000.0, request.input_length, request.output_length,
                            chunks, request.session_id, blocks=blocks)
        return RequestOutcome(self._pods[row[0]].name, *row)

    def _lookup(self, pod: _Pod, chunks: list[int], l2: Policy | None, g: int = -1):
        """(GPU prefix chunks, CPU-hit keys, L2-hit keys, first computed index) without side effects.

        GPU first with prefix semantics; from the first GPU miss on, each chunk is served by the
        CPU if resident there, else by L2; the lookup stops at the first chunk in neither.
        """
        n = len(chunks)
        if g < 0:
            g = len(list(takewhile(pod.gpu._resident.__contains__, chunks))) if pod.gpu is not None else 0
        cpu = pod.cpu
        if g == n or (cpu is None and l2 is None):
            return g, _EMPTY, _EMPTY, g
        rest = chunks[g:] if g else chunks
        if l2 is None:
            a = len(list(takewhile(cpu._resident.__contains__, rest)))
            return g, rest[:a], _EMPTY, g + a
        in_l2 = l2._resident.__contains__
        if cpu is None:
            b = len(list(takewhile(in_l2, rest)))
            return g, _EMPTY, rest[:b], g + b
        cpu_keys, l2_keys, k = cpu_l2_runs(rest, cpu._resident.__contains__, in_l2)
        return g, cpu_keys, l2_keys, g + k

    def _service_s(self, cpu_chunks: int, l2_chunks: int, computed_tokens: int,
                   cached_tokens: int = 0) -> tuple[float, float, float]:
        """(GPU-busy service time, L2 read time, extra non-busy latency) of one prefill."""
        lat, cb = self._lat, self._chunk_bytes
        l2_read = lat.l2_read_s(l2_chunks, l2_chunks * cb)
        busy = (lat.cpu_load_s(cpu_chunks, cpu_chunks * cb) + l2_read + lat.prefill_s(computed_tokens, cached_tokens)
                + lat.overhead_busy_s)
        extra = lat.overhead_free_s + (lat.l2_retrieve_overhead_s if l2_chunks else
                                       lat.cpu_load_overhead_s if cpu_chunks else 0.0)
        return busy, l2_read, extra

    def _estimate(self, chunks: list[int], prompt: int, now: float) -> Callable[[int], float]:
        l2 = self._l2 if prompt >= self._l2_min else None
        c = self._chunk

        def expected_ttft(i: int) -> float:
            pod = self._pods[i]
            _g, ck, lk, k = self._lookup(pod, chunks, l2)
            busy, _, extra = self._service_s(len(ck), len(lk), prompt - k * c, k * c)
            return max(pod.free_at - now, 0.0) + busy + extra

        return expected_ttft

    def _process(
        self, now: float, prompt: int, out_len: int, chunks: list[int], session: int | None, cold: int = -1,
        fresh: int = 0, blocks: list[int] | None = None,
    ) -> tuple:
        """One request, returned as a row (see `replay.RESULT_SCHEMA`); `simulator.twin_step.step`."""
        return step(self, now, prompt, out_len, chunks, session, cold, fresh, blocks)

    # -- observability -------------------------------------------------------------------------
    def pod_counters(self, pod: int | str) -> dict[str, float]:
        """Cumulative counters and current gauges of one pod, under the real systems' names."""
        p = self._pod(pod)
        idx, now = self._pods.index(p), self._now
        waiting = sum(1 for end, start, i in self._heap if i == idx and start > now)
        running = sum(1 for end, start, i in self._heap if i == idx and start <= now < end)
        return pod_metrics(
            p.totals, connector=self._connector, chunk_tokens=self._chunk, kv_bytes_per_token=self._bpt,
            gpu_used=len(p.gpu) if p.gpu is not None else 0, gpu_cap=p.gpu.capacity if p.gpu is not None else 0,
            cpu_used=len(p.cpu) if p.cpu is not None else 0, cpu_cap=p.cpu.capacity if p.cpu is not None else 0,
            running=running, waiting=waiting,
        )

    def l2_counters(self) -> dict[str, float]:
        """The shared pool: capacity/used bytes, evictions, read/write bytes, ops and time."""
        l2 = self._l2
        return l2_metrics(self._l2_totals, used_chunks=len(l2) if l2 is not None else 0,
                          cap_chunks=l2.capacity if l2 is not None else 0, chunk_bytes=self._chunk_bytes)

    def observations(self, pod: int | str, *, drain: bool = False) -> PodObservations:
        """TTFT, queue delay and L2 read/write latency samples of one pod (copies, or drained)."""
        p = self._pod(pod)
        obs = p.obs
        if drain:
            p.obs = PodObservations()
            return obs
        return PodObservations(list(obs.ttft_s), list(obs.queue_delay_s), list(obs.l2_read_s), list(obs.l2_write_s))

    def miss_attribution(self, pod: int | str | None = None) -> MissTotals:
        """Ground truth since the twin started (not reset by restarts): per pod, or the fleet sum."""
        if pod is not None:
            return dataclasses.replace(self._pod(pod).truth)
        total = MissTotals()
        for p in self._pods:
            total.add(p.truth)
        return total

    def resident(self, pod: int | str | None, medium: str) -> set[int]:
        """Chunk hashes resident now in a pod's "GPU" or "CPU" tier, or in L2 (pod None, medium "L2")."""
        tier = self._l2 if medium == "L2" else getattr(self._pod(pod), medium.lower())  # type: ignore[arg-type]
        return set(tier.keys_in_order()) if tier is not None else set()

    def evictions(self) -> dict[str, int]:
        """Chunks evicted per tier since the twin started (GPU/CPU summed over pods, current counters)."""
        return {
            "gpu": sum(p.totals.gpu_evicted_chunks for p in self._pods),
            "cpu": sum(p.totals.cpu_evicted_chunks for p in self._pods),
            "l2": self._l2_totals.evicted_chunks,
        }
