"""The store's column-wise ingest (`ingest_frame`, the Prometheus source's path) keeps a cycle's
values as columns until the per-series state is read. Held to the per-series algorithm it
replaces, written out here as the reference: random cycles whose series come and go, change
order and kind, reset, and age out of the retention, mixed with the signal path's `ingest`,
`forget_pods` and `prune`, must give the same rows, resets, windows and per-series state."""
from __future__ import annotations

import math
import random

import polars as pl
import pytest

import agent.collect.store as store_module
from agent.collect.counter_math import counter_delta
from agent.collect.store import SCHEMA, IngestReport, WindowStore
from contracts.tier_model import NO_LE, Signal

FRAME = {"pod": pl.String, "model": pl.String, "signal": pl.String, "le": pl.Float64, "source": pl.String,
         "kind": pl.String, "value": pl.Float64}


class PerSeriesStore(WindowStore):
    """The reference: every row's previous value looked up in, and written back to, the
    per-series dict at once."""

    def ingest_frame(self, rows: pl.DataFrame, ts: float | None = None) -> IngestReport:
        cycle_ts = self.clock() if ts is None else ts
        cols = [rows[c].to_list() for c in ("pod", "model", "signal", "le", "source")]
        kinds, values = rows["kind"].to_list(), rows["value"].to_list()
        keys = list(zip(*cols, strict=True))
        prev = [self._last.get(k) for k in keys]
        before = max(self._seen.values(), default=None)
        if before is not None and before < cycle_ts:
            prev = [p if p is not None or kind != "counter" else (before, 0.0) for p, kind in zip(prev, kinds, strict=True)]
        times, deltas, dts, reset_pods = [], [], [], set()
        for key, kind, value, p in zip(keys, kinds, values, prev, strict=True):
            delta = dt = None
            if kind == "counter" and p is not None and cycle_ts > p[0]:
                delta, dt = counter_delta(p[1], value), cycle_ts - p[0]
            if kind == "counter" and p is not None and value < p[1]:
                self._bases.pop((key[0], key[2]), None)
                if delta is not None:
                    reset_pods.add(key[0])
            times.append(cycle_ts)
            deltas.append(delta)
            dts.append(dt)
        self._counters.update(k for k, kind in zip(keys, kinds, strict=True) if kind == "counter")
        self._last.update(zip(keys, ((cycle_ts, v) for v in values), strict=True))
        self._seen.update(dict.fromkeys(zip(cols[0], cols[4], strict=True), cycle_ts))
        frame = pl.DataFrame({"ts": times, "pod": cols[0], "model": cols[1], "signal": cols[2], "le": cols[3],
                              "source": cols[4], "kind": kinds, "value": values, "delta": deltas, "dt": dts},
                             schema=SCHEMA)
        with self._lock:
            self._frames.append((cycle_ts, frame))
            self._prune_locked(cycle_ts)
            self._cache = None
        return IngestReport(frame.height, tuple(sorted(reset_pods)))

    def _prune_locked(self, now: float) -> None:
        horizon = now - self.retention_s
        dropped = False
        while self._frames and self._frames[0][0] < horizon:
            self._frames.popleft()
            dropped = True
        if dropped:
            self._last = {k: v for k, v in self._last.items() if v[0] >= horizon}
            self._counters &= self._last.keys()
            self._seen = {k: v for k, v in self._seen.items() if v >= horizon}


def universe(rng: random.Random) -> list[tuple[str, str, str, float | None, str]]:
    series = []
    for pod in ("a", "b", "c"):
        for name in ("gpu_lookup_tokens", "gpu_hit_tokens", "requests", "gpu_usage_ratio"):
            series.append((pod, "m", name, None, "vllm_v1"))
        for le in (0.1, 0.5, math.inf):
            series.append((pod, "m", "ttft_seconds", le, "vllm_v1"))
        series.append((pod, "", "l2_read_bytes", None, "curvine_fuse"))
    rng.shuffle(series)
    return series


def cycle(rng: random.Random, series: list, values: dict, kinds: dict) -> pl.DataFrame:
    """This cycle's rows: most series (some vanish for a while), their order shuffled now and then,
    counters growing, a pod's counters reset at times, a series' kind flipping rarely."""
    present = [s for s in series if rng.random() < 0.9] if rng.random() < 0.5 else list(series)
    if rng.random() < 0.3:
        rng.shuffle(present)
    reset = rng.choice(["a", "b", "c"]) if rng.random() < 0.15 else None
    rows = []
    for s in present:
        if rng.random() < 0.02:
            kinds[s] = "gauge" if kinds[s] == "counter" else "counter"
        values[s] = rng.random() * 10 if s[0] == reset else values[s] + rng.choice([0.0, 1.0, 5.0, 40.0])
        rows.append((*s, kinds[s], values[s]))
    return pl.DataFrame(rows, schema=FRAME, orient="row")


def signals(rows: pl.DataFrame) -> list[Signal]:
    return [Signal(pod, model, name, NO_LE if le is None else le, value, kind, source)
            for pod, model, name, le, source, kind, value in rows.iter_rows()]


def same(a: WindowStore, b: WindowStore) -> None:
    frames, windows = a.frame(), a.window()
    assert frames.sort(frames.columns).equals(b.frame().sort(frames.columns))
    assert windows.sort(windows.columns).equals(b.window().sort(windows.columns))


@pytest.mark.parametrize("seed", range(6))
def test_column_wise_ingest_equals_the_per_series_reference(seed):
    run_against_the_reference(seed)


def test_series_sharing_a_hash_are_told_apart_by_their_keys(monkeypatch):
    """The join's hash is a row's position: every reordered cycle pairs rows of different series,
    which the key check must catch (and fall back to the per-series dict)."""
    monkeypatch.setattr(store_module, "series_hash", lambda: pl.int_range(pl.len(), dtype=pl.UInt64))
    for seed in range(3):
        run_against_the_reference(seed)


def run_against_the_reference(seed: int) -> None:
    rng = random.Random(seed)
    series = universe(rng)
    values = {s: 0.0 for s in series}
    kinds = {s: "gauge" if s[2] == "gpu_usage_ratio" else "counter" for s in series}
    clock = [1000.0]
    ours = WindowStore(retention_s=120, window_s=60, clock=lambda: clock[0])
    ref = PerSeriesStore(retention_s=120, window_s=60, clock=lambda: clock[0])
    for step in range(60):
        clock[0] += rng.choice([15.0, 15.0, 30.0, 150.0])  # now and then a gap beyond the retention
        rows = cycle(rng, series, values, kinds)
        what = rng.random()
        if what < 0.1:  # the signal path now and then (a direct scrape of the same store)
            a, b = ours.ingest(signals(rows)), ref.ingest(signals(rows))
        else:
            a, b = ours.ingest_frame(rows), ref.ingest_frame(rows)
        assert a == b, step
        if what > 0.97:
            ours.forget_pods(["c"])
            ref.forget_pods(["c"])
        elif what > 0.93:  # a prune past everything held (the pending cycle too)
            ours.prune(clock[0] + 130.0)
            ref.prune(clock[0] + 130.0)
        same(ours, ref)
    ours._settle()
    assert ours._last == ref._last and ours._counters == ref._counters and ours._seen == ref._seen


def test_a_cycle_with_the_same_series_takes_its_previous_values_from_the_columns():
    clock = [0.0]
    store = WindowStore(clock=lambda: clock[0])
    rows = pl.DataFrame([("p", "m", "requests", None, "vllm_v1", "counter", 10.0)], schema=FRAME, orient="row")
    store.ingest_frame(rows)
    assert store._last == {} and store._pending is not None  # nothing per series yet
    clock[0] = 15.0
    store.ingest_frame(rows.with_columns(value=pl.lit(25.0)))
    assert store.window()["increase"].to_list() == [15.0] and store._last == {}
    store._settle()
    assert store._last == {("p", "m", "requests", None, "vllm_v1"): (15.0, 25.0)}
