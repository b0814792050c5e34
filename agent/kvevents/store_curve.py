"""What a CPU buffer of N GiB would hit, from the live GPU block stores (KV events).

A pod's GPU `BlockStored` stream is its LMCache CPU buffer's reference stream (docs/twin.md,
"Capacity curves"), so the CPU tier's hit-ratio-versus-capacity curve comes from the events
alone. `StoreStream` keeps the most recent stores per model, bounded in references (the oldest
message's blocks go first) and held in flat arrays (agent/kvevents/store_ring.py, 20 bytes a
block: 20 MB per model at the default million); `StoreCurveCollector` exports the curve as
`tierpilot_kv_cpu_capacity_hit_ratio{model, capacity_gib}`.

The curve is rebuilt by `StoreCurveCollector.rebuild`, which the agent runs as the scheduled job
`kv_capacity_curve` every `refresh_s` in a worker thread (one pass over the kept stream: about
half a second per million blocks on one core). A `/metrics` render only reads the last finished
rebuild, so it never waits for one, however large the stream or the backlog behind it.
"""
from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable, Iterator

import numpy as np
from prometheus_client.core import GaugeMetricFamily, Metric

from agent.kvevents.store_ring import BlockRing
from simulator.capacity.curves import TierCurve
from simulator.capacity.stores import cpu_curve_from_arrays

DEFAULT_MAX_BLOCKS = 1_000_000
GRID_POINTS = 9


class StoreStream:
    """The last `max_blocks` GPU-stored block hashes per model, with their engine and message
    (a `BlockRing` per model: 20 bytes a block)."""

    def __init__(self, max_blocks: int = DEFAULT_MAX_BLOCKS) -> None:
        if max_blocks < 1:
            raise ValueError(f"store stream: max_blocks must be >= 1, got {max_blocks!r}")
        self.max_blocks = max_blocks
        self._lock = threading.Lock()
        self._rings: dict[str, BlockRing] = {}
        self._engines: dict[str, dict[str, int]] = {}
        self._block_tokens: dict[str, int] = {}
        self._seq = 0

    def add(self, model: str, engine: str, hashes: Iterable[int], block_tokens: int) -> None:
        """One message's GPU stores of one engine (looked up together)."""
        arr = np.fromiter(hashes, dtype=np.uint64)
        if not len(arr):
            return
        with self._lock:
            engines = self._engines.setdefault(model, {})
            eid = engines.setdefault(engine, len(engines))
            ring = self._rings.get(model)
            if ring is None:
                ring = self._rings[model] = BlockRing(self.max_blocks)
            ring.push(arr, eid, self._seq)
            self._seq += 1
            if block_tokens > 0:
                self._block_tokens[model] = block_tokens

    def models(self) -> list[str]:
        with self._lock:
            return sorted(self._rings)

    def blocks(self, model: str) -> int:
        with self._lock:
            ring = self._rings.get(model)
            return ring.count if ring is not None else 0

    def nbytes(self) -> int:
        """Bytes the kept stores hold (every model)."""
        with self._lock:
            return sum(r.nbytes for r in self._rings.values())

    def curve(self, model: str, kv_bytes_per_token: float) -> TierCurve | None:
        """The CPU curve of the kept stores of `model` (None before any)."""
        with self._lock:
            ring = self._rings.get(model)
            if ring is None or not ring.count:
                return None
            hashes, engines, batches = ring.ordered()
            block_tokens = self._block_tokens.get(model, 16)
        return cpu_curve_from_arrays(hashes, engines.astype(np.int64), batches, block_tokens=block_tokens,
                                     chunk_tokens=block_tokens, kv_bytes_per_token=max(int(kv_bytes_per_token), 1))

    def clear_engine(self, model: str, engine: str) -> None:
        """An engine restarted: its CPU buffer restarts empty too (LMCache lives in the engine)."""
        with self._lock:
            eid = self._engines.get(model, {}).get(engine)
            ring = self._rings.get(model)
            if eid is None or ring is None or not ring.count:
                return
            ring.drop_engine(eid)


class StoreCurveCollector:
    """`tierpilot_kv_cpu_capacity_hit_ratio{model, capacity_gib}` from a `StoreStream`: `rebuild()`
    computes (scheduled), `collect()` serves the last result (the render)."""

    collector_name = "kv_capacity"

    def __init__(self, stream: StoreStream, kv_bytes_per_token: float, *, refresh_s: float = 60.0,
                 clock: Callable[[], float] = time.monotonic, cap_gib: float | None = None) -> None:
        self.stream = stream
        self.kv_bytes_per_token = kv_bytes_per_token
        self.refresh_s = refresh_s
        self.clock = clock
        self.cap_gib = cap_gib
        self._points: dict[str, list[tuple[float, float]]] = {}  # replaced whole, never mutated
        self.built_at: float | None = None  # clock() when the last rebuild finished
        self.build_s = 0.0  # how long the last rebuild took, seconds
        self._building = threading.Lock()  # one rebuild at a time; renders never take it

    def rebuild(self) -> int:
        """One pass over the kept stores; publishes the new points at once. Returns the models."""
        with self._building:
            start = self.clock()
            out = {}
            for model in self.stream.models():
                curve = self.stream.curve(model, self.kv_bytes_per_token)
                if curve is not None and curve.lookup_tokens:
                    out[model] = curve.grid(curve.default_grid(GRID_POINTS, self.cap_gib))
            self._points = out
            self.built_at = self.clock()
            self.build_s = self.built_at - start
            return len(out)

    def points(self) -> dict[str, list[tuple[float, float]]]:
        """Per model, (capacity GiB per pod, hit ratio) of the last finished rebuild."""
        return dict(self._points)

    def describe(self) -> list[Metric]:
        return []

    def collect(self) -> Iterator[Metric]:
        points = self.points()
        if not points:
            return
        g = GaugeMetricFamily("tierpilot_kv_cpu_capacity_hit_ratio",
                              "Hit ratio a CPU buffer of capacity_gib GiB per pod would have had on the GPU "
                              "block stores of the KV events kept (LRU).", labels=["model", "capacity_gib"])
        for model, pts in sorted(points.items()):
            for gib, ratio in pts:
                g.add_metric([model, f"{gib:g}"], ratio)
        yield g
