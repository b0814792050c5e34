"""The optuna implementation of `Tuner`: ask/tell over persistent storage.

- Samplers: `tpe` (multivariate TPE, see `make_sampler`), `random`, `grid` (the space's grid);
  all seedable.
- Storage: any optuna RDB URL. SQLite by default (`sqlite:///tierpilot.db`); PostgreSQL
  (`postgresql+psycopg2://user@host:port/db`) lets several agents share studies. `None` keeps the
  study in memory (tests, throw-away twin runs).
- Constraints: the space's memory constraints are recorded with `Trial.set_constraint` at ask
  time. (Optuna 5 deprecated the sampler argument `constraints_func` in favour of
  `set_constraint`; both write the same trial attribute, which TPE's constrained mode and
  `best_trial`/`best_trials` read.)
- Crash safety: each trial carries its `owner`; `resume()` fails this owner's trials still
  RUNNING (in flight when the previous process died). Finished trials are already in storage.
- The last good configuration lives in the study's user attributes.
- Settings: a tuner given `settings` (what `tierpilot tune` was asked: workload, fleet, backend,
  targets, objective) stores them on a new study and refuses to resume a study whose stored
  settings differ, naming every difference (`StudySettingsError`), so a study is never silently
  continued under other conditions. The search space's distributions are part of the settings.
"""
from __future__ import annotations

import logging
import math
import warnings
from collections.abc import Sequence
from typing import Any

import optuna
from optuna.samplers import BaseSampler, GridSampler, RandomSampler, TPESampler
from optuna.trial import FrozenTrial, TrialState

from contracts.knobs import Knobs
from contracts.redact import redact_url
from tuners.base import Candidate, TrialRecord
from tuners.logline import log_event
from tuners.objective import Evaluation, ObjectiveSpec
from tuners.space import SearchSpace
from tuners.space.limits import CandidateError
from tuners.storage_errors import one_line

log = logging.getLogger("tierpilot.tuner")

SAMPLERS: tuple[str, ...] = ("tpe", "random", "grid")
LAST_GOOD_ATTR = "last_good"
SETTINGS_ATTR = "settings"
# Random trials before TPE models the space. Budgets here are small (20 live trials per phase,
# tens on the twin) and the space has 5-6 dimensions: 5 start-up trials beat optuna's 10 on
# every workload of bench/tuning.py (measured on seeds kept apart from the reported ones).
DEFAULT_STARTUP_TRIALS = 5


class StudySettingsError(ValueError):
    """An existing study was created with other settings; the message names each difference."""


def space_signature(space: SearchSpace) -> dict[str, str]:
    """The search space as JSON-safe text: one entry per dimension and its range or choices."""
    return {d.name: d.describe() for d in space.dimensions}


def study_settings(settings: dict[str, Any], space: SearchSpace, objective: ObjectiveSpec) -> dict[str, Any]:
    """What a study records and compares on resume: the caller's settings, the space, the objective."""
    return {**settings, "space": space_signature(space), "objective": list(objective.names)}


def settings_differences(stored: Any, wanted: dict[str, Any]) -> list[str]:
    """`key: stored -> wanted` for every setting that differs (a key on one side only included)."""
    return _differences(stored if isinstance(stored, dict) else {}, wanted, "")


def _differences(stored: dict[str, Any], wanted: dict[str, Any], prefix: str) -> list[str]:
    out = []
    for key in sorted(set(stored) | set(wanted)):
        a, b = stored.get(key, "(unset)"), wanted.get(key, "(unset)")
        if isinstance(a, dict) and isinstance(b, dict):
            out += _differences(a, b, f"{prefix}{key}.")
        elif a != b:
            out.append(f"{prefix}{key}: {a} -> {b}")
    return out


def study_settings_differences(storage: str | optuna.storages.BaseStorage | None, name: str,
                               settings: dict[str, Any]) -> list[str] | None:
    """None when no study `name` with trials exists in `storage`; else the settings differences."""
    store = storage if isinstance(storage, optuna.storages.BaseStorage) else open_storage(storage)
    try:
        study = optuna.load_study(study_name=name, storage=store)
    except KeyError:
        return None
    if not study.get_trials(deepcopy=False):
        return None
    return settings_differences(study.user_attrs.get(SETTINGS_ATTR), settings)


def free_study_name(storage: str | optuna.storages.BaseStorage | None, name: str) -> str:
    """`name-2`, `name-3`, ...: the first name no study in `storage` uses."""
    store = storage if isinstance(storage, optuna.storages.BaseStorage) else open_storage(storage)
    taken = set(optuna.get_all_study_names(store))
    n = 2
    while f"{name}-{n}" in taken:
        n += 1
    return f"{name}-{n}"


class _AskTellGridSampler(GridSampler):
    """GridSampler without its `study.stop()` call, which only works inside `optimize()`."""

    def after_trial(self, study: optuna.Study, trial: FrozenTrial, state: TrialState,
                    values: Sequence[float] | None) -> None:
        return None


def make_sampler(name: str, space: SearchSpace, *, seed: int | None = None,
                 n_startup_trials: int = DEFAULT_STARTUP_TRIALS) -> BaseSampler:
    """A seeded optuna sampler by name (tpe | random | grid).

    TPE: multivariate (the knobs interact: router x chunk size x CPU buffer), `group=True` so a
    conditional dimension (a parameter only some trials have) gets its own joint model instead of
    falling back to independent sampling, `constant_liar=True` so agents sharing a study (a
    PostgreSQL storage) treat each other's trials in flight as bad and do not all probe the same
    point (no effect on a single sequential tuner). `consider_endpoints` is deprecated since
    optuna 4.9 and left at its default.
    """
    if name == "tpe":
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
            return TPESampler(seed=seed, multivariate=True, group=True, constant_liar=True,
                              n_startup_trials=n_startup_trials)
    if name == "random":
        return RandomSampler(seed=seed)
    if name == "grid":
        return _AskTellGridSampler({k: list(v) for k, v in space.grid().items()}, seed=seed)
    raise ValueError(f"sampler: invalid value {name!r}; valid choices: {', '.join(SAMPLERS)}")


def open_storage(url: str | None) -> optuna.storages.BaseStorage:
    """An optuna storage for `url` (None -> in memory). Errors name the URL."""
    if url is None:
        return optuna.storages.InMemoryStorage()
    try:
        return optuna.storages.RDBStorage(url)
    except Exception as exc:  # sqlalchemy raises many types; the message matters
        raise ValueError(f"cannot open optuna storage {redact_url(url)!r}: {one_line(exc)}") from exc


class OptunaTuner:
    """A `Tuner` over one optuna study, in memory unless `storage` names a database (a URL or an
    optuna storage): nothing is written to disk that the caller did not ask for."""

    def __init__(self, space: SearchSpace, objective: ObjectiveSpec | None = None, *,
                 storage: str | optuna.storages.BaseStorage | None = None,
                 study_name: str = "tierpilot", sampler: str = "tpe", seed: int | None = None,
                 owner: str = "tierpilot", n_startup_trials: int = DEFAULT_STARTUP_TRIALS,
                 settings: dict[str, Any] | None = None) -> None:
        self.space = space
        objective = objective or ObjectiveSpec()
        self.objective = objective
        self.owner = owner
        self.sampler_name = sampler
        store = storage if isinstance(storage, optuna.storages.BaseStorage) else open_storage(storage)
        self.study = optuna.create_study(
            storage=store, study_name=study_name, load_if_exists=True,
            sampler=make_sampler(sampler, space, seed=seed, n_startup_trials=n_startup_trials),
            directions=list(objective.directions))
        existing = tuple(d.name.lower() for d in self.study.directions)
        if existing != objective.directions:
            raise ValueError(f"study {study_name!r} exists with directions {existing}, "
                             f"but this objective needs {objective.directions}; use another --study")
        if settings is not None:
            wanted = study_settings(settings, space, objective)
            if self.study.get_trials(deepcopy=False):
                diffs = settings_differences(self.study.user_attrs.get(SETTINGS_ATTR), wanted)
                if diffs:
                    raise StudySettingsError(
                        f"study {study_name!r} was run with other settings ({'; '.join(diffs)}); "
                        f"it is not resumed. Pass --new-study to start a new study (this one is kept), "
                        f"or --study NAME")
            self.study.set_user_attr(SETTINGS_ATTR, wanted)
        self.study.set_user_attr("objective", {"metric": objective.metric, "names": list(objective.names)})
        self._distributions = space.distributions()
        self._open: dict[int, optuna.Trial] = {}

    @property
    def study_name(self) -> str:
        return self.study.study_name

    # -- ask/tell ----------------------------------------------------------------------------
    def ask(self) -> Candidate:
        trial = self.study.ask(self._distributions)
        try:
            knobs = self.space.to_knobs(trial.params)
        except CandidateError as exc:  # an enqueued point outside the space
            self.study.tell(trial, state=TrialState.FAIL)
            raise CandidateError(f"trial {trial.number}: {exc}") from None
        for key, value in self.space.constraints(knobs).items():
            trial.set_constraint(key, value)
        trial.set_user_attr("candidate", {"knobs": knobs.to_dict(), "owner": self.owner})
        source = trial.user_attrs.get("source", "sampler")
        self._open[trial.number] = trial
        return Candidate(trial.number, knobs, dict(trial.params), source)

    def tell(self, candidate: Candidate, evaluation: Evaluation, *, rolled_back: bool = False) -> TrialRecord:
        values = self.objective.values(evaluation)
        self._set_attrs(candidate.number, {"evaluation": evaluation.attrs(),
                                           "outcome": "rolled_back" if rolled_back else "complete"})
        frozen = self.study.tell(candidate.number, list(values))
        self._open.pop(candidate.number, None)
        return self._record(frozen)

    def fail(self, candidate: Candidate, reason: str, *, state: str = "failed") -> TrialRecord:
        self._set_attrs(candidate.number, {"outcome": state, "failure": reason})
        frozen = self.study.tell(candidate.number, state=TrialState.FAIL)
        self._open.pop(candidate.number, None)
        return self._record(frozen)

    def enqueue(self, knobs: Knobs, *, source: str, again: bool = False) -> None:
        params = self.space.to_params(knobs)
        for dim in self.space.dimensions:
            if not dim.contains(params[dim.name]):
                raise CandidateError(f"cannot enqueue {source} candidate: {dim.name}={params[dim.name]!r} "
                                     f"is not {dim.describe()}")
        self.study.enqueue_trial(params, user_attrs={"source": source}, skip_if_exists=not again)

    def record(self, knobs: Knobs, evaluation: Evaluation, *, source: str) -> TrialRecord | None:
        """Add a configuration measured outside ask/tell (e.g. the baseline) as a finished trial.
        Returns None (and records nothing) if `knobs` lies outside the space's distributions."""
        params = self.space.to_params(knobs)
        if not all(d.contains(params[d.name]) for d in self.space.dimensions):
            log_event("record_skipped", logger=log, study=self.study_name, source=source,
                      reason="outside the search space")
            return None
        trial = optuna.trial.create_trial(
            params=params, distributions=self._distributions, values=list(self.objective.values(evaluation)),
            user_attrs={"evaluation": evaluation.attrs(), "outcome": "complete", "source": source,
                        "candidate": {"knobs": knobs.to_dict(), "owner": self.owner}})
        self.study.add_trial(trial)
        return self._record(self.study.get_trials(deepcopy=False)[-1])

    def exhausted(self) -> bool:
        """True when a grid sampler has visited every grid point."""
        sampler = self.study.sampler
        return isinstance(sampler, GridSampler) and sampler.is_exhausted(self.study)

    # -- crash safety, last good -------------------------------------------------------------
    def resume(self, *, adopt: bool = False) -> list[int]:
        """Fail this owner's trials left RUNNING by a crash. Returns their numbers.

        `adopt` (a new Lease holder: the previous one stopped acting before the Lease could move)
        also takes over the trials other owners left RUNNING: each is failed and its candidate
        enqueued again, so the new leader measures it and no trial is lost."""
        orphans = [t for t in self.study.get_trials(deepcopy=False, states=(TrialState.RUNNING,))
                   if adopt or (t.user_attrs.get("candidate") or {}).get("owner", self.owner) == self.owner]
        for t in orphans:
            owner = (t.user_attrs.get("candidate") or {}).get("owner", self.owner)
            mine = owner == self.owner
            reason = "in flight when the agent restarted" if mine else f"in flight when {owner} lost the Lease"
            self._set_attrs(t.number, {"outcome": "failed", "failure": reason})
            self.study.tell(t.number, state=TrialState.FAIL, skip_if_finished=True)
            if not mine and set(t.params) == set(self._distributions):
                self.study.enqueue_trial(dict(t.params), user_attrs={"source": "adopted", "adopted_from": t.number},
                                         skip_if_exists=False)
            log_event("trial_orphaned", level=logging.WARNING, logger=log, study=self.study_name,
                      trial=t.number, owner=owner, requeued=not mine)
        return [t.number for t in orphans]

    def set_last_good(self, knobs: Knobs, *, trial: int | None = None, value: float | None = None) -> None:
        self.study.set_user_attr(LAST_GOOD_ATTR, {"knobs": knobs.to_dict(), "trial": trial, "value": value})

    def last_good(self) -> Knobs | None:
        data = self.study.user_attrs.get(LAST_GOOD_ATTR)
        if not data:
            return None
        return Knobs.from_mapping(data["knobs"], source=f"study {self.study_name} last_good")

    def last_good_value(self) -> float | None:
        data = self.study.user_attrs.get(LAST_GOOD_ATTR) or {}
        return data.get("value")

    # -- reporting ---------------------------------------------------------------------------
    def trials(self) -> list[TrialRecord]:
        return [self._record(t) for t in self.study.get_trials(deepcopy=False)]

    def best(self) -> TrialRecord | None:
        done = [t for t in self.trials() if t.state in ("complete", "rolled_back") and t.feasible]
        if not done:
            return None
        if self.objective.multi:
            return min(done, key=lambda t: (t.values or (math.inf,))[0])
        return min(done, key=self.rank)

    def rank(self, record: TrialRecord) -> tuple[float, ...]:
        """Order of finished trials: objective, then hit ratio, then memory (single-objective)."""
        values = record.values or (math.inf,)
        return self.objective.sort_key(values[0], record.attrs.get("evaluation"))

    def pareto_front(self) -> list[TrialRecord]:
        if not self.objective.multi:
            best = self.best()
            return [best] if best else []
        try:
            front = self.study.best_trials
        except ValueError:
            return []
        return sorted((self._record(t) for t in front), key=lambda r: r.values or ())

    # -- helpers -----------------------------------------------------------------------------
    def _trial(self, number: int) -> optuna.Trial:
        """The live handle of an unfinished trial (asked here, or found in storage)."""
        if number in self._open:
            return self._open[number]
        frozen = next((t for t in self.study.get_trials(deepcopy=False) if t.number == number), None)
        if frozen is None:
            raise KeyError(f"study {self.study_name!r} has no trial {number}")
        # optuna has no public "trial handle by number"; FrozenTrial._trial_id is the storage key.
        return optuna.Trial(self.study, frozen._trial_id)

    def _set_attrs(self, number: int, attrs: dict[str, Any]) -> None:
        trial = self._trial(number)
        for key, value in attrs.items():
            trial.set_user_attr(key, value)

    def _record(self, t: FrozenTrial) -> TrialRecord:
        if t.state == TrialState.RUNNING or t.state == TrialState.WAITING:
            state = "running"
        else:
            state = str(t.user_attrs.get("outcome", "complete" if t.state == TrialState.COMPLETE else "failed"))
        knobs_dict = (t.user_attrs.get("candidate") or {}).get("knobs")
        knobs = Knobs.from_mapping(knobs_dict) if knobs_dict else self.space.to_knobs(t.params)
        feasible = all(v <= 0.0 for v in t.constraints.values())
        return TrialRecord(t.number, knobs, state, tuple(t.values) if t.values else None,
                           dict(t.user_attrs), feasible)
