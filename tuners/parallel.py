"""Twin searches in parallel: several worker processes run trials of one optuna study that lives
in an RDB storage (PostgreSQL; SQLite works for a couple of workers but serialises writes).

    result = parallel_tune(WorkloadSpec(preset="sessions", max_requests=3000), ClusterArgs(pods=4),
                           limits, storage="postgresql+psycopg2://tierpilot@db/optuna",
                           study="tune-sessions", trials=64, workers=4)

The parent creates the study and enqueues the defaults once, then splits the trial budget over
`workers` processes (spawned: no forked database connections). Each worker builds the workload
and the twin itself (nothing large is pickled), opens the same study with its own sampler seed,
and asks/evaluates/tells until its share is done; the sampler in every worker reads every
finished trial from the storage, so the search is one search. Workers can equally be pods: run
`tierpilot tune --storage <the same URL> --study <the same name>` in each (see docs/tuner.md).

What this buys is throughput: on C cores up to min(workers, C) trials at once. What it costs: a
worker proposes without the results of the trials still running elsewhere, so at one trial
budget the parallel search may be slightly less sample-efficient than a serial one
(bench/parallel_tune.py measures both: the speed-up and the best values' distribution).
"""
from __future__ import annotations

import dataclasses
import multiprocessing
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

from tuners.base import TrialRecord
from tuners.objective import ObjectiveSpec
from tuners.space import CandidateError, DeploymentLimits, SearchSpace


@dataclasses.dataclass(frozen=True)
class WorkloadSpec:
    """How a worker rebuilds the workload (tuners.offline.load_workload's arguments)."""

    trace: Path | None = None
    preset: str | None = None
    seed: int = 0
    max_requests: int | None = None
    duration_s: float | None = None


@dataclasses.dataclass(frozen=True)
class ClusterArgs:
    """simulator.cluster.ClusterSpec keyword arguments (picklable)."""

    kwargs: dict[str, Any] = dataclasses.field(default_factory=dict)

    def build(self) -> Any:
        from simulator.cluster import ClusterSpec

        return ClusterSpec(**self.kwargs)


@dataclasses.dataclass(frozen=True)
class WorkerReport:
    worker: int
    trials: int
    replay_seconds: float
    wall_seconds: float


@dataclasses.dataclass(frozen=True)
class ParallelResult:
    best: TrialRecord | None
    trials: int  # finished trials in the study after the run
    workers: tuple[WorkerReport, ...]
    wall_seconds: float


def split_budget(trials: int, workers: int) -> list[int]:
    """`trials` over `workers` as evenly as possible (earlier workers take the remainder)."""
    if trials < 0 or workers < 1:
        raise ValueError("trials must be >= 0 and workers >= 1")
    base, extra = divmod(trials, workers)
    return [base + (1 if i < extra else 0) for i in range(workers)]


def _worker(index: int, n_trials: int, workload: WorkloadSpec, cluster: ClusterArgs, limits: DeploymentLimits,
            storage: str, study: str, objective: ObjectiveSpec, sampler: str, seed: int | None) -> WorkerReport:
    import optuna

    from tuners.evaluators import EvaluationCache, TwinEvaluator, run_trials
    from tuners.offline import load_workload
    from tuners.optuna_tuner import OptunaTuner

    start = time.perf_counter()
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    frame = load_workload(trace=workload.trace, preset=workload.preset, seed=workload.seed,
                          max_requests=workload.max_requests, duration_s=workload.duration_s)
    space = SearchSpace.from_limits(limits)
    worker_seed = None if seed is None else seed * 1009 + index
    tuner = OptunaTuner(space, objective, storage=storage, study_name=study, sampler=sampler, seed=worker_seed,
                        owner=f"tune-worker-{index}")
    evaluator = TwinEvaluator(frame, cluster.build(), limits, cache=EvaluationCache())
    records = run_trials(tuner, evaluator, n_trials)
    return WorkerReport(index, len(records), evaluator.replay_seconds, time.perf_counter() - start)


def parallel_tune(workload: WorkloadSpec, cluster: ClusterArgs, limits: DeploymentLimits, *, storage: str,
                  study: str, trials: int, workers: int, objective: ObjectiveSpec | None = None,
                  sampler: str = "tpe", seed: int | None = 0, enqueue_defaults: bool = True,
                  in_process: bool = False, settings: dict[str, Any] | None = None) -> ParallelResult:
    """Run `trials` twin trials of `study` in `storage` on `workers` processes (`in_process` with
    one worker: in this process, without a spawn). `settings`: recorded on the study (see
    OptunaTuner)."""
    from tuners.offline import DEFAULTS
    from tuners.optuna_tuner import OptunaTuner

    objective = objective or ObjectiveSpec()
    if "://" not in storage or storage.startswith("sqlite:///:memory:"):
        raise ValueError(f"parallel workers need a shared RDB storage URL, got {storage!r}")
    start = time.perf_counter()
    space = SearchSpace.from_limits(limits)
    parent = OptunaTuner(space, objective, storage=storage, study_name=study, sampler=sampler, seed=seed,
                         owner="tune-parent", settings=settings)
    if enqueue_defaults and not parent.trials():
        try:
            parent.enqueue(space.validate(DEFAULTS), source="defaults")
        except CandidateError:
            pass
    shares = split_budget(trials, workers)
    if workers == 1 and in_process:
        reports = [_worker(0, shares[0], workload, cluster, limits, storage, study, objective, sampler, seed)]
    else:
        ctx = multiprocessing.get_context("spawn")
        with ProcessPoolExecutor(max_workers=workers, mp_context=ctx) as pool:
            futures = [pool.submit(_worker, i, n, workload, cluster, limits, storage, study, objective, sampler,
                                   seed) for i, n in enumerate(shares) if n > 0]
            reports = [f.result() for f in futures]
    done = OptunaTuner(space, objective, storage=storage, study_name=study, sampler=sampler, owner="tune-parent")
    finished = [t for t in done.trials() if t.state != "running"]
    return ParallelResult(done.best(), len(finished), tuple(reports), time.perf_counter() - start)
