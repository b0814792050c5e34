"""Twin searches in parallel: several processes run trials of one optuna study that lives in an
RDB storage (PostgreSQL; SQLite works for a couple of workers but serialises writes).

    result = parallel_tune(WorkloadSpec(preset="sessions", max_requests=3000), ClusterArgs({"pods": 4}),
                           limits, storage="postgresql+psycopg2://tierpilot@db/optuna",
                           study="tune-sessions", trials=64, workers=4)

How the work is shared, and why (bench/parallel_tune.py measured each part):
- The calling process is worker 0 and starts asking at once; workers 1..N-1 are helper processes.
  A helper's start-up (interpreter, imports, workload, the storage engine) costs about as much as
  several light trials, so the caller's trials overlap it instead of waiting for it.
- The budget is one shared counter (`TrialBudget`), not a fixed split: each worker takes a trial
  from it before asking, so a helper that starts late or draws slow trials runs fewer, and no
  worker idles while another still has a queue.
- Helpers are forked from a forkserver that has the optuna/SQLAlchemy/alembic stack preloaded
  (spawned fresh, each helper re-imported it: about 1 s of CPU per helper). polars is not
  preloaded: it starts threads at import, and forking a threaded polars can deadlock.
- `TunePool` keeps the helpers (and their workload and storage engines) up across searches, for
  callers that run several (the benchmark; a controller re-tuning on the twin); `parallel_tune`
  without a pool starts one for the search and stops it after.
- Every sampler reads every finished trial from the storage (optuna's `_CachedStorage` fetches
  only trials that are new or were unfinished at its last read), so the search is one search;
  TPE's `constant_liar` keeps workers off each other's running points. Each worker keeps its own
  `EvaluationCache` for the search (a repeat of its own trial is not replayed).
Pods work the same way: run `tierpilot tune --storage <the same URL> --study <the same name>` in
each (see docs/tuner.md).

What this buys is throughput: on C free cores up to min(workers, C) trials at once. What it
costs: a worker proposes without the results of the trials still running elsewhere, so at one
trial budget the parallel search may be slightly less sample-efficient than a serial one.
"""
from __future__ import annotations

import dataclasses
import math
import multiprocessing
import queue
import threading
import time
from pathlib import Path
from typing import Any, Self

from tuners.base import TrialRecord
from tuners.objective import ObjectiveSpec
from tuners.space import SearchSpace
from tuners.space.limits import CandidateError, DeploymentLimits

# Imported once in the forkserver, inherited by every helper it forks. Thread-free at import
# except numpy's BLAS pool, which re-initialises after fork; never polars (see the docstring).
PRELOAD = ("optuna", "optuna.storages._rdb.models", "alembic.command", "alembic.config", "alembic.migration",
           "psycopg2.extras", "sqlalchemy.dialects.postgresql.psycopg2", "sqlalchemy.dialects.sqlite.pysqlite")
START_METHODS = ("forkserver", "spawn")
READY_TIMEOUT_S = 300.0


@dataclasses.dataclass(frozen=True)
class WorkloadSpec:
    """How a worker rebuilds the workload (tuners.offline.load_workload's arguments)."""

    trace: Path | None = None
    preset: str | None = None
    seed: int = 0
    max_requests: int | None = None
    duration_s: float | None = None

    def load(self) -> Any:
        from tuners.offline import load_workload

        return load_workload(trace=self.trace, preset=self.preset, seed=self.seed,
                             max_requests=self.max_requests, duration_s=self.duration_s)


@dataclasses.dataclass(frozen=True)
class ClusterArgs:
    """simulator.cluster.ClusterSpec keyword arguments (picklable)."""

    kwargs: dict[str, Any] = dataclasses.field(default_factory=dict)

    def build(self) -> Any:
        from simulator.cluster import ClusterSpec

        return ClusterSpec(**self.kwargs)


@dataclasses.dataclass(frozen=True)
class SearchTask:
    """One search, as every worker runs it."""

    storage: str
    study: str
    objective: ObjectiveSpec
    sampler: str = "tpe"
    seed: int | None = 0


@dataclasses.dataclass(frozen=True)
class WorkerReport:
    worker: int
    trials: int
    replay_seconds: float  # in the twin
    storage_seconds: float  # in ask/tell/fail: the sampler and the storage round trips
    wall_seconds: float  # from this search's start (for worker 0: the caller's) to this worker's end
    startup_seconds: float = 0.0  # before the worker's first ask: imports, workload, twin, study
    replays: int = 0
    cpu_seconds: float = 0.0  # this process's CPU time over its part of the search


@dataclasses.dataclass(frozen=True)
class ParallelResult:
    best: TrialRecord | None
    trials: int  # finished trials in the study after the run
    workers: tuple[WorkerReport, ...]
    wall_seconds: float
    errors: tuple[str, ...] = ()  # helpers that failed; their trials were run by the others


class TrialBudget:
    """A trial counter shared by processes: `take()` is True while the search has trials left."""

    def __init__(self, ctx: Any) -> None:
        self._taken = ctx.Value("q", 0)
        self._limit = ctx.Value("q", 0, lock=False)

    def reset(self, limit: int) -> None:
        with self._taken.get_lock():
            self._taken.value = 0
            self._limit.value = limit

    def take(self) -> bool:
        with self._taken.get_lock():
            if self._taken.value >= self._limit.value:
                return False
            self._taken.value += 1
            return True

    @property
    def taken(self) -> int:
        return int(self._taken.value)


class _TimedTuner:
    """Passes through to a tuner, adding up the seconds spent in ask/tell/fail."""

    def __init__(self, tuner: Any) -> None:
        self._tuner = tuner
        self.seconds = 0.0

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self._tuner, name)
        if name not in ("ask", "tell", "fail"):
            return attr

        def timed(*args: Any, **kwargs: Any) -> Any:
            t0 = time.perf_counter()
            try:
                return attr(*args, **kwargs)
            finally:
                self.seconds += time.perf_counter() - t0
        return timed


class _Worker:
    """One worker's lasting state: the workload, the cluster and one storage engine per URL."""

    def __init__(self, index: int, frame: Any, cluster: Any, limits: DeploymentLimits) -> None:
        self.index, self.frame, self.cluster, self.limits = index, frame, cluster, limits
        self._storages: dict[str, Any] = {}

    def storage(self, url: str) -> Any:
        from tuners.optuna_tuner import open_storage

        if url not in self._storages:
            self._storages[url] = open_storage(url)
        return self._storages[url]

    def search(self, task: SearchTask, budget: TrialBudget, started: float) -> WorkerReport:
        """Ask/evaluate/tell while the shared budget lasts. `started`: the search's start
        (time.time()), so the report's wall time spans the whole search from the caller's view."""
        import optuna

        from tuners.evaluators import EvaluationCache, TwinEvaluator, run_trials
        from tuners.optuna_tuner import OptunaTuner

        cpu0 = time.process_time()
        optuna.logging.set_verbosity(optuna.logging.WARNING)
        seed = None if task.seed is None else task.seed * 1009 + self.index
        tuner = _TimedTuner(OptunaTuner(SearchSpace.from_limits(self.limits), task.objective,
                                        storage=self.storage(task.storage), study_name=task.study,
                                        sampler=task.sampler, seed=seed, owner=f"tune-worker-{self.index}"))
        evaluator = TwinEvaluator(self.frame, self.cluster, self.limits, cache=EvaluationCache())
        ready = time.time()
        trials = 0
        while not tuner.exhausted() and budget.take():
            trials += len(run_trials(tuner, evaluator, 1))
        return WorkerReport(self.index, trials, evaluator.replay_seconds, tuner.seconds, time.time() - started,
                            ready - started, evaluator.replays, time.process_time() - cpu0)


def _helper_main(index: int, workload: WorkloadSpec, cluster: ClusterArgs, limits: DeploymentLimits,
                 budget: TrialBudget, inbox: Any, outbox: Any) -> None:
    """A helper process: build once, report ready, then run each search task until None."""
    from tuners.storage_errors import one_line

    try:
        worker = _Worker(index, workload.load(), cluster.build(), limits)
    except Exception as exc:  # noqa: BLE001 - reported to the caller as one line
        outbox.put((index, "error", f"start-up: {one_line(exc)}"))
        return
    outbox.put((index, "ready", None))
    parent = multiprocessing.parent_process()
    while True:
        try:
            item = inbox.get(timeout=1.0)
        except queue.Empty:
            if parent is not None and not parent.is_alive():
                return  # the caller died without closing the pool: do not linger
            continue
        if item is None:
            return
        task, started = item
        try:
            outbox.put((index, "done", worker.search(task, budget, started)))
        except Exception as exc:  # noqa: BLE001
            outbox.put((index, "error", one_line(exc)))


class TunePool:
    """Worker 0 (this process) plus `workers - 1` helper processes for one workload and cluster;
    runs searches one after another. Use as a context manager (helpers stop on exit).

    `frame`: the workload already loaded here (else worker 0 loads `workload` itself)."""

    def __init__(self, workload: WorkloadSpec, cluster: ClusterArgs, limits: DeploymentLimits, *, workers: int,
                 frame: Any = None, start_method: str = "forkserver") -> None:
        if workers < 1:
            raise ValueError(f"workers must be >= 1, got {workers}")
        if start_method not in START_METHODS:
            raise ValueError(f"start_method: invalid value {start_method!r}; valid: {', '.join(START_METHODS)}")
        self.workers = workers
        ctx = multiprocessing.get_context(start_method)
        if start_method == "forkserver":
            ctx.set_forkserver_preload(list(PRELOAD))  # no effect once this process's forkserver runs
        self.budget = TrialBudget(ctx)
        self._outbox = ctx.Queue()
        self._inboxes = [ctx.Queue() for _ in range(workers - 1)]
        self._helpers = [ctx.Process(target=_helper_main, name=f"tune-worker-{i + 1}", daemon=True,
                                     args=(i + 1, workload, cluster, limits, self.budget, self._inboxes[i],
                                           self._outbox))
                         for i in range(workers - 1)]
        # Process.start() blocks until the forkserver has preloaded (~1 s) and forked: start the
        # helpers from a thread, so worker 0 runs trials meanwhile.
        self._starter = threading.Thread(target=self._start_helpers, name="tune-pool-start", daemon=True)
        self._starter.start()
        self._ready: set[int] = set()
        self.errors: dict[int, str] = {}
        try:
            self._local = _Worker(0, frame if frame is not None else workload.load(), cluster.build(), limits)
        except BaseException:
            self.close()
            raise

    def _start_helpers(self) -> None:
        for i, p in enumerate(self._helpers, start=1):
            try:
                p.start()
            except Exception as exc:  # noqa: BLE001 - e.g. out of processes: the others carry on
                self._outbox.put((i, "error", f"cannot start: {type(exc).__name__}: {exc}"))

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def storage(self, url: str) -> Any:
        """Worker 0's storage for `url` (one engine per URL for the pool's life)."""
        return self._local.storage(url)

    def wait_ready(self, timeout: float = READY_TIMEOUT_S) -> None:
        """Block until every helper has started (or failed); a search does not need this."""
        self._collect(set(range(1, self.workers)) - set(self.errors), {"ready"}, timeout)

    def search(self, task: SearchTask, trials: int) -> list[WorkerReport]:
        """Run `trials` trials of `task` on every live worker; the reports, worker 0 first."""
        started = time.time()
        self.budget.reset(trials)
        live = [i for i in range(1, self.workers) if i not in self.errors]
        for i in live:
            self._inboxes[i - 1].put((task, started))
        try:
            reports = [self._local.search(task, self.budget, started)]
        except BaseException:
            self.budget.reset(0)  # the helpers stop after the trial they have in flight
            self._collect(set(live), {"done"}, READY_TIMEOUT_S)
            raise
        done = self._collect(set(live), {"done"}, None)  # a live helper is waited for; a dead one is not
        return reports + [done[i] for i in sorted(done)]

    def _collect(self, pending: set[int], kinds: set[str], timeout: float | None) -> dict[int, Any]:
        """Wait for one message of `kinds` from each helper in `pending`; helpers that fail, exit
        or (with a `timeout`) stay silent are recorded in `errors` and dropped."""
        out: dict[int, Any] = {}
        deadline = math.inf if timeout is None else time.monotonic() + timeout
        while pending - set(self.errors):
            try:
                index, kind, payload = self._outbox.get(timeout=0.2)
            except queue.Empty:
                for i in pending - set(self.errors):
                    code = self._helpers[i - 1].exitcode
                    if code is not None:
                        self.errors[i] = f"exited with code {code}"
                if time.monotonic() > deadline:
                    for i in pending - set(self.errors):
                        self.errors[i] = f"no answer within {timeout:.0f} s"
                continue
            if kind == "ready":
                self._ready.add(index)
            if kind == "error":
                self.errors[index] = payload
                pending.discard(index)
            elif kind in kinds:
                out[index] = payload
                pending.discard(index)
        return out

    def close(self) -> None:
        self._starter.join()
        for box in self._inboxes:
            box.put(None)
        for p in self._helpers:
            if p.pid is None:  # never started
                continue
            p.join(timeout=5)
            if p.is_alive():
                p.terminate()
                p.join(timeout=5)


def parallel_tune(workload: WorkloadSpec, cluster: ClusterArgs, limits: DeploymentLimits, *, storage: str,
                  study: str, trials: int, workers: int, objective: ObjectiveSpec | None = None,
                  sampler: str = "tpe", seed: int | None = 0, enqueue_defaults: bool = True,
                  settings: dict[str, Any] | None = None, frame: Any = None, pool: TunePool | None = None,
                  start_method: str = "forkserver") -> ParallelResult:
    """Run `trials` twin trials of `study` in `storage` on `workers` processes (this one and
    `workers - 1` helpers; `pool`: reuse a running TunePool, whose size wins). `settings`: recorded
    on the study (see OptunaTuner). `frame`: the workload already loaded in this process."""
    from tuners.offline import DEFAULTS
    from tuners.optuna_tuner import OptunaTuner

    objective = objective or ObjectiveSpec()
    if "://" not in storage or storage.startswith("sqlite:///:memory:"):
        raise ValueError(f"parallel workers need a shared RDB storage URL, got {storage!r}")
    if trials < 0:
        raise ValueError(f"trials must be >= 0, got {trials}")
    start = time.perf_counter()
    space = SearchSpace.from_limits(limits)
    own = pool is None
    if pool is None:  # helpers start now and import while the study is prepared below
        pool = TunePool(workload, cluster, limits, workers=workers, frame=frame, start_method=start_method)
    try:
        parent = OptunaTuner(space, objective, storage=pool.storage(storage), study_name=study, sampler=sampler, seed=seed,
                             owner="tune-parent", settings=settings)
        if enqueue_defaults and not parent.trials():
            try:
                parent.enqueue(space.validate(DEFAULTS), source="defaults")
            except CandidateError:
                pass
        reports = pool.search(SearchTask(storage, study, objective, sampler, seed), trials)
        errors = tuple(f"tune worker {i}: {msg}" for i, msg in sorted(pool.errors.items()))
    finally:
        if own:
            pool.close()
    finished = [t for t in parent.trials() if t.state != "running"]
    return ParallelResult(parent.best(), len(finished), tuple(reports), time.perf_counter() - start, errors)
