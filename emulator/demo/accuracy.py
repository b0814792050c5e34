"""How close the agent's export is to the truth: per signal, per pod, over the same window.

The emulated pods are driven by the twin, so every request's truth is recorded (`Recorder`):
tokens per tier, TTFT, L2 chunk reads and the twin's miss attribution, plus the evictions fed to
the pods. `AccuracyMeter.observe` takes one parsed export of the agent (`agent_export.py`, read
over HTTP from its `/metrics`) and compares every signal with the truth over the agent's window
(W seconds up to the snapshot's timestamp):

- ratios (per-tier and cumulative hit ratio per pod; KV-event overlap and miss-cause shares, fleet)
  as absolute error in percentage points;
- latency quantiles (TTFT and L2 read p50/p95 per pod) as absolute error in percent of the truth,
  with the bucket-limited floor: the error of `histogram_quantile` over the true samples put in
  the source's own buckets (no exporter of those buckets can do better);
- rates (lookup and hit tokens per tier, evictions per tier) as a consumer computes them from the
  exported lifetime counters: reset-aware increase between probes about W apart (Prometheus'
  `increase()` without extrapolation), against the truth between the same two snapshots.

`summarise` splits the samples into steady state and "around restarts": a sample whose window
(plus a margin) holds a pod restart or a configuration change. Pure apart from the meter's history.
"""
from __future__ import annotations

import bisect
import dataclasses
import math
from collections import deque
from collections.abc import Callable, Iterable, Sequence

from agent.collect.counter_math import counter_delta, histogram_quantile
from emulator.cluster.timeline import Disturbance, Served, quantile, window_stats
from emulator.demo.agent_export import AgentExport

PP, PCT = "pp", "%"
TIER_NAMES = {"gpu": "GPU", "cpu": "CPU", "l2": "L2"}
KV_CLASSES = ("cold", "capacity", "routing", "tail")
QS = (("p50", "0.5", 0.5), ("p95", "0.95", 0.95))
SIGNALS: tuple[tuple[str, str], ...] = (
    *((f"{TIER_NAMES[t]} hit ratio", PP) for t in ("gpu", "cpu", "l2")),
    ("cumulative hit ratio", PP),
    ("TTFT p50", PCT), ("TTFT p95", PCT), ("L2 read latency p50", PCT), ("L2 read latency p95", PCT),
    ("CPU evictions rate", PCT), ("L2 evictions rate", PCT),
    *((f"{TIER_NAMES[t]} lookup token rate", PCT) for t in ("gpu", "cpu", "l2")),
    *((f"{TIER_NAMES[t]} hit token rate", PCT) for t in ("gpu", "cpu", "l2")),
    ("KV-event overlap", PP), *((f"KV miss share: {c}", PP) for c in KV_CLASSES),
)
UNITS = dict(SIGNALS)
# The live view's old comparison, kept apart: it is a bias of the comparison, not agent error.
BIAS_SIGNALS: tuple[tuple[str, str], ...] = (
    ("GPU hit ratio: unweighted pod mean vs fleet", PP),
    ("cumulative hit ratio: unweighted pod mean vs fleet", PP),
    ("TTFT p95: mean of pod p95s vs fleet p95", PCT),
    ("GPU hit ratio: 2W window vs W", PP),
)
UNITS.update(BIAS_SIGNALS)
FLOOR = ":floor"  # suffix of the bucket-limited floor of a quantile signal


@dataclasses.dataclass(frozen=True)
class ErrorSample:
    trace_s: float
    signal: str
    error: float  # pp or %, absolute


@dataclasses.dataclass(frozen=True)
class AccuracyRow:
    signal: str
    unit: str
    steady: tuple[float, float, int]  # median, p95, samples
    restarts: tuple[float, float, int]


def _pp(agent: float | None, truth: float) -> float | None:
    if agent is None or not math.isfinite(truth):
        return None
    return abs(agent - truth) * 100.0


def _pct(agent: float | None, truth: float) -> float | None:
    if agent is None or not math.isfinite(truth) or truth <= 0:
        return None
    return abs(agent - truth) / truth * 100.0


def bucketed_quantile(samples: Sequence[float], q: float, bounds: Sequence[float]) -> float:
    """`histogram_quantile` over the samples counted into `bounds` (+Inf added): the best a
    histogram with those buckets can tell."""
    edges = sorted(bounds)
    counts = [0] * (len(edges) + 1)
    for x in samples:
        counts[bisect.bisect_left(edges, x)] += 1
    cum, acc = [], 0
    for c in counts:
        acc += c
        cum.append(acc)
    return histogram_quantile(q, list(zip([*edges, math.inf], cum, strict=True)))


def _pod_rows(rows: Iterable[Served]) -> dict[str, list[Served]]:
    out: dict[str, list[Served]] = {}
    for r in rows:
        out.setdefault(r.pod, []).append(r)
    return out


def _l2_samples(rows: Iterable[Served]) -> list[float]:
    out: list[float] = []
    for r in rows:
        out.extend([r.l2_chunk_s] * r.l2_chunks)
    return out


def _quantile_errors(name: str, agent: dict[tuple[str, str], float], pod: str, samples: list[float],
                     bounds: Sequence[float]) -> list[tuple[str, float | None]]:
    out: list[tuple[str, float | None]] = []
    if not samples:
        return out
    for label, key, q in QS:
        truth = quantile(samples, q)
        out.append((f"{name} {label}", _pct(agent.get((pod, key)), truth)))
        out.append((f"{name} {label}{FLOOR}", _pct(bucketed_quantile(samples, q, bounds), truth)))
    return out


def window_errors(export: AgentExport, rows: Sequence[Served], *, ttft_bounds: Sequence[float],
                  l2_bounds_s: Sequence[float], wide_rows: Sequence[Served] = ()) -> list[tuple[str, float | None]]:
    """Window signals of one export against the truth rows of the same window (pure)."""
    out: list[tuple[str, float | None]] = []
    by_pod = _pod_rows(rows)
    for pod, prow in sorted(by_pod.items()):
        st = window_stats(prow)
        for tier in ("gpu", "cpu", "l2"):
            out.append((f"{TIER_NAMES[tier]} hit ratio", _pp(export.hit_ratio.get((pod, tier)), st.hit_ratio[tier])))
        out.append(("cumulative hit ratio", _pp(export.cumulative.get(pod), st.cumulative_hit_ratio)))
        out += _quantile_errors("TTFT", export.ttft, pod, [r.ttft_s for r in prow], ttft_bounds)
        out += _quantile_errors("L2 read latency", export.l2_read, pod, _l2_samples(prow), l2_bounds_s)
    prompt = sum(r.prompt_tokens for r in rows)
    if prompt > 0 and export.kv_overlap is not None:
        cold = sum(r.cold_tokens for r in rows)
        tail = sum(r.tail_tokens for r in rows)
        out.append(("KV-event overlap", _pp(export.kv_overlap, 1.0 - (cold + tail) / prompt)))
        for c in KV_CLASSES:
            truth = sum(getattr(r, f"{c}_tokens") for r in rows) / prompt
            out.append((f"KV miss share: {c}", _pp(export.kv_classes.get(c), truth)))
    out += _bias(by_pod, rows, wide_rows)
    return out


def _bias(by_pod: dict[str, list[Served]], rows: Sequence[Served],
          wide_rows: Sequence[Served]) -> list[tuple[str, float | None]]:
    """What the live view's old comparison added by itself (truth against truth)."""
    if not by_pod:
        return []
    fleet = window_stats(rows)
    pods = [window_stats(p) for p in by_pod.values()]

    def mean(xs: list[float]) -> float:
        xs = [x for x in xs if math.isfinite(x)]
        return sum(xs) / len(xs) if xs else math.nan

    out: list[tuple[str, float | None]] = [
        (BIAS_SIGNALS[0][0], _pp(mean([p.hit_ratio["gpu"] for p in pods]), fleet.hit_ratio["gpu"])),
        (BIAS_SIGNALS[1][0], _pp(mean([p.cumulative_hit_ratio for p in pods]), fleet.cumulative_hit_ratio)),
        (BIAS_SIGNALS[2][0], _pct(mean([p.ttft_p95_s for p in pods]), fleet.ttft_p95_s)),
    ]
    if wide_rows:
        out.append((BIAS_SIGNALS[3][0], _pp(window_stats(wide_rows).hit_ratio["gpu"], fleet.hit_ratio["gpu"])))
    return out


def pod_mean_truth(rows: Sequence[Served]) -> dict[str, float]:
    """The truth aggregated the way the live view aggregates the agent's per-pod values: the
    unweighted mean over pods of each pod's ratio and TTFT p95 ("gpu", "cpu", "l2", "cumulative",
    "ttft_p95"; keys without data are absent). Like with like, for the console."""
    pods = [window_stats(p) for p in _pod_rows(rows).values()]
    values = {t: [p.hit_ratio[t] for p in pods] for t in ("gpu", "cpu", "l2")}
    values["cumulative"] = [p.cumulative_hit_ratio for p in pods]
    values["ttft_p95"] = [p.ttft_p95_s for p in pods]
    out = {}
    for key, xs in values.items():
        finite = [x for x in xs if math.isfinite(x)]
        if finite:
            out[key] = sum(finite) / len(finite)
    return out


def _truth_counts(rows: Iterable[Served]) -> dict[tuple[str, str, str], float]:
    """(family, pod, tier) -> tokens, as the agent's lookup/hit token counters count them."""
    out: dict[tuple[str, str, str], float] = {}

    def add(key: tuple[str, str, str], v: float) -> None:
        out[key] = out.get(key, 0.0) + v

    for r in rows:
        gpu_miss = r.prompt_tokens - r.gpu_hit_tokens
        for tier, lookup, hit in (("gpu", r.prompt_tokens, r.gpu_hit_tokens),
                                  ("cpu", gpu_miss, r.cpu_hit_tokens),
                                  ("l2", gpu_miss - r.cpu_hit_tokens, r.l2_hit_tokens)):
            add(("tierpilot_kv_lookup_tokens", r.pod, tier), lookup)
            add(("tierpilot_kv_hit_tokens", r.pod, tier), hit)
    return out


def _rate_name(family: str, tier: str) -> str:
    if family == "tierpilot_kv_evictions":
        return f"{TIER_NAMES[tier]} evictions rate"
    return f"{TIER_NAMES[tier]} {'lookup' if family.endswith('lookup_tokens') else 'hit'} token rate"


class AccuracyMeter:
    """Keeps the probe history the rate comparison needs; turns each export into error samples.

    `rows(lo, hi)` gives the truth rows with lo < trace_ts <= hi; `evictions_at(t)` the truth
    eviction tallies ((tier, pod) -> entries) at cluster time t. The first window after the start
    (the agent's window not yet full) is warm-up, not measured."""

    def __init__(self, window_s: float, rows: Callable[[float, float], Sequence[Served]],
                 evictions_at: Callable[[float], dict[tuple[str, str], float]], *,
                 ttft_bounds: Sequence[float], l2_bounds_s: Sequence[float], start_s: float = 0.0) -> None:
        self.window_s = window_s
        self.start_s = start_s  # cluster time the workload started: samples begin one window later
        self.rows = rows
        self.evictions_at = evictions_at
        self.ttft_bounds = tuple(ttft_bounds)
        self.l2_bounds_s = tuple(l2_bounds_s)
        self._history: deque[tuple[float, dict[tuple[str, str, str], float]]] = deque()
        self.samples: list[ErrorSample] = []

    def observe(self, export: AgentExport) -> list[ErrorSample]:
        t = export.taken_at
        if not math.isfinite(t) or (self._history and t <= self._history[-1][0]):
            return []  # no snapshot yet, or the same snapshot as last time
        if t < self.start_s + self.window_s:
            return []  # warm-up: the agent's window is not full yet
        rows = self.rows(t - self.window_s, t)
        wide = self.rows(t - 2 * self.window_s, t)
        pairs = window_errors(export, rows, ttft_bounds=self.ttft_bounds, l2_bounds_s=self.l2_bounds_s,
                              wide_rows=wide)
        self._history.append((t, dict(export.counters)))
        pairs += self._rate_errors(t)
        out = [ErrorSample(t, name, err) for name, err in pairs if err is not None and math.isfinite(err)]
        self.samples.extend(out)
        return out

    def _rate_errors(self, t: float) -> list[tuple[str, float | None]]:
        while len(self._history) > 1 and self._history[1][0] <= t - self.window_s:
            self._history.popleft()
        t0, _ = self._history[0]
        if t - t0 < 0.75 * self.window_s:
            return []
        increases: dict[tuple[str, str, str], float] = {}
        for (_ta, a), (_tb, b) in zip(list(self._history), list(self._history)[1:], strict=False):
            for key, v in b.items():
                if key in a:
                    increases[key] = increases.get(key, 0.0) + counter_delta(a[key], v)
        truth = _truth_counts(self.rows(t0, t))
        ev0, ev1 = self.evictions_at(t0), self.evictions_at(t)
        for (tier, pod), v in ev1.items():
            truth[("tierpilot_kv_evictions", pod, tier)] = v - ev0.get((tier, pod), 0.0)
        out: list[tuple[str, float | None]] = []
        for key, inc in sorted(increases.items()):
            if key[0] == "tierpilot_kv_evictions" and key[2] not in ("cpu", "l2"):
                continue
            if key[2] not in TIER_NAMES:
                continue
            out.append((_rate_name(key[0], key[2]), _pct(inc, truth.get(key, 0.0))))
        return out


def disturbed(t: float, disturbances: Sequence[Disturbance], window_s: float, margin_s: float) -> bool:
    """True when the window ending at t (widened by the margin) holds a restart or config change."""
    return any(t - window_s - margin_s < d.trace_s <= t + margin_s for d in disturbances)


def _stats(xs: list[float]) -> tuple[float, float, int]:
    return (quantile(xs, 0.5), quantile(xs, 0.95), len(xs)) if xs else (math.nan, math.nan, 0)


def summarise(samples: Iterable[ErrorSample], disturbances: Sequence[Disturbance], *, window_s: float,
              margin_s: float, signals: Sequence[tuple[str, str]] = SIGNALS) -> list[AccuracyRow]:
    """Median and p95 absolute error per signal, steady state and around restarts."""
    steady: dict[str, list[float]] = {}
    around: dict[str, list[float]] = {}
    for s in samples:
        bucket = around if disturbed(s.trace_s, disturbances, window_s, margin_s) else steady
        bucket.setdefault(s.signal, []).append(s.error)
    return [AccuracyRow(name, unit, _stats(steady.get(name, [])), _stats(around.get(name, [])))
            for name, unit in signals]


def floor_signals() -> list[tuple[str, str]]:
    return [(f"{n}{FLOOR}", u) for n, u in SIGNALS if " p50" in n or " p95" in n]


def _cell(v: float, unit: str) -> str:
    return "n/a" if not math.isfinite(v) else f"{v:.1f} {unit}" if unit == PP else f"{v:.1f}%"


def table_lines(rows: Sequence[AccuracyRow], label: str = "signal") -> list[str]:
    lines = [f"| {label} | steady median | steady p95 | restarts median | restarts p95 |",
             "|---|---:|---:|---:|---:|"]
    for r in rows:
        name = r.signal.removesuffix(FLOOR)
        lines.append(f"| {name} | {_cell(r.steady[0], r.unit)} | {_cell(r.steady[1], r.unit)} | "
                     f"{_cell(r.restarts[0], r.unit)} | {_cell(r.restarts[1], r.unit)} |")
    return lines


def report_lines(samples: Sequence[ErrorSample], disturbances: Sequence[Disturbance], *, window_s: float,
                 margin_s: float) -> list[str]:
    """The `## Agent accuracy` section: the agent's error, the bucket floors, the comparison bias."""
    kw = {"window_s": window_s, "margin_s": margin_s}
    n_steady = sum(1 for s in samples if not disturbed(s.trace_s, disturbances, **kw))
    intro = (f"Each signal the agent exported (read from its `/metrics`) against the twin's truth for the "
             f"same pod over the same {window_s:g} s window; ratios in percentage points, latencies and "
             f"rates in % of the truth. \"restarts\": samples whose window (± {margin_s:g} s) holds a pod "
             f"restart or a configuration change ({len(disturbances)} in this run); {len(samples)} samples, "
             f"{n_steady} steady.")
    floor = ("Bucket-limited floor of the quantiles: `histogram_quantile` over the true samples in the "
             "source's own buckets (vLLM TTFT buckets; Curvine FUSE `curvine_fuse_io_duration_us` buckets). "
             "An error near its floor is the buckets', not the agent's.")
    bias = ("Why the live view compares like with like (truth against truth, not agent error): the agent's "
            "per-pod values averaged without weights, against a token-weighted fleet truth over a window "
            "twice the agent's, would differ by this much.")
    out = ["## Agent accuracy", "", intro, ""]
    out += table_lines(summarise(samples, disturbances, **kw))
    out += ["", floor, ""]
    out += table_lines(summarise(samples, disturbances, signals=floor_signals(), **kw), "floor")
    out += ["", bias, ""]
    out += table_lines(summarise(samples, disturbances, signals=BIAS_SIGNALS, **kw), "comparison")
    return out
