"""The rolling window of normalised signals, kept in polars, and its read API.

Each scrape cycle appends one frame (pod, model, signal, le, source, kind, value, delta, dt).
`delta` is the reset-aware increase since the previous sample of the same series (null for the
first sample), `dt` the seconds since that sample. Frames older than the retention are dropped
whole, so memory is bounded by retention / scrape interval frames.

Window semantics (used by the snapshot, the tuner's live evaluator and the drift detector):
- a counter's increase over a window is the sum of its deltas inside the window; if the series
  has no delta there (one single scrape so far), its latest value, i.e. the lifetime total;
- a counter series that first appears on a later read of a target already read (an LMCache
  histogram with its first observation, a new `source` label value) was born in between: its
  first delta is its value, counted from zero as Prometheus counts a new counter;
- a gauge's value is its latest one;
- a rate is increase / covered seconds (None when only lifetime totals exist);
- the first delta inside the window usually covers time before it (since the scrape before the
  window's start): only its share inside the window counts, as if the increase were spread evenly
  over its interval (Prometheus extrapolates `increase()` to the window's edges likewise).

The read API (store_reads.py, pure functions over `window()`; pod/model None means all, summed):
`ttft_bucket_deltas`, `ttft_quantiles`, `hit_ratios`, `cumulative_hit_ratios`,
`prompt_token_rate`, `request_rate`, `prompt_length_mix`.
"""
from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import polars as pl

from agent.collect.counter_math import counter_delta
from agent.collect.store_reads import WindowReads
from agent.collect.window import (
    since_engine_start,
    window_aggregate,
)
from contracts.tier_model import Signal

SCHEMA: dict[str, pl.DataType] = {
    "ts": pl.Float64(),
    "pod": pl.Categorical(),
    "model": pl.Categorical(),
    "signal": pl.Categorical(),
    "le": pl.Float64(),
    "source": pl.Categorical(),
    "kind": pl.Categorical(),
    "value": pl.Float64(),
    "delta": pl.Float64(),
    "dt": pl.Float64(),
}


SERIES_KEY = ["pod", "model", "signal", "le", "source"]


def series_hash() -> pl.Expr:
    """A 64-bit hash of a row's series key (a join key; equal keys are checked after the join)."""
    return pl.struct(SERIES_KEY).hash()


@dataclass(frozen=True, slots=True)
class _Pending:
    """The last `ingest_frame`'s series as columns (the key columns, values and kinds, all read
    at `ts`), not yet written into the per-series dict."""

    keys: pl.DataFrame
    values: pl.Series
    kinds: pl.Series
    ts: float


@dataclass(frozen=True, slots=True)
class IngestReport:
    rows: int
    resets: tuple[str, ...]  # pods with at least one counter that went down


class WindowStore(WindowReads):
    """Thread-safe rolling store. `clock` gives seconds (injectable for tests)."""

    def __init__(self, retention_s: float = 900.0, window_s: float = 300.0,
                 clock: Callable[[], float] = time.time) -> None:
        if retention_s <= 0 or window_s <= 0:
            raise ValueError("retention_s and window_s must be positive")
        self.retention_s = retention_s
        self.window_s = min(window_s, retention_s)
        self.clock = clock
        self._frames: deque[tuple[float, pl.DataFrame]] = deque()
        self._last: dict[tuple, tuple[float, float]] = {}  # series -> (ts, value)
        self._counters: set[tuple] = set()  # series that are counters
        # (pod, source) -> when that target was last read: a counter series first seen on a later
        # read was born in between and counts from zero (as Prometheus' counters do), not from
        # its first value
        self._seen: dict[tuple[str, str], float] = {}
        # (pod, signal) -> value of a model-less counter (a per-node daemon's, e.g. Curvine FUSE
        # read bytes) when the pod's engine last restarted: its lifetime "last" is reported since
        # then, so lifetime splits against the engine's own counters stay consistent
        self._bases: dict[tuple[str, str], float] = {}
        self._pending: _Pending | None = None  # ingest_frame's last cycle, until _settle()
        self._lock = threading.Lock()
        self._cache: tuple[tuple[float, float, int], pl.DataFrame] | None = None

    # -- writing -----------------------------------------------------------------------------
    def ingest(self, signals: Sequence[Signal], ts: float | None = None,
               restarted: Collection[tuple[str, str]] = (),
               read_at: Mapping[tuple[str, str], float] | None = None,
               known: Collection[tuple[str, str]] = ()) -> IngestReport:
        """Append one scrape. `restarted` names the (pod, source) pairs whose process restarted
        since their previous scrape (a counter of their target went down): every counter of
        theirs counts its whole value as the increase (it restarted from zero, even where the new
        value is not below the old one, e.g. a histogram bucket the old process rarely hit), and
        their series missing from this scrape restart from zero when they reappear.
        `read_at` gives the time each (pod, source) was actually read, when it differs from `ts`
        (the cycle's start): its rows, deltas and rates use it. `known` names (pod, model) pairs
        whose counters ran before they were first read (a model a cardinality budget lets in
        late): their first values are lifetime totals, never increases."""
        cycle_ts = self.clock() if ts is None else ts
        read_at = read_at or {}
        self._settle()
        if restarted:
            self._rebase(restarted)
        signals = list(signals)
        last = self._last
        reset_pods: set[str] = set()
        seen: set[tuple] = set()
        seen_before = self._seen
        read: dict[tuple[str, str], float] = {}  # this scrape's reads, applied after it
        les = [None if s.le != s.le else s.le for s in signals]
        times: list[float] = []
        deltas: list[float | None] = []
        dts: list[float | None] = []
        for s, le in zip(signals, les, strict=True):
            key = (s.pod, s.model, s.name, le, s.source)
            ts = read_at.get((s.pod, s.source), cycle_ts)
            seen.add(key)
            prev = last.get(key)
            delta = dt = None
            if s.kind == "counter":
                self._counters.add(key)
                if prev is not None and s.value < prev[1]:
                    self._bases.pop((s.pod, s.name), None)  # the daemon itself restarted
            if s.kind == "counter" and prev is not None and ts > prev[0]:
                new_process = (s.pod, s.source) in restarted
                if new_process or s.value < prev[1]:
                    reset_pods.add(s.pod)
                delta = s.value if new_process else counter_delta(prev[1], s.value)
                dt = ts - prev[0]
            elif s.kind == "counter" and prev is None and (not known or (s.pod, s.model) not in known):
                before = seen_before.get((s.pod, s.source))
                if before is not None and ts > before:  # born since its target's previous read
                    delta, dt = s.value, ts - before
            read[(s.pod, s.source)] = ts
            last[key] = (ts, s.value)
            times.append(ts)
            deltas.append(delta)
            dts.append(dt)
        # the other columns at once (a Signal is a tuple: pod, model, name, le, value, kind, source)
        pods, models, names, _, values, kinds, sources = zip(*signals, strict=True) if signals else ((),) * 7
        cols = {"ts": times, "pod": pods, "model": models, "signal": names, "le": les, "source": sources,
                "kind": kinds, "value": values, "delta": deltas, "dt": dts}
        seen_before.update(read)
        if restarted:
            for key in [k for k in last if (k[0], k[4]) in restarted and k not in seen]:
                last[key] = (read_at.get((key[0], key[4]), cycle_ts), 0.0)
        frame = pl.DataFrame({k: list(v) for k, v in cols.items()}, schema=SCHEMA)
        newest = max(times, default=cycle_ts)
        with self._lock:
            self._frames.append((newest, frame))
            self._prune_locked(cycle_ts)
            self._cache = None
        return IngestReport(frame.height, tuple(sorted(reset_pods)))

    def ingest_frame(self, rows: pl.DataFrame, ts: float | None = None) -> IngestReport:
        """`ingest` of one cycle given as a frame (columns pod, model, signal, le, source, kind,
        value; `le` null for non-buckets), all read at `ts`: the same rows, deltas and resets,
        computed column-wise (the Prometheus source's path: 100k+ series per cycle). A counter
        series first seen after an earlier read counts from zero (see below).

        The cycle's last values stay columns (`_Pending`) until something reads the per-series
        state (`_settle`): the next cycle takes its previous values from them with a join (or none,
        when it has the same series in the same order), so no Python object is made per series."""
        cycle_ts = self.clock() if ts is None else ts
        keys = rows.select(SERIES_KEY)
        kinds, values = rows["kind"], rows["value"]
        prev_ts, prev_value = self._previous(keys, kinds, cycle_ts)
        frame = rows.select("pod", "model", "signal", "le", "source", "kind", "value").with_columns(
            ts=pl.lit(cycle_ts, pl.Float64), prev_ts=prev_ts, prev_value=prev_value)
        counted = (pl.col("kind") == "counter") & pl.col("prev_value").is_not_null() & (pl.col("ts") > pl.col("prev_ts"))
        frame = frame.with_columns(
            delta=pl.when(counted).then(
                pl.when(pl.col("value") < pl.col("prev_value")).then(pl.col("value"))
                .otherwise(pl.col("value") - pl.col("prev_value"))),
            dt=pl.when(counted).then(pl.col("ts") - pl.col("prev_ts")),
            reset=(pl.col("kind") == "counter") & (pl.col("value") < pl.col("prev_value")).fill_null(False))
        resets = frame.filter(pl.col("reset"))
        for pod, name in resets.select("pod", "signal").iter_rows():
            self._bases.pop((pod, name), None)  # the daemon itself restarted
        reset_pods = set(resets.filter(pl.col("delta").is_not_null())["pod"].to_list())
        self._pending = _Pending(keys, values, kinds, cycle_ts)
        reads = rows.select("pod", "source").unique(maintain_order=True)
        self._seen.update(dict.fromkeys(reads.iter_rows(), cycle_ts))
        out = frame.select(list(SCHEMA)).cast(SCHEMA)  # type: ignore[arg-type]
        with self._lock:
            self._frames.append((cycle_ts, out))
            self._prune_locked(cycle_ts)
            self._cache = None
        return IngestReport(out.height, tuple(sorted(reset_pods)))

    def _previous(self, keys: pl.DataFrame, kinds: pl.Series, cycle_ts: float) -> tuple[pl.Series, pl.Series]:
        """Each row's previous (ts, value), null for none. The previous cycle's pending rows answer
        by a join; the rest, the per-series dict. A Prometheus source has every target's history,
        so a counter series absent at the previous read was not yet born: it counts from zero
        (`(x unless x offset w) or increase(x[w])` counts it the same way)."""
        p = self._pending
        n = keys.height
        joinable = p is not None and not keys["le"].is_nan().any()  # NaN `le`: no key equals it in the dict
        if joinable and p.keys.equals(keys):
            self._pending = None  # the same series in the same order: every row's previous value
            was_counter = (p.kinds == "counter") & (kinds != "counter")
            if was_counter.any():  # a series that was a counter stays one (as `ingest` keeps it)
                self._counters.update(keys.filter(was_counter).iter_rows())
            return pl.repeat(p.ts, n, dtype=pl.Float64, eager=True), p.values.rename("prev_value")
        joined = self._join_pending(p, keys, kinds) if joinable else None
        if joined is None:
            prev_ts = pl.Series("prev_ts", [None] * n, dtype=pl.Float64)
            prev_value = pl.Series("prev_value", [None] * n, dtype=pl.Float64)
            missing = pl.Series([True] * n)
        else:
            prev_ts, prev_value, missing = joined
        self._settle()
        if missing.any():
            prev_ts, prev_value = self._from_dict(keys, kinds, missing, prev_ts, prev_value, cycle_ts)
        return prev_ts, prev_value

    def _join_pending(self, p: _Pending, keys: pl.DataFrame, kinds: pl.Series
                      ) -> tuple[pl.Series, pl.Series, pl.Series] | None:
        """(prev ts, prev value, rows not found) from the pending cycle, joined on a hash of the
        key columns and checked key by key; its rows this cycle lacks go to the per-series dict.
        None (nothing changed) when the join is not one-to-one or a hash is shared by two series."""
        if p.keys["le"].is_nan().any():
            return None
        key_hash = series_hash()
        old = p.keys.select(pl.all().name.prefix("_old_"), _h=key_hash, _value=p.values, _kind=p.kinds,
                            _old_row=pl.int_range(pl.len(), dtype=pl.UInt32))
        joined = keys.with_columns(_h=key_hash, _kind_now=kinds).join(old, on="_h", how="left", maintain_order="left")
        if joined.height != keys.height:
            return None
        found = joined["_old_row"].is_not_null()
        same = joined.select(pl.all_horizontal(pl.col(c).eq_missing(pl.col(f"_old_{c}")) for c in SERIES_KEY))
        if not (same.to_series() | ~found).all():
            return None
        prev_ts = joined.select(pl.when(found).then(pl.lit(p.ts, pl.Float64)).alias("prev_ts")).to_series()
        matched = np.zeros(p.keys.height, dtype=bool)
        matched[joined["_old_row"].drop_nulls().to_numpy()] = True
        self._pending = None
        self._settle_rows(p, pl.Series(np.flatnonzero(~matched)))
        changed = joined.filter((pl.col("_kind") == "counter") & (pl.col("_kind_now") != "counter"))
        self._counters.update(changed.select(SERIES_KEY).iter_rows())  # it was a counter once
        return prev_ts, joined["_value"].rename("prev_value"), ~found

    def _from_dict(self, keys: pl.DataFrame, kinds: pl.Series, missing: pl.Series, prev_ts: pl.Series,
                   prev_value: pl.Series, cycle_ts: float) -> tuple[pl.Series, pl.Series]:
        """`_previous` for the rows in `missing`, from the per-series dict."""
        idx = missing.arg_true()
        sub = keys[idx]
        last = self._last
        prev = [last.get(k) for k in zip(*(sub[c].to_list() for c in SERIES_KEY), strict=True)]
        before = max(self._seen.values(), default=None)
        if before is not None and before < cycle_ts:
            prev = [q if q is not None or kind != "counter" else (before, 0.0)
                    for q, kind in zip(prev, kinds[idx].to_list(), strict=True)]
        at = [(i, q) for i, q in zip(idx.to_list(), prev, strict=True) if q is not None]
        if not at:
            return prev_ts, prev_value
        rows = pl.Series([i for i, _ in at], dtype=pl.UInt32)
        prev_ts = prev_ts.clone().scatter(rows, pl.Series([q[0] for _, q in at], dtype=pl.Float64))
        prev_value = prev_value.clone().scatter(rows, pl.Series([q[1] for _, q in at], dtype=pl.Float64))
        return prev_ts, prev_value

    def _settle(self) -> None:
        """Write the pending cycle's last values (and its counter series) into the per-series dict."""
        p, self._pending = self._pending, None
        if p is not None:
            self._settle_rows(p, None)

    def _settle_rows(self, p: _Pending, rows: pl.Series | None) -> None:
        keys, values, kinds = (p.keys, p.values, p.kinds) if rows is None else (p.keys[rows], p.values[rows], p.kinds[rows])
        if not keys.height:
            return
        tuples = list(zip(*(keys[c].to_list() for c in SERIES_KEY), strict=True))
        self._last.update(zip(tuples, ((p.ts, v) for v in values.to_list()), strict=True))
        self._counters.update(k for k, kind in zip(tuples, kinds.to_list(), strict=True) if kind == "counter")

    def _rebase(self, restarted: Collection[tuple[str, str]]) -> None:
        pods = {p for p, _ in restarted}
        for key, (_ts, value) in self._last.items():
            pod, model, name, le, source = key
            if pod in pods and not model and le is None and (pod, source) not in restarted \
                    and key in self._counters:
                self._bases[(pod, name)] = value

    def prune(self, now: float | None = None) -> None:
        with self._lock:
            self._prune_locked(self.clock() if now is None else now)

    def _prune_locked(self, now: float) -> None:
        horizon = now - self.retention_s
        dropped = False
        while self._frames and self._frames[0][0] < horizon:
            self._frames.popleft()
            dropped = True
        if dropped:  # series not seen for a whole retention are forgotten
            if self._pending is not None and self._pending.ts < horizon:
                self._settle()
            self._last = {k: v for k, v in self._last.items() if v[0] >= horizon}
            gone = self._counters - self._last.keys()
            if gone and self._pending is not None:  # the pending cycle's series are still there
                p = self._pending
                gone -= set(zip(*(p.keys[c].to_list() for c in SERIES_KEY), strict=True))
            self._counters -= gone
            self._seen = {k: v for k, v in self._seen.items() if v >= horizon}

    def forget_pods(self, pods: Iterable[str]) -> None:
        """Drop the remembered last values of pods that are gone (their rows age out)."""
        gone = set(pods)
        with self._lock:
            self._settle()
            self._last = {k: v for k, v in self._last.items() if k[0] not in gone}
            self._bases = {k: v for k, v in self._bases.items() if k[0] not in gone}
            self._seen = {k: v for k, v in self._seen.items() if k[0] not in gone}

    # -- reading -----------------------------------------------------------------------------
    @property
    def rows(self) -> int:
        with self._lock:
            return sum(f.height for _, f in self._frames)

    def frame(self, since: float | None = None) -> pl.DataFrame:
        """All stored rows (optionally newer than `since`), oldest first."""
        with self._lock:
            frames = [f for t, f in self._frames if since is None or t > since]
        if not frames:
            return pl.DataFrame(schema=SCHEMA)
        out = pl.concat(frames, how="vertical", rechunk=False)
        return out if since is None else out.filter(pl.col("ts") > since)

    def window_between(self, since: float, until: float) -> pl.DataFrame:
        """The window aggregate over exactly [since, until]: `since` prorates the first increase,
        so it never reaches back before `since` (e.g. into the configuration before a rollout)."""
        frame = self.frame(since=since)
        return window_aggregate(frame.filter(pl.col("ts") <= until), since=since)

    def window(self, window_s: float | None = None, now: float | None = None) -> pl.DataFrame:
        """Per series over the window: increase (or lifetime total), last value, seconds covered."""
        now = self.clock() if now is None else now
        window_s = self.window_s if window_s is None else window_s
        with self._lock:
            newest = self._frames[-1][0] if self._frames else 0.0
            key = (window_s, newest, len(self._frames))
            if self._cache is not None and self._cache[0] == key and now >= newest:
                return self._cache[1]
        out = window_aggregate(self.frame(since=now - window_s), since=now - window_s)
        if self._bases and out.height:
            out = since_engine_start(out, dict(self._bases))
        with self._lock:
            self._cache = (key, out)
        return out


# -- pure helpers over frames ---------------------------------------------------------------


__all__ = ["SCHEMA", "IngestReport", "WindowStore"]
