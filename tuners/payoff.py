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


def speed_text(ratio: float) -> str:
    """A speed ratio (before / after, or held / tuned) as people read it: `1.12x faster`,
    `1.19x slower`; `n/a` when unknown."""
    if not math.isfinite(ratio) or ratio <= 0:
        return "n/a"
    if ratio == 1.0:
        return "same speed"
    return f"{ratio:.2f}x faster" if ratio > 1 else f"{1 / ratio:.2f}x slower"


def change_text(gain: float) -> str:
    """A relative TTFT gain (positive: less TTFT) as people read it: `5.0% faster`, `35.5% slower`."""
    if not math.isfinite(gain):
        return "n/a"
    if round(gain * 100, 1) == 0:
        return "no change"
    return f"{abs(gain) * 100:.1f}% {'faster' if gain > 0 else 'slower'}"


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
    """The headline table (markdown): TTFT p95 and mean as held / tuned / hindsight (ms), tuned
    against held as `1.07x faster`, the share of hindsight's gain captured, and what the tuner did."""
    lines = [("| phase | requests | TTFT p95 (ms): held / tuned / hindsight | TTFT mean (ms): held / tuned / hindsight"
              " | tuned vs held: p95; mean | hindsight's gain captured: p95 / mean"
              " | restarts / applies / rollbacks | drift alarms: true / false |"),
             "|---|---:|---:|---:|---:|---:|---:|---:|"]
    for s in scores:
        name = f"**{s.label}**" if s.label == WHOLE_RUN else s.label
        a = s.actions
        lines.append(
            f"| {name} | {s.tuned.requests} | {_ms(s.held.p95_s)} / {_ms(s.tuned.p95_s)} / {_ms(s.hindsight.p95_s)}"
            f" | {_ms(s.held.mean_s)} / {_ms(s.tuned.mean_s)} / {_ms(s.hindsight.mean_s)}"
            f" | {speed_text(s.speedup_p95)}; {speed_text(s.speedup_mean)}"
            f" | {_pct(s.gain_p95)} / {_pct(s.gain_mean)} | {a.restarts} / {a.applies} / {a.rollbacks}"
            f" | {a.true_alarms} / {a.false_alarms} |")
    return lines


SAME_WITHIN = 0.02  # tuned within 2% of held on a statistic: about even on it


def answer_line(scores: Sequence[PhaseScore]) -> str:
    """One sentence answering "did tuning pay for itself?" from the whole run: TTFT p95 and mean
    against the defaults held, the share of hindsight's gain captured, and the changes it cost."""
    whole = next((s for s in scores if s.label == WHOLE_RUN), None)
    if whole is None or not whole.tuned.requests:
        return "No verdict: no request was served."
    a = whole.actions
    p95, mean = whole.speedup_p95, whole.speedup_mean
    signs = {1 if r > 1 + SAME_WITHIN else -1 if r < 1 - SAME_WITHIN else 0 for r in (p95, mean) if math.isfinite(r)}
    word = ("About even" if signs <= {0} else "Yes" if signs <= {0, 1} else "No" if signs <= {0, -1} else "Partly")
    if a.applies == 0:
        word = "No change"
    captured = "" if not (math.isfinite(whole.gain_p95) or math.isfinite(whole.gain_mean)) else (
        f", capturing {_pct(whole.gain_p95)} (p95) and {_pct(whole.gain_mean)} (mean) of what hindsight could")
    cost = ("the tuner applied nothing" if a.applies == 0 else
            f"at the cost of {a.restarts} rolling restart{'s' * (a.restarts != 1)} and {a.applies} configuration "
            f"change{'s' * (a.applies != 1)} ({a.rollbacks} rolled back)")
    def said(r: float) -> str:
        text = speed_text(r)
        return "unchanged" if text == "same speed" else text

    return (f"{word}: over the whole run, against the defaults held, tuned TTFT p95 was {said(p95)} and the mean "
            f"{said(mean)}{captured}; {cost}.")


__all__ = ["WHOLE_RUN", "ActionCounts", "PhaseScore", "TtftSummary", "answer_line", "captured_gain", "change_text", "score_phases",
           "scorecard_lines", "speed_text", "speedup"]
