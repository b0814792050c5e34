"""The tuner's Prometheus metrics: a custom Collector over a small, thread-safe state.

The agent registers one `TunerMetrics` into its own registry (`registry.register(metrics)`); the
controller, guardrails and drift detector update it. Nothing registers into the global registry.
Families (documented in docs/metrics.md, section "Tuner (tuners)"):

- tierpilot_tuner_trials_total{state}        counter: finished trials by outcome
- tierpilot_actuations_total{result}         counter: applies/rollbacks by result
- tierpilot_tuner_guardrail_blocks_total{reason} counter: changes held back by a guardrail
- tierpilot_drift_events_total{signal}       counter: change points detected
- tierpilot_config_info{<knob>...}           gauge 1: the configuration the target runs now
- tierpilot_tuner_last_good_info{<knob>...}  gauge 1: the last configuration marked good
- tierpilot_tuner_best_objective_seconds     gauge: best objective (TTFT quantile plus memory cost, s) of the phase
- tierpilot_tuner_trial_objective_seconds    gauge: objective (s) of the latest finished trial
- tierpilot_tuner_phase                      gauge: tuning phase number (bumps on drift)
- tierpilot_tuner_trial_in_flight            gauge: 1 while a live trial is applied and measured
- tierpilot_dry_run                          gauge: 1 in dry-run mode (the one dry-run gauge of the agent)
- tierpilot_tuner_twin_prediction_error_ratio gauge: (twin-predicted - measured) / measured TTFT p95 of
                                             the running configuration over the latest live window
- tierpilot_tier_capacity_hit_ratio{tier, capacity_gib} gauge: the tier's hit ratio had it held
                                             capacity_gib GiB, over the observed history (simulator.capacity)
"""
from __future__ import annotations

import math
import threading
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from contracts.knobs import Knobs
from tuners.base import TRIAL_STATES

ACTUATION_RESULTS: tuple[str, ...] = (
    "applied", "unchanged", "dry_run", "rolled_back", "reapplied",
    "retriable_error", "permanent_error", "rollout_timeout", "rejected",
)
GUARDRAIL_REASONS: tuple[str, ...] = ("in_flight", "cooldown", "hourly_cap", "invalid")
STEP_ERROR_KINDS: tuple[str, ...] = ("storage", "other", "partial_fleet")
KNOB_LABELS: tuple[str, ...] = tuple(Knobs().to_dict())


def knob_labels(knobs: Knobs) -> dict[str, str]:
    return {k: (f"{v:g}" if isinstance(v, float) else str(v)) for k, v in knobs.to_dict().items()}


class TunerMetrics(Collector):
    """Counters and gauges of the tuner, exposed through `collect()`."""

    collector_name = "tuner"  # the `collector` label of tierpilot_collector_up

    def __init__(self, *, target: str = "default") -> None:
        self.target = target
        self._lock = threading.Lock()
        self._trials: Counter[str] = Counter({s: 0 for s in TRIAL_STATES})
        self._actuations: Counter[str] = Counter({r: 0 for r in ACTUATION_RESULTS})
        self._blocks: Counter[str] = Counter({r: 0 for r in GUARDRAIL_REASONS})
        self._drift: Counter[str] = Counter()
        self._step_errors: Counter[str] = Counter({k: 0 for k in STEP_ERROR_KINDS})
        self._config: Knobs | None = None
        self._last_good: Knobs | None = None
        self._best: float | None = None
        self._last_trial: float | None = None
        self._phase = 0
        self._in_flight = False
        self._dry_run = False
        self._twin_error: float | None = None
        self._curves: dict[str, tuple[tuple[float, float], ...]] = {}

    # -- updates -----------------------------------------------------------------------------
    def trial_finished(self, state: str) -> None:
        if state not in TRIAL_STATES:
            raise ValueError(f"trial state {state!r}; valid: {', '.join(TRIAL_STATES)}")
        with self._lock:
            self._trials[state] += 1

    def actuation(self, result: str) -> None:
        if result not in ACTUATION_RESULTS:
            raise ValueError(f"actuation result {result!r}; valid: {', '.join(ACTUATION_RESULTS)}")
        with self._lock:
            self._actuations[result] += 1

    def guardrail_block(self, reason: str) -> None:
        if reason not in GUARDRAIL_REASONS:
            raise ValueError(f"guardrail reason {reason!r}; valid: {', '.join(GUARDRAIL_REASONS)}")
        with self._lock:
            self._blocks[reason] += 1

    def step_error(self, kind: str) -> None:
        """A tuning step failed: `storage` (the study storage did not answer), `other`, or
        `partial_fleet` (a sharded leader skipped the step: a shard did not answer)."""
        if kind not in STEP_ERROR_KINDS:
            raise ValueError(f"step error kind {kind!r}; valid: {', '.join(STEP_ERROR_KINDS)}")
        with self._lock:
            self._step_errors[kind] += 1

    def drift_event(self, signal: str) -> None:
        with self._lock:
            self._drift[signal] += 1

    def set_config(self, knobs: Knobs) -> None:
        with self._lock:
            self._config = knobs

    def set_last_good(self, knobs: Knobs) -> None:
        with self._lock:
            self._last_good = knobs

    def set_best(self, value: float | None) -> None:
        with self._lock:
            self._best = value

    def set_trial_objective(self, value: float | None) -> None:
        with self._lock:
            self._last_trial = value

    def set_phase(self, phase: int) -> None:
        with self._lock:
            self._phase = phase

    def set_in_flight(self, in_flight: bool) -> None:
        with self._lock:
            self._in_flight = in_flight

    def set_dry_run(self, dry_run: bool) -> None:
        with self._lock:
            self._dry_run = dry_run

    def set_twin_prediction_error(self, ratio: float | None) -> None:
        with self._lock:
            self._twin_error = ratio

    def set_capacity_curves(self, points: Mapping[str, Sequence[tuple[float, float]]]) -> None:
        """Per tier, (capacity GiB, hit ratio) points of its capacity curve; replaces the last set."""
        clean: dict[str, tuple[tuple[float, float], ...]] = {}
        for tier, pts in points.items():
            ok = tuple((float(g), float(r)) for g, r in pts
                       if math.isfinite(g) and g >= 0 and math.isfinite(r) and 0.0 <= r <= 1.0)
            if ok:
                clean[tier] = ok
        with self._lock:
            self._curves = clean

    # -- reads (tests, CLI) ------------------------------------------------------------------
    def trials(self, state: str) -> int:
        with self._lock:
            return self._trials[state]

    def actuations(self, result: str) -> int:
        with self._lock:
            return self._actuations[result]

    # -- Collector ---------------------------------------------------------------------------
    def describe(self) -> Iterable[Metric]:
        return []  # families depend on state; an empty describe() keeps registration lazy

    def collect(self) -> Iterable[Metric]:
        with self._lock:
            trials, acts, blocks = dict(self._trials), dict(self._actuations), dict(self._blocks)
            drift, config, last_good = dict(self._drift), self._config, self._last_good
            best, phase, in_flight, dry_run = self._best, self._phase, self._in_flight, self._dry_run
            last_trial = self._last_trial
            step_errors = dict(self._step_errors)
        t = self.target
        fam = CounterMetricFamily("tierpilot_tuner_trials", "Finished tuning trials by outcome.",
                                  labels=["workload", "state"])
        for state, n in sorted(trials.items()):
            fam.add_metric([t, state], n)
        yield fam
        fam = CounterMetricFamily("tierpilot_actuations", "Configuration applies and rollbacks by result.",
                                  labels=["workload", "result"])
        for result, n in sorted(acts.items()):
            fam.add_metric([t, result], n)
        yield fam
        fam = CounterMetricFamily("tierpilot_tuner_guardrail_blocks",
                                  "Changes held back by a guardrail, by reason.", labels=["workload", "reason"])
        for reason, n in sorted(blocks.items()):
            fam.add_metric([t, reason], n)
        yield fam
        fam = CounterMetricFamily("tierpilot_tuner_step_errors",
                                  "Tuning steps that failed (the trial in flight failed and was rolled back), "
                                  "by kind: storage (the study storage did not answer) or other.",
                                  labels=["workload", "kind"])
        for kind, n in sorted(step_errors.items()):
            fam.add_metric([t, kind], n)
        yield fam
        fam = CounterMetricFamily("tierpilot_drift_events", "Workload change points detected, by signal.",
                                  labels=["workload", "signal"])
        for signal, n in sorted(drift.items()):
            fam.add_metric([t, signal], n)
        yield fam
        for name, doc, knobs in (
            ("tierpilot_config_info", "The cache-tier configuration the tuned workload runs now (labels).", config),
            ("tierpilot_tuner_last_good_info", "The last configuration marked good (labels).", last_good),
        ):
            if knobs is not None:
                labels = {"workload": t, **knob_labels(knobs)}
                g = GaugeMetricFamily(name, doc, labels=list(labels))
                g.add_metric(list(labels.values()), 1.0)
                yield g
        for name, doc, value in (
            ("tierpilot_tuner_best_objective_seconds", "Best objective (seconds) in the current phase.", best),
            ("tierpilot_tuner_trial_objective_seconds", "Objective (seconds) of the latest finished trial.",
             last_trial),
        ):
            if value is not None:
                g = GaugeMetricFamily(name, doc, labels=["workload"])
                g.add_metric([t], value)
                yield g
        for name, doc, value in (
            ("tierpilot_tuner_phase", "Tuning phase number; a new phase starts on drift.", phase),
            ("tierpilot_tuner_trial_in_flight", "1 while a live trial is applied and being measured.",
             int(in_flight)),
            ("tierpilot_dry_run", "1 when changes are proposed and validated but never applied.",
             int(dry_run)),
        ):
            g = GaugeMetricFamily(name, doc, labels=["workload"])
            g.add_metric([t], float(value))
            yield g
        with self._lock:
            curves = dict(self._curves)
        if curves:
            g = GaugeMetricFamily("tierpilot_tier_capacity_hit_ratio",
                                  "Hit ratio the tier would have had at capacity_gib GiB (per pod for gpu and cpu, "
                                  "the fleet for l2), over the observed history.",
                                  labels=["target", "tier", "capacity_gib"])
            for tier, pts in sorted(curves.items()):
                for gib, ratio in pts:
                    g.add_metric([t, tier, f"{gib:g}"], ratio)
            yield g
        twin_error = self._twin_error
        if twin_error is not None:
            g = GaugeMetricFamily("tierpilot_tuner_twin_prediction_error_ratio",
                                  "(Twin-predicted - measured) / measured TTFT p95 of the running configuration "
                                  "over the latest live window.", labels=["workload"])
            g.add_metric([t], twin_error)
            yield g
