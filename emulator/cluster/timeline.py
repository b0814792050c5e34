"""What the demo records while it runs: a timeline of fleet signals, the tuner's events and the
per-phase verdict. Plain frozen records plus pure window statistics, shared by the live console
view and the report writer."""
from __future__ import annotations

import bisect
import dataclasses
import math
import threading
from collections import deque
from collections.abc import Iterable, Sequence

TIERS = ("gpu", "cpu", "l2")
EVENT_KINDS = ("phase", "drift", "apply", "rollback", "trial", "keep", "error", "info")


@dataclasses.dataclass(frozen=True)
class Served:
    """One finished request, as the fleet served it (ground truth from the twin)."""

    trace_ts: float
    pod: str
    prompt_tokens: int
    gpu_hit_tokens: int
    cpu_hit_tokens: int
    l2_hit_tokens: int
    ttft_s: float
    phase: int
    l2_chunks: int = 0  # L2 reads of this request (one per chunk), each taking `l2_chunk_s`
    l2_chunk_s: float = 0.0
    cold_tokens: int = 0  # the twin's miss attribution (docs/twin.md, "Truth signals")
    capacity_tokens: int = 0
    routing_tokens: int = 0
    tail_tokens: int = 0
    recorded_s: float = math.nan  # cluster time the pod's counters took the request in (driver step)


@dataclasses.dataclass(frozen=True)
class Disturbance:
    """A moment the fleet changed under the agent: a pod restart or a configuration change."""

    trace_s: float
    kind: str  # "restart" | "config"
    target: str  # pod name, or "" for a fleet-wide configuration change


@dataclasses.dataclass(frozen=True)
class WindowStats:
    requests: int
    ttft_p95_s: float
    ttft_p50_s: float
    hit_ratio: dict[str, float]  # tier-conditional: hits / tokens that reached the tier
    cumulative_hit_ratio: float  # share of prompt tokens served from any tier


@dataclasses.dataclass(frozen=True)
class TimelinePoint:
    wall_s: float
    trace_s: float
    phase: int
    stats: WindowStats
    agent_ttft_p95_s: float | None = None  # what the agent exported, for comparison
    agent_cumulative_hit_ratio: float | None = None
    agent_tier_hit_ratios: dict[str, float] = dataclasses.field(default_factory=dict)
    # The truth aggregated as the agent's values are above (unweighted mean over pods of each
    # pod's truth, over the agent's window): "gpu", "cpu", "l2", "cumulative", "ttft_p95".
    truth_like_agent: dict[str, float] = dataclasses.field(default_factory=dict)


@dataclasses.dataclass(frozen=True)
class DemoEvent:
    wall_s: float
    trace_s: float
    kind: str
    message: str


@dataclasses.dataclass(frozen=True)
class PhaseVerdict:
    """Default configuration vs the tuned one on the same phase workload."""

    phase: int
    label: str
    requests: int
    default_ttft_p95_s: float
    tuned_ttft_p95_s: float
    default_hit_ratio: float
    tuned_hit_ratio: float
    method: str

    @property
    def ttft_speedup(self) -> float:
        return self.default_ttft_p95_s / self.tuned_ttft_p95_s if self.tuned_ttft_p95_s > 0 else math.nan


def quantile(values: Sequence[float], q: float) -> float:
    """Linear-interpolated quantile (numpy's default); NaN for no data."""
    if not values:
        return math.nan
    xs = sorted(values)
    pos = (len(xs) - 1) * q
    lo = math.floor(pos)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


def window_stats(served: Iterable[Served]) -> WindowStats:
    """Fleet statistics over a set of requests. Tier-conditional ratios follow the agent's
    definition: GPU hits / prompt tokens; CPU hits / tokens the GPU missed; L2 hits / tokens
    GPU and CPU missed."""
    rows = list(served)
    prompt = sum(r.prompt_tokens for r in rows)
    gpu = sum(r.gpu_hit_tokens for r in rows)
    cpu = sum(r.cpu_hit_tokens for r in rows)
    l2 = sum(r.l2_hit_tokens for r in rows)

    def ratio(a: float, b: float) -> float:
        return a / b if b > 0 else math.nan

    ttfts = [r.ttft_s for r in rows]
    return WindowStats(
        requests=len(rows),
        ttft_p95_s=quantile(ttfts, 0.95),
        ttft_p50_s=quantile(ttfts, 0.5),
        hit_ratio={"gpu": ratio(gpu, prompt), "cpu": ratio(cpu, prompt - gpu), "l2": ratio(l2, prompt - gpu - cpu)},
        cumulative_hit_ratio=ratio(gpu + cpu + l2, prompt),
    )


class Recorder:
    """Thread-safe store of everything the demo shows and reports."""

    def __init__(self, window_trace_s: float = 120.0, keep: int = 200_000) -> None:
        self.window_trace_s = window_trace_s
        self._lock = threading.Lock()
        self._served: deque[Served] = deque(maxlen=keep)
        self.timeline: list[TimelinePoint] = []
        self.events: list[DemoEvent] = []
        self.verdicts: list[PhaseVerdict] = []
        self.trials: list[tuple[int, float | None, str]] = []  # (number, value, state)
        self.study_marks: list[tuple[int, str]] = []  # (first trial number, label) of a new study
        self.disturbances: list[Disturbance] = []
        self._evictions: dict[tuple[str, str], tuple[list[float], list[float]]] = {}  # key -> (ts, cumulative)

    def add_disturbance(self, d: Disturbance) -> None:
        with self._lock:
            self.disturbances.append(d)

    def add_evictions(self, tier: str, pod: str, n: float, trace_s: float) -> None:
        """Truth tally of evictions (LMCache chunks per pod; Curvine files on the master)."""
        if n <= 0:
            return
        with self._lock:
            ts, cum = self._evictions.setdefault((tier, pod), ([], []))
            ts.append(trace_s)
            cum.append((cum[-1] if cum else 0.0) + n)

    def evictions_at(self, trace_s: float) -> dict[tuple[str, str], float]:
        """(tier, pod) -> entries evicted up to cluster time `trace_s`."""
        out = {}
        with self._lock:
            for key, (ts, cum) in self._evictions.items():
                i = bisect.bisect_right(ts, trace_s)
                out[key] = cum[i - 1] if i else 0.0
        return out

    def served_between(self, lo: float, hi: float) -> list[Served]:
        """Rows with lo < trace_ts <= hi."""
        return [r for r in self.served_since(lo) if r.trace_ts <= hi]

    def recorded_between(self, lo: float, hi: float) -> list[Served]:
        """Rows the pods' counters took in at lo < recorded_s <= hi: the truth a scrape at `hi`
        can see, to compare with the agent's window ending there."""
        return [r for r in self.served_since(lo, recorded=True) if r.recorded_s <= hi]

    def served_since(self, lo_trace_s: float, *, recorded: bool = False) -> list[Served]:
        """Rows with trace_ts (or recorded_s) > lo, newest last, scanning from the newest end
        (both times grow with the arrival order)."""
        with self._lock:
            out = []
            for r in reversed(self._served):
                if (r.recorded_s if recorded else r.trace_ts) <= lo_trace_s:
                    break
                out.append(r)
        out.reverse()
        return out

    def add_served(self, row: Served) -> None:
        with self._lock:
            self._served.append(row)

    def served(self) -> list[Served]:
        with self._lock:
            return list(self._served)

    def window(self, now_trace_s: float) -> WindowStats:
        lo = now_trace_s - self.window_trace_s
        with self._lock:
            rows = [r for r in self._served if r.trace_ts > lo]
        return window_stats(rows)

    def add_point(self, point: TimelinePoint) -> None:
        with self._lock:
            self.timeline.append(point)

    def add_event(self, event: DemoEvent) -> None:
        with self._lock:
            self.events.append(event)

    def latest_events(self, n: int = 8) -> list[DemoEvent]:
        with self._lock:
            return self.events[-n:]

    def set_trials(self, trials: list[tuple[int, float | None, str]]) -> None:
        with self._lock:
            self.trials = list(trials)
