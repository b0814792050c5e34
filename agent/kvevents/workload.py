"""Windowed workload signals: the KV-event totals combined with vLLM's token counters (pure).

Events alone cannot see two things the definitions need:
- blocks read from the shared L2 pool: the pool publishes nothing, so such a block looks like a
  capacity or routing miss (it is stored on the GPU, seen before, not on the pod's own CPU);
- the partial last chunk of each prompt ("tail"): it is never hashed, so it never appears.

(vLLM's native tiering publishes its shared fs tier as "STORAGE" events: those L2 hits are seen
and counted as such, `EventTotals.l2_hits`; only the rest is inferred.)

vLLM's counters close both gaps, per pod (cumulative, as scraped):
- `vllm:prompt_tokens_total` = P;
- `vllm:external_prefix_cache_hits_total` = X, tokens the connector (LMCache L1 + L2) supplied.
  L1 hits are visible in the events (E1: GPU stores of blocks the pod held on its CPU tier), so
  L2 hits = X - E1. Which capacity/routing blocks they were is not observable; the shared pool
  keeps the most recently touched blocks, and what touches it (computing a block, or reading it)
  is exactly a GPU store that is not an L1 hit. So each miss carries its store distance (fleet
  stores since that hash was last stored) and the L2 hits are taken from the smallest distances
  first: in effect the pool's size is inferred from the counters (exact for an LRU pool, an
  estimate for other policies);
- `vllm:prompt_tokens_by_source_total{source="local_compute"}` = C, computed tokens including
  tails. Computed full blocks = cold + capacity + routing (after the L2 correction), so
  tail = C - that.

overlap = 1 - (cold + tail) / P. Without C the tail is unknown and overlap = 1 - cold / P
(an upper bound); without X no L2 correction is made.
"""
from __future__ import annotations

import collections
import dataclasses
import math

import numpy as np


@dataclasses.dataclass(frozen=True)
class PodCounters:
    """One pod's cumulative counters (None: not scraped / not exposed)."""

    prompt_tokens: float
    local_compute_tokens: float | None = None
    external_hit_tokens: float | None = None


@dataclasses.dataclass(frozen=True)
class EventTotals:
    """Cumulative token totals of one model's events (fleet sums)."""

    cold: float = 0.0
    capacity: float = 0.0
    routing: float = 0.0
    l1_hits: float = 0.0
    # capacity / routing miss tokens by store distance bucket (index.DISTANCE_BUCKETS), or None
    capacity_by_distance: np.ndarray | None = None
    routing_by_distance: np.ndarray | None = None
    l2_hits: float = 0.0  # seen in events: GPU stores of blocks read from the shared L2 ("STORAGE")


@dataclasses.dataclass(frozen=True)
class OverlapReading:
    """Workload signals over `[start, end]` (seconds). Token figures are window deltas; `tail`
    and `l2_hit` are None when the counters they need were not fed."""

    model: str
    start: float
    end: float
    prompt_tokens: float
    ratio: float  # workload overlap = 1 - (cold + tail) / prompt
    cold_tokens: float
    capacity_tokens: float
    routing_tokens: float
    tail_tokens: float | None
    l1_hit_tokens: float
    l2_hit_tokens: float | None
    # local-compute tokens (vLLM's counter) over the window, None when not fed
    computed_tokens: float | None = None
    # L2 hits beyond the capacity + routing misses: blocks the index took for cold. Unsharded it
    # is ~0; a shard's index has not seen blocks other shards' pods put in the shared L2
    l2_unmatched_tokens: float = 0.0

    def share(self, what: str) -> float | None:
        """Fraction of prompt tokens: cold, capacity, routing, tail, l1_hit or l2_hit."""
        v = getattr(self, f"{what}_tokens")
        return None if v is None else v / self.prompt_tokens


class _Cumulative:
    """A scraped counter; survives counter resets (pod restarts)."""

    __slots__ = ("last", "total")

    def __init__(self) -> None:
        self.last: float | None = None
        self.total = 0.0

    def update(self, value: float) -> None:
        if self.last is not None:
            self.total += value - self.last if value >= self.last else value
        self.last = value


@dataclasses.dataclass(frozen=True)
class _Sample:
    ts: float
    prompt: float
    compute: float  # nan when unknown
    external: float  # nan when unknown
    events: EventTotals


def estimate(model: str, base: _Sample, end: _Sample) -> OverlapReading | None:
    p = end.prompt - base.prompt
    if p <= 0:
        return None
    e0, e1 = base.events, end.events
    cold = e1.cold - e0.cold
    cap, rout = e1.capacity - e0.capacity, e1.routing - e0.routing
    l1 = e1.l1_hits - e0.l1_hits
    seen_l2 = e1.l2_hits - e0.l2_hits  # already not misses
    l2: float | None = seen_l2 if seen_l2 > 0 else None
    unmatched = 0.0
    x = end.external - base.external
    if not math.isnan(x):
        inferred = max(0.0, x - l1 - seen_l2)
        l2 = seen_l2 + inferred
        unmatched = min(cold, max(0.0, inferred - (cap + rout)))
        cap, rout = _remove_l2_hits(inferred, cap, rout, e0, e1)
    tail: float | None = None
    c = end.compute - base.compute
    computed = None if math.isnan(c) else c
    if computed is not None:
        tail = max(0.0, computed - (cold + cap + rout))
    ratio = 1.0 - (cold + (tail or 0.0)) / p
    return OverlapReading(model, base.ts, end.ts, p, min(1.0, max(0.0, ratio)), cold, cap, rout, tail, l1, l2,
                          computed, unmatched)


def _remove_l2_hits(l2: float, cap: float, rout: float, e0: EventTotals, e1: EventTotals) -> tuple[float, float]:
    """Capacity and routing tokens after taking `l2` tokens away, nearest store distance first
    (proportionally when the distance histograms are not available)."""
    both = cap + rout
    if both <= 0 or l2 <= 0:
        return cap, rout
    if e1.capacity_by_distance is None or e1.routing_by_distance is None:
        keep = max(0.0, both - l2) / both
        return cap * keep, rout * keep
    hc = e1.capacity_by_distance - (0 if e0.capacity_by_distance is None else e0.capacity_by_distance)
    hr = e1.routing_by_distance - (0 if e0.routing_by_distance is None else e0.routing_by_distance)
    tot = hc + hr
    before = np.cumsum(tot) - tot
    take = np.clip(l2 - before, 0.0, tot)
    frac = np.divide(take, tot, out=np.zeros_like(tot, dtype=float), where=tot > 0)
    return max(0.0, cap - float((hc * frac).sum())), max(0.0, rout - float((hr * frac).sum()))


class WorkloadWindow:
    """Samples of one model's counters and event totals; readings over any recent window."""

    def __init__(self, model: str, keep_s: float) -> None:
        self.model = model
        self.keep_s = keep_s
        self._pods: dict[str, tuple[_Cumulative, _Cumulative | None, _Cumulative | None]] = {}
        self._samples: collections.deque[_Sample] = collections.deque()

    def observe(self, pod: str, counters: PodCounters, events: EventTotals, ts: float) -> None:
        prompt, compute, external = self._pods.get(pod, (_Cumulative(), None, None))
        prompt.update(float(counters.prompt_tokens))
        if counters.local_compute_tokens is not None:
            compute = compute or _Cumulative()
            compute.update(float(counters.local_compute_tokens))
        if counters.external_hit_tokens is not None:
            external = external or _Cumulative()
            external.update(float(counters.external_hit_tokens))
        self._pods[pod] = (prompt, compute, external)
        pods = self._pods.values()
        total_c = sum(c.total for _, c, _ in pods if c) if all(c for _, c, _ in pods) else math.nan
        total_x = sum(x.total for _, _, x in pods if x) if all(x for _, _, x in pods) else math.nan
        self._samples.append(_Sample(ts, sum(p.total for p, _, _ in pods), total_c, total_x, events))
        while len(self._samples) > 2 and self._samples[1].ts < ts - self.keep_s:
            self._samples.popleft()

    def reading(self, window_s: float) -> OverlapReading | None:
        if not self._samples:
            return None
        end = self._samples[-1]
        base = self._samples[0]
        for s in self._samples:
            if s.ts >= end.ts - window_s:
                break
            base = s
        return estimate(self.model, base, end)
