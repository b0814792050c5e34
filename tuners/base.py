"""The tuner interface: ask for a candidate, tell its outcome.

Callers never block inside a tuner. The twin loop, the CLI, the benchmark and the live
controller all drive a `Tuner` the same way: `ask()` -> evaluate somewhere -> `tell()` (or
`fail()`). `tuners.optuna_tuner.OptunaTuner` is the implementation; the contract suite in
`tests/test_tuner_contract.py` runs against every sampler.
"""
from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any, Protocol, runtime_checkable

from contracts.knobs import Knobs
from tuners.objective import Evaluation

# Terminal outcomes a trial can have (also the `state` label of tierpilot_tuner_trials_total).
TRIAL_STATES: tuple[str, ...] = ("complete", "rolled_back", "failed", "rejected", "dry_run", "proposed")


@dataclasses.dataclass(frozen=True)
class Candidate:
    """One configuration to evaluate: the study's trial number and its knobs."""

    number: int
    knobs: Knobs
    params: Mapping[str, Any] = dataclasses.field(default_factory=dict, compare=False)
    source: str = "sampler"  # "sampler", or who enqueued it ("twin", "defaults", "current", ...)


@dataclasses.dataclass(frozen=True)
class TrialRecord:
    """A finished (or running) trial as the tuner reports it."""

    number: int
    knobs: Knobs
    state: str  # complete | rolled_back | failed | rejected | running
    values: tuple[float, ...] | None
    attrs: Mapping[str, Any] = dataclasses.field(default_factory=dict, compare=False)
    feasible: bool = True

    @property
    def value(self) -> float | None:
        return self.values[0] if self.values else None


@runtime_checkable
class Tuner(Protocol):
    """Ask/tell over a search space. Implementations persist every finished trial."""

    def ask(self) -> Candidate:
        """The next configuration to evaluate (enqueued ones first)."""
        ...

    def tell(self, candidate: Candidate, evaluation: Evaluation, *, rolled_back: bool = False) -> TrialRecord:
        """Record a measured outcome. `rolled_back` marks a regression that was undone."""
        ...

    def fail(self, candidate: Candidate, reason: str, *, state: str = "failed") -> TrialRecord:
        """Record that a candidate could not be evaluated (or was rejected), with the reason."""
        ...

    def enqueue(self, knobs: Knobs, *, source: str, again: bool = False) -> None:
        """Evaluate `knobs` before anything the sampler proposes. A configuration the study has
        already seen is skipped, unless `again` (a plan that prices it anew asks for it again)."""
        ...

    def trials(self) -> list[TrialRecord]:
        ...

    def best(self) -> TrialRecord | None:
        """The best feasible finished trial (single objective), or None."""
        ...

    def pareto_front(self) -> list[TrialRecord]:
        """The feasible non-dominated trials (multi-objective); [best] in single-objective mode."""
        ...
