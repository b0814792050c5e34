"""Warm-starting a live study from the twin.

`TwinWarmStart.candidates(k)` tunes on the digital twin (an in-memory optuna study over the
recent workload) and returns the k best distinct feasible configurations; the controller
enqueues them first in the live study of a new phase.
"""
from __future__ import annotations

from collections.abc import Callable
from typing import Protocol, runtime_checkable

from contracts.knobs import Knobs
from tuners.base import TrialRecord
from tuners.evaluators import Evaluator, run_trials
from tuners.logline import log_event
from tuners.objective import ObjectiveSpec
from tuners.optuna_tuner import OptunaTuner
from tuners.space import SearchSpace
from tuners.space.limits import CandidateError


@runtime_checkable
class WarmStart(Protocol):
    def candidates(self, k: int) -> list[Knobs]:
        """Up to k promising configurations for the current workload, best first."""
        ...


def top_candidates(records: list[TrialRecord], k: int, objective: ObjectiveSpec) -> list[Knobs]:
    """The k best distinct feasible finished trials (single-objective order)."""
    done = [r for r in records if r.state == "complete" and r.feasible and r.values]
    done.sort(key=lambda r: objective.sort_key(r.values[0], r.attrs.get("evaluation")))
    out: list[Knobs] = []
    for r in done:
        if r.knobs not in out:
            out.append(r.knobs)
        if len(out) == k:
            break
    return out


class TwinWarmStart:
    """Tune `trials` times on the twin built by `evaluator_factory()` (called per phase, so it can
    capture the newest workload) and hand back the top candidates."""

    def __init__(self, evaluator_factory: Callable[[], Evaluator], space: SearchSpace,
                 objective: ObjectiveSpec | None = None, *, trials: int, sampler: str = "tpe",
                 seed: int | None = 0, include: tuple[Knobs, ...] = ()) -> None:
        self.evaluator_factory = evaluator_factory
        self.space = space
        base = objective or ObjectiveSpec()
        self.objective = ObjectiveSpec(metric=base.metric, memory_ms_per_gib=base.memory_ms_per_gib)
        self.trials = trials
        self.sampler = sampler
        self.seed = seed
        self.include = include
        self.runs = 0

    def candidates(self, k: int) -> list[Knobs]:
        evaluator = self.evaluator_factory()
        tuner = OptunaTuner(self.space, self.objective, storage=None, study_name=f"twin-warm-start-{self.runs}",
                            sampler=self.sampler, seed=self.seed)
        for knobs in (self.space.fixed, *self.include):
            try:
                tuner.enqueue(self.space.validate(knobs), source="defaults")
            except CandidateError:
                continue  # the defaults may lie outside this deployment's space
        records = run_trials(tuner, evaluator, self.trials)
        self.runs += 1
        best = top_candidates(records, k, self.objective)
        log_event("warm_start", trials=len(records), candidates=[b.to_dict() for b in best])
        return best
