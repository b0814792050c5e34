"""Did tuning pay for itself? The arithmetic of the honest measure (pure).

A run is judged on the TTFT of every request as actually served, against two references on
the same request stream:

- **held**: the defaults held for the whole run (no change at all);
- **hindsight**: per phase, the best static configuration found on the twin knowing the whole
  phase (the ceiling no online tuner can beat).

**captured gain** = (held - tuned) / (held - hindsight), per statistic (p95, mean): 1.0 means the
tuner got everything hindsight could, 0 nothing, below 0 it made things worse. When hindsight
does not beat held (held - hindsight <= 0) there was nothing to capture and the gain is NaN.

`score_phases` builds one `PhaseScore` per phase plus `whole run` (all requests pooled; hindsight
pooled from each phase's own best configuration), and `scorecard_lines` renders the table the
demo report and `bench/live_tuning.py` print.
"""
from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence

import numpy as np

WHOLE_RUN = "whole run"


@dataclasses.dataclass(frozen=True)
class TtftSummary:
    """p50, p95 and mean TTFT (seconds) of a set of requests; NaN when there are none."""

    requests: int
    p50_s: float
    p95_s: float
    mean_s: float

    @classmethod
    def of(cls, ttfts: Sequence[float] | np.ndarray) -> TtftSummary:
        x = np.asarray(ttfts, dtype=float)
        x = x[np.isfinite(x)]
        if x.size == 0:
            return cls(0, math.nan, math.nan, math.nan)
        return cls(int(x.size), float(np.quantile(x, 0.5)), float(np.quantile(x, 0.95)), float(x.mean()))


def captured_gain(held: float, tuned: float, hindsight: float) -> float:
    """(held - tuned) / (held - hindsight); NaN when hindsight does not beat held."""
    room = held - hindsight
    if not (math.isfinite(held) and math.isfinite(tuned) and math.isfinite(hindsight)) or room <= 0:
        return math.nan
    return (held - tuned) / room


def speedup(held: float, tuned: float) -> float:
    """held / tuned: above 1 the tuned run was faster."""
    return held / tuned if tuned > 0 and math.isfinite(held) and math.isfinite(tuned) else math.nan


@dataclasses.dataclass(frozen=True)
class ActionCounts:
    """What the tuner did over a span: restarts (rolling restarts of the vLLM pods), applies
    (every configuration change, hot reloads included), rollbacks, and drift alarms split into
    true (a real workload shift) and false ones."""

    restarts: int = 0
    applies: int = 0
    rollbacks: int = 0
    true_alarms: int = 0
    false_alarms: int = 0

    def __add__(self, other: ActionCounts) -> ActionCounts:
        return ActionCounts(*(a + b for a, b in zip(dataclasses.astuple(self), dataclasses.astuple(other))))


@dataclasses.dataclass(frozen=True)
class PhaseScore:
    label: str
    held: TtftSummary
    tuned: TtftSummary
    hindsight: TtftSummary
    actions: ActionCounts = ActionCounts()

    @property
    def gain_p95(self) -> float:
        return captured_gain(self.held.p95_s, self.tuned.p95_s, self.hindsight.p95_s)

    @property
    def gain_mean(self) -> float:
        return captured_gain(self.held.mean_s, self.tuned.mean_s, self.hindsight.mean_s)

    @property
    def speedup_p95(self) -> float:
        return speedup(self.held.p95_s, self.tuned.p95_s)

    @property
    def speedup_mean(self) -> float:
        return speedup(self.held.mean_s, self.tuned.mean_s)

    @property
    def hindsight_speedup_p95(self) -> float:
        return speedup(self.held.p95_s, self.hindsight.p95_s)

    @property
    def hindsight_speedup_mean(self) -> float:
        return speedup(self.held.mean_s, self.hindsight.mean_s)


def score_phases(labels: Sequence[str], held: Mapping[int, Sequence[float]], tuned: Mapping[int, Sequence[float]],
                 hindsight: Mapping[int, Sequence[float]],
                 actions: Mapping[int, ActionCounts] | None = None) -> list[PhaseScore]:
    """One score per phase that has requests (index into `labels`), then `whole run`.

    held/tuned/hindsight map phase index -> the TTFT (s) of that phase's requests as served in
    that run; the whole run pools every phase's requests of each run."""
    actions = actions or {}
    out: list[PhaseScore] = []
    for i, label in enumerate(labels):
        if not len(tuned.get(i, ())) and not len(held.get(i, ())):
            continue
        out.append(PhaseScore(label, TtftSummary.of(held.get(i, ())), TtftSummary.of(tuned.get(i, ())),
                              TtftSummary.of(hindsight.get(i, ())), actions.get(i, ActionCounts())))

    def pooled(runs: Mapping[int, Sequence[float]]) -> np.ndarray:
        parts = [np.asarray(v, float) for v in runs.values() if len(v)]
        return np.concatenate(parts) if parts else np.zeros(0)

    total = ActionCounts()
    for a in actions.values():
        total = total + a
    out.append(PhaseScore(WHOLE_RUN, TtftSummary.of(pooled(held)), TtftSummary.of(pooled(tuned)),
                          TtftSummary.of(pooled(hindsight)), total))
    return out


def _ms(s: float) -> str:
    return "n/a" if not math.isfinite(s) else f"{s * 1000:,.0f}"


def _x(r: float) -> str:
    return "n/a" if not math.isfinite(r) else f"{r:.2f}x"


def _pct(g: float) -> str:
    return "n/a" if not math.isfinite(g) else f"{g * 100:.0f}%"


def scorecard_lines(scores: Sequence[PhaseScore]) -> list[str]:
    """The headline table (markdown): held / tuned / hindsight TTFT p95 and mean in ms, tuned and
    hindsight speed-ups over held, captured gain, and what the tuner did."""
    lines = [("| phase | requests | TTFT p95 held (ms) | TTFT p95 tuned (ms) | TTFT p95 hindsight (ms)"
             " | TTFT mean held (ms) | TTFT mean tuned (ms) | TTFT mean hindsight (ms)"
             " | speed-up tuned vs held, p95 / mean (x) | speed-up hindsight vs held, p95 / mean (x)"
             " | captured gain p95 / mean (%) | restarts | applies | rollbacks | drift alarms true / false |"),
             "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for s in scores:
        name = f"**{s.label}**" if s.label == WHOLE_RUN else s.label
        a = s.actions
        lines.append(
            f"| {name} | {s.tuned.requests} | {_ms(s.held.p95_s)} | {_ms(s.tuned.p95_s)} | {_ms(s.hindsight.p95_s)}"
            f" | {_ms(s.held.mean_s)} | {_ms(s.tuned.mean_s)} | {_ms(s.hindsight.mean_s)}"
            f" | {_x(s.speedup_p95)} / {_x(s.speedup_mean)}"
            f" | {_x(s.hindsight_speedup_p95)} / {_x(s.hindsight_speedup_mean)}"
            f" | {_pct(s.gain_p95)} / {_pct(s.gain_mean)} | {a.restarts} | {a.applies} | {a.rollbacks}"
            f" | {a.true_alarms} / {a.false_alarms} |")
    return lines


__all__ = ["WHOLE_RUN", "ActionCounts", "PhaseScore", "TtftSummary", "captured_gain", "score_phases",
           "scorecard_lines", "speedup"]
