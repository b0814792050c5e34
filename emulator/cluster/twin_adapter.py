"""Connects the digital twin (`simulator.twin.Twin`, issue 2) to the scaled-real-time driver.

It turns the twin's per-request outcomes into the emulated pods' `RequestOutcome`s (adding the
inter-token latency and the stored-token count the pods' histograms need) and reads the twin's
gauges and L2 counters under the real systems' names (`Twin.pod_counters`, `Twin.l2_counters`).
"""
from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from contracts.knobs import Knobs
from emulator.cluster.driver import L2Load, PodLoad, ServedRequest
from emulator.cluster.pod_metrics import L2Status, RequestOutcome
from simulator.records import Request
from simulator.twin import Twin


def request_outcome(twin: Twin, req: Request, o: Any) -> RequestOutcome:
    """What the pod's metrics record of one request the twin served (`o`: its `Twin.submit` outcome)."""
    chunk = twin.knobs.chunk_tokens
    lat = twin.profile.latency
    bpt = twin.capacities.kv_bytes_per_token
    return RequestOutcome(
        prompt_tokens=o.prompt_tokens, gpu_hit_tokens=o.gpu_hit_tokens, cpu_hit_tokens=o.cpu_hit_tokens,
        l2_hit_tokens=o.l2_hit_tokens, output_tokens=req.output_length, ttft_s=o.ttft_s,
        queue_s=o.queue_delay_s, l2_read_s=o.l2_read_s,
        cpu_load_s=o.cpu_hit_tokens * bpt / lat.pcie_bytes_per_s if o.cpu_hit_tokens else 0.0,
        stored_tokens=(o.computed_tokens // chunk) * chunk, chunk_tokens=chunk, itl_s=lat.decode_s_per_token)


def pod_load(twin: Twin, pod: str) -> dict[str, float]:
    """The scheduler and cache gauges of one pod, as `VllmPodMetrics.set_load` takes them."""
    c = twin.pod_counters(pod)
    return {"running": int(c.get("vllm:num_requests_running", 0)), "waiting": int(c.get("vllm:num_requests_waiting", 0)),
            "gpu_usage": float(c.get("vllm:kv_cache_usage_perc", 0.0)),
            "cpu_bytes": float(c.get("lmcache:local_cache_usage", 0.0))}


class TwinPortAdapter:
    """`TwinPort` over a `Twin` and the workload's requests (arrival order)."""

    def __init__(self, twin: Twin, requests: Sequence[Request]) -> None:
        self.twin = twin
        self.requests = list(requests)
        self._cpu_evicted: dict[str, float] = {}
        self._l2_evicted: tuple[float, float] = (0.0, 0.0)

    def arrival_times(self) -> list[float]:
        return [r.timestamp_ms / 1000.0 for r in self.requests]

    def submit(self, index: int) -> ServedRequest:
        req = self.requests[index]
        o = self.twin.submit(req)
        chunk = self.twin.knobs.chunk_tokens
        l2_chunks = -(-o.l2_hit_tokens // chunk) if o.l2_hit_tokens else 0
        per_chunk_us = (o.l2_read_s / l2_chunks * 1e6) if l2_chunks else 0.0
        outcome = request_outcome(self.twin, req, o)
        stored, bpt = outcome.stored_tokens, self.twin.capacities.kv_bytes_per_token
        return ServedRequest(pod=o.pod, trace_ts=o.time_s, outcome=outcome,
                             l2_chunk_latencies_us=(per_chunk_us,) * l2_chunks,
                             l2_written_bytes=stored * bpt if self.twin.capacities.l2_tokens else 0,
                             miss_tokens=(o.cold_tokens, o.capacity_tokens, o.routing_tokens, o.tail_tokens))

    def pod_load(self, pod: str) -> PodLoad:
        c = self.twin.pod_counters(pod)
        evicted = c.get("lmcache:local_cpu_evict_keys_count", 0.0)
        prev = self._cpu_evicted.get(pod, 0.0)
        delta = evicted - prev if evicted >= prev else evicted  # counters reset on restart
        self._cpu_evicted[pod] = evicted
        return PodLoad(running=int(c.get("vllm:num_requests_running", 0)),
                       waiting=int(c.get("vllm:num_requests_waiting", 0)),
                       gpu_usage=float(c.get("vllm:kv_cache_usage_perc", 0.0)),
                       cpu_bytes=float(c.get("lmcache:local_cache_usage", 0.0)),
                       cpu_evicted_chunks=int(delta))

    def l2_load(self) -> L2Load:
        c = self.twin.l2_counters()
        files, freed = c.get("eviction_files_deleted", 0.0), c.get("eviction_bytes_freed", 0.0)
        pf, pb = self._l2_evicted
        self._l2_evicted = (files, freed)
        return L2Load(status=L2Status(capacity_bytes=c.get("capacity", 0.0), used_bytes=c.get("fs_used", 0.0),
                                      tracked_files=int(c.get("fs_used", 0.0) // max(
                                          self.twin.knobs.chunk_tokens * self.twin.capacities.kv_bytes_per_token,
                                          1))),
                      evicted_files=int(max(files - pf, 0)), evicted_bytes=max(freed - pb, 0.0))

    def restart_pod(self, pod: str, at: float) -> None:
        self.twin.restart_pod(pod, at)

    def reconfigure(self, knobs: Knobs) -> None:
        self.twin.reconfigure(knobs)
