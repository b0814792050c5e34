"""What the tuner reads from the agent's own store (`tuner.planner:`).

The agent never sees prompts. Without KV events its planning workload is a synthetic one fitted to
the observed signals (agent/runtime/workload_fit.py), on a twin cluster sized from vLLM's own view (`vllm:cache_config_info` GPU capacity) and carrying the
load term (`vllm:num_requests_waiting` by Little's law -> `ClusterSpec.load_delay_s`).

- `observed_between(store, kv, since, until)`: the fitted workload's inputs over one window of the
  store (the KV-event reuse ratio only for the latest window; the cache's cumulative hit ratio,
  a lower bound, otherwise).
- `FittedHistory`: the planning workload when KV events are off (`kind` "fitted"): the workload
  fitted to the window ending at `now`, laid out on the store's clock so that it ends at `now`.
- `latency_points(store, since, until, step_s)`: per step, (finished requests, mean uncached prompt
  tokens, mean TTFT minus the Little's-law queue delay), what `tuners.calibration` fits the
  twin's prefill speed to. vLLM: `vllm:time_to_first_token_seconds` (sum / count),
  `vllm:prompt_tokens_by_source_total{source="local_compute"}`, `vllm:num_requests_waiting`.
"""
from __future__ import annotations

import logging
import math
from collections.abc import Callable
from typing import Any

import polars as pl

from agent.collect.window import bucket_increases, bucket_shares, signal_values
from agent.runtime.tuning_bridge import deepest_cumulative_ratio, drift_signals, gpu_observations
from agent.runtime.workload_fit import ObservedWorkload, capped_workload
from simulator.cluster import ClusterSpec

log = logging.getLogger(__name__)


def store_window(store: Any, since: float, until: float) -> pl.DataFrame:
    """The store's window aggregate over exactly [since, until] (a sharded leader's FleetStore:
    every shard's)."""
    return store.window_between(since, until)


def _waiting_total(window: pl.DataFrame) -> float | None:
    """Fleet-wide waiting requests at the window's end (sum over pods of the latest gauge)."""
    rows = window.filter(pl.col("le").is_null() & (pl.col("signal") == "requests_waiting"))
    vals = [v for v in rows["last"].to_list() if v is not None and math.isfinite(v)]
    return sum(vals) if vals else None


def observed_between(store: Any, kv: Any, since: float, until: float, *, latest: bool) -> ObservedWorkload:
    """What the fitted workload reproduces, measured over [since, until]."""
    w = store_window(store, since, until)
    values, _ = signal_values(w.filter(pl.col("le").is_null()))
    seconds = max(until - since, 1e-9)
    finished = values.get("ttft_seconds:count", values.get("requests"))
    rate = finished / seconds if finished else None
    overlap = None
    if latest:  # the KV-event overlap is kept for the latest window only; the rate over the data it holds
        signals = drift_signals(store, kv, seconds)
        overlap = signals.get("reuse_ratio")
        rate = signals.get("arrival_rate", rate)
    if overlap is None:
        overlap = deepest_cumulative_ratio(w)
    gpu = gpu_observations(w)
    mix = tuple(bucket_shares(bucket_increases(w, "prompt_length_tokens")))
    return ObservedWorkload(rate, mix, None if overlap is None or not math.isfinite(overlap) else min(max(overlap, 0.0), 1.0),
                            gpu_tokens=int(gpu["gpu_tokens"]) if "gpu_tokens" in gpu else None,
                            requests_waiting=gpu.get("requests_waiting"), preemption_rate=gpu.get("preemption_rate"))


def twin_cluster_for(base: dict[str, Any], observed: ObservedWorkload, pods: int) -> ClusterSpec:
    """The twin cluster with vLLM's real GPU capacity and the observed load term, when measured."""
    kw = dict(base)
    if observed.gpu_tokens:
        kw["gpu_tokens"] = observed.gpu_tokens
    delay = observed.queue_delay_s(pods)
    if delay is not None and math.isfinite(delay):
        kw["load_delay_s"] = delay
    return ClusterSpec(**kw)


class FittedHistory:
    """A `WorkloadSource` (agent/runtime/tuning/workload.py) of kind `fitted`: `history(now,
    seconds)` is the synthetic workload fitted to the `window_s` before `now`."""

    kind = "fitted"

    def __init__(self, store: Any, kv: Any, clock: Callable[[], float], *, window_s: float,
                 max_requests: int, max_block_refs: int, seed: int) -> None:
        self.store, self.kv, self.clock = store, kv, clock
        self.window_s, self.max_requests, self.max_block_refs, self.seed = window_s, max_requests, max_block_refs, seed
        self.capped: str | None = None  # the last plan workload's cap note (workload_fit.capped_workload)

    def observed(self, now: float) -> ObservedWorkload:
        return observed_between(self.store, self.kv, now - self.window_s, now, latest=now >= self.clock() - 1.0)

    def history(self, now: float, seconds: float) -> pl.DataFrame:
        observed = self.observed(now)
        log.info("twin workload fitted to %s (the fallback: no block stream)", observed)
        frame, self.capped = capped_workload(observed, duration_s=seconds, max_requests=self.max_requests,
                                             max_block_refs=self.max_block_refs, seed=self.seed)
        if self.capped:
            log.warning("%s", self.capped)
        if frame.height == 0:
            return frame
        shift = int(now * 1000.0) - int(frame["timestamp_ms"].max()) - 1
        return frame.with_columns(pl.col("timestamp_ms") + shift)


def latency_points(store: Any, since: float, until: float, step_s: float) -> list[tuple[float, float, float]]:
    """(requests, mean uncached prompt tokens, mean TTFT - queue delay) per `step_s` window."""
    out = []
    t = since
    while t + step_s <= until + 1e-9:
        w = store_window(store, t, t + step_s)
        values, _ = signal_values(w.filter(pl.col("le").is_null()))
        n = values.get("ttft_seconds:count", 0.0)
        total = values.get("ttft_seconds:sum")
        computed = values.get("prompt_computed_tokens")
        if n > 0 and total is not None and computed is not None:
            waiting = _waiting_total(w) or 0.0
            queue = waiting / (n / step_s)  # Little's law, fleet-wide
            out.append((n, computed / n, max(total / n - queue, 0.0)))
        t += step_s
    return out


__all__ = ["FittedHistory", "latency_points", "observed_between", "store_window",
           "twin_cluster_for"]
