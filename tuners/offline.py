"""Offline tuning on the digital twin: what `tierpilot tune` runs.

`load_workload` picks a trace or a synthetic preset and an optional slice; `tune_on_twin` runs
ask/tell trials against a `TwinEvaluator` (the defaults are enqueued first so the result is
never worse than them) and returns the best configuration next to the defaults' figures.
"""
from __future__ import annotations

import dataclasses
from collections.abc import Callable
from pathlib import Path
from typing import Any

import polars as pl

from contracts.knobs import Knobs
from tuners.base import TrialRecord
from tuners.evaluators import EvaluationCache, TwinEvaluator, run_trials
from tuners.objective import Evaluation, ObjectiveSpec
from tuners.optuna_tuner import OptunaTuner
from tuners.space import SearchSpace
from tuners.space.limits import CandidateError, DeploymentLimits

DEFAULTS = Knobs()  # LMCache defaults (chunk 256, CPU 5 GiB, LRU) with round-robin routing


def load_workload(*, trace: Path | None, preset: str | None, seed: int = 0,
                  max_requests: int | None = None, duration_s: float | None = None) -> pl.DataFrame:
    """A workload frame from a Mooncake trace or a synthetic preset, optionally sliced to the
    first `duration_s` seconds and/or `max_requests` requests."""
    if (trace is None) == (preset is None):
        raise ValueError("give exactly one of a trace path or a synthetic workload name")
    if trace is not None:
        from simulator.workload import load_trace

        frame = load_trace(trace)
    else:
        from simulator.synthetic import synthetic

        frame = synthetic(preset, seed=seed)  # type: ignore[arg-type]
    if duration_s is not None:
        start = int(frame["timestamp_ms"].min())
        frame = frame.filter(pl.col("timestamp_ms") < start + int(duration_s * 1000))
    if max_requests is not None:
        frame = frame.head(max_requests)
    if frame.height == 0:
        raise ValueError("the workload slice is empty; widen --duration or --max-requests")
    return frame


@dataclasses.dataclass(frozen=True)
class OfflineResult:
    best: TrialRecord | None
    best_evaluation: Evaluation | None
    defaults: Evaluation
    pareto: list[TrialRecord]
    records: list[TrialRecord]
    replays: int
    replay_seconds: float


def tune_on_twin(workload: pl.DataFrame, cluster: Any, limits: DeploymentLimits, *, trials: int,
                 objective: ObjectiveSpec, space: SearchSpace | None = None, storage: str | None,
                 study: str, sampler: str = "tpe", seed: int | None = 0, profile: Any = None,
                 on_trial: Callable[[TrialRecord], None] | None = None,
                 enqueue_defaults: bool = True, settings: dict[str, Any] | None = None,
                 defaults: Knobs | None = None) -> tuple[OptunaTuner, OfflineResult]:
    """Run `trials` twin trials (resuming `study` if it exists in `storage` with the same `settings`;
    StudySettingsError otherwise). `defaults`: the baseline to enqueue first and report against
    [default: the LMCache defaults]."""
    space = space or SearchSpace.from_limits(limits)
    baseline = defaults or DEFAULTS
    tuner = OptunaTuner(space, objective, storage=storage, study_name=study, sampler=sampler, seed=seed,
                        owner="tierpilot-tune", settings=settings)
    tuner.resume()
    evaluator = TwinEvaluator(workload, cluster, limits, profile=profile, cache=EvaluationCache())
    if enqueue_defaults and not tuner.trials():
        try:
            tuner.enqueue(space.validate(baseline), source="defaults")
        except CandidateError:
            pass  # the defaults lie outside this deployment's space; still reported below
    records = run_trials(tuner, evaluator, trials, on_trial=on_trial)
    defaults_ev = evaluator.evaluate(baseline)
    best = tuner.best()
    best_ev = evaluator.evaluate(best.knobs) if best else None
    return tuner, OfflineResult(best, best_ev, defaults_ev, tuner.pareto_front(), records,
                                evaluator.replays, evaluator.replay_seconds)


def best_yaml(knobs: Knobs, meta: dict[str, Any]) -> str:
    """The `--out` file: knobs under `knobs:` (what `replay --config` reads) plus metadata."""
    import yaml

    return yaml.safe_dump({"knobs": knobs.to_dict(), "tuned": meta}, sort_keys=False)
