"""Twin searches in parallel on one optuna study in a real PostgreSQL: this process and helper
processes share one trial budget, every trial lands once, the defaults are tried once, the best is
the study's, a pool serves several searches, and a helper that cannot start costs no trial."""
from __future__ import annotations

import threading

import pytest

from tests.support.postgres import postgres_url  # noqa: F401
from tuners.objective import ObjectiveSpec
from tuners.optuna_tuner import OptunaTuner
from tuners.parallel import ClusterArgs, SearchTask, TrialBudget, TunePool, WorkloadSpec, parallel_tune
from tuners.space import DeploymentLimits, SearchSpace

LIMITS = DeploymentLimits(pods=2, l2_backend="twin")
WORKLOAD = WorkloadSpec(preset="sessions", max_requests=600)


def _study(url: str, name: str) -> OptunaTuner:
    return OptunaTuner(SearchSpace.from_limits(LIMITS), ObjectiveSpec(), storage=url, study_name=name)


def test_trial_budget_hands_out_exactly_its_limit_under_contention():
    import multiprocessing

    budget = TrialBudget(multiprocessing.get_context("spawn"))
    budget.reset(500)
    taken = [0] * 4

    def take(i: int) -> None:
        while budget.take():
            taken[i] += 1

    threads = [threading.Thread(target=take, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sum(taken) == budget.taken == 500
    budget.reset(3)
    assert [budget.take() for _ in range(5)] == [True, True, True, False, False]


def test_workers_share_one_study_on_postgres(postgres_url):  # noqa: F811
    with TunePool(WORKLOAD, ClusterArgs({"pods": 2}), LIMITS, workers=2) as pool:
        pool.wait_ready()  # so both start together and both run trials
        result = parallel_tune(WORKLOAD, ClusterArgs({"pods": 2}), LIMITS, storage=postgres_url, study="par",
                               trials=16, workers=2, seed=3, pool=pool)
        assert result.errors == ()
        assert sorted(r.worker for r in result.workers) == [0, 1]
        assert sum(r.trials for r in result.workers) == 16
        trials = _study(postgres_url, "par").trials()
        assert result.trials == len(trials) == 16
        assert len({t.number for t in trials}) == 16
        owners = {t.attrs.get("candidate", {}).get("owner") for t in trials}
        assert owners == {"tune-worker-0", "tune-worker-1"}  # this process and the helper ran trials
        assert sum(t.attrs.get("source") == "defaults" for t in trials) == 1
        values = [t.value for t in trials if t.state == "complete" and t.feasible and t.value is not None]
        assert result.best is not None and result.best.value == min(values)
        # the same pool runs a second search; its budget is counted afresh
        again = parallel_tune(WORKLOAD, ClusterArgs({"pods": 2}), LIMITS, storage=postgres_url, study="par-2",
                              trials=5, workers=2, seed=4, pool=pool)
        assert again.trials == 5 and sum(r.trials for r in again.workers) == 5
    # resuming (here with one worker: this process only) adds to the same study
    more = parallel_tune(WORKLOAD, ClusterArgs({"pods": 2}), LIMITS, storage=postgres_url, study="par",
                         trials=3, workers=1, seed=4)
    assert more.trials == 19
    assert [r.worker for r in more.workers] == [0]


def test_a_helper_that_cannot_start_costs_no_trial(postgres_url, tmp_path):  # noqa: F811
    missing = WorkloadSpec(trace=tmp_path / "gone.jsonl")  # the helpers cannot load it
    frame = WORKLOAD.load()  # this process already has the workload
    result = parallel_tune(missing, ClusterArgs({"pods": 2}), LIMITS, storage=postgres_url, study="lonely",
                           trials=4, workers=2, seed=0, frame=frame)
    assert result.trials == 4
    assert [(r.worker, r.trials) for r in result.workers] == [(0, 4)]
    assert len(result.errors) == 1
    assert result.errors[0].startswith("tune worker 1: start-up:") and "gone.jsonl" in result.errors[0]
    assert "\n" not in result.errors[0]


def test_pool_search_reports_where_the_time_went(postgres_url):  # noqa: F811
    with TunePool(WORKLOAD, ClusterArgs({"pods": 2}), LIMITS, workers=1) as pool:
        _study(postgres_url, "timed")
        (report,) = pool.search(SearchTask(postgres_url, "timed", ObjectiveSpec(), seed=1), 3)
    assert report.trials == report.replays == 3
    assert report.replay_seconds > 0 and report.storage_seconds > 0
    assert report.wall_seconds >= report.replay_seconds + report.storage_seconds
    assert 0 < report.cpu_seconds <= report.wall_seconds + 0.05


def test_needs_a_shared_storage():
    with pytest.raises(ValueError, match="shared RDB storage"):
        parallel_tune(WorkloadSpec(preset="sessions"), ClusterArgs(), LIMITS, storage="memory", study="x",
                      trials=2, workers=2)
    with pytest.raises(ValueError, match="start_method"):
        TunePool(WORKLOAD, ClusterArgs(), LIMITS, workers=1, start_method="fork")


def test_workload_spec_loads_what_load_workload_loads():
    assert WORKLOAD.load().height == 600
    with pytest.raises(ValueError, match="exactly one"):
        WorkloadSpec().load()


def test_tune_command_with_workers(postgres_url, tmp_path):  # noqa: F811
    import yaml
    from click.testing import CliRunner

    from agent.cli import main

    out = tmp_path / "best.yaml"
    result = CliRunner().invoke(main, ["tune", "--workload", "sessions", "--max-requests", "300", "--trials", "6",
                                       "--workers", "2", "--storage", postgres_url, "--study", "cli", "--pods", "2",
                                       "-q", "--out", str(out)])
    assert result.exit_code == 0, result.output
    assert "6 trials on 2 workers" in result.output and "study now holds 6 trials" in result.output
    assert "worker 0:" in result.output and "worker 1:" in result.output
    assert yaml.safe_load(out.read_text())["tuned"]["workers"] == 2


def test_helpers_do_not_outlive_a_killed_caller():
    import os
    import signal
    import subprocess
    import sys
    import time
    from pathlib import Path

    script = ("import os, signal\n"
              "from tuners.parallel import ClusterArgs, TunePool, WorkloadSpec\n"
              "from tuners.space import DeploymentLimits\n"
              "if __name__ == '__main__':\n"
              "    pool = TunePool(WorkloadSpec(preset='sessions', max_requests=100), ClusterArgs({'pods': 2}),\n"
              "                    DeploymentLimits(pods=2, l2_backend='twin'), workers=2)\n"
              "    pool.wait_ready()\n"
              "    print(pool._helpers[0].pid, flush=True)\n"
              "    os.kill(os.getpid(), signal.SIGKILL)\n")
    caller = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    pid = int(caller.stdout.readline())  # type: ignore[union-attr]
    caller.wait(timeout=60)

    def running() -> bool:
        status = Path(f"/proc/{pid}/status")
        try:
            return "\tZ" not in next(line for line in status.read_text().splitlines() if line.startswith("State"))
        except (OSError, StopIteration):
            return False

    deadline = time.monotonic() + 15
    while running() and time.monotonic() < deadline:
        time.sleep(0.2)
    try:
        assert not running(), f"helper {pid} still runs after its caller was killed"
    finally:
        if running():
            os.kill(pid, signal.SIGKILL)
        caller.stdout.close()  # type: ignore[union-attr]
