"""Twin searches in parallel on one optuna study in a real PostgreSQL: worker processes share the
trial budget, every trial lands once, the defaults are tried once, and the best is the study's."""
from __future__ import annotations

import pytest

from tests.support.postgres import postgres_url  # noqa: F401
from tuners.objective import ObjectiveSpec
from tuners.optuna_tuner import OptunaTuner
from tuners.parallel import ClusterArgs, WorkloadSpec, parallel_tune, split_budget
from tuners.space import DeploymentLimits, SearchSpace

LIMITS = DeploymentLimits(pods=2, l2_backend="twin")


def test_split_budget():
    assert split_budget(10, 4) == [3, 3, 2, 2]
    assert split_budget(3, 4) == [1, 1, 1, 0]
    with pytest.raises(ValueError):
        split_budget(5, 0)


def test_workers_share_one_study_on_postgres(postgres_url):  # noqa: F811
    result = parallel_tune(WorkloadSpec(preset="sessions", max_requests=250), ClusterArgs({"pods": 2}), LIMITS,
                           storage=postgres_url, study="par", trials=10, workers=2, seed=3)
    assert [r.trials for r in sorted(result.workers, key=lambda r: r.worker)] == [5, 5]
    tuner = OptunaTuner(SearchSpace.from_limits(LIMITS), ObjectiveSpec(), storage=postgres_url, study_name="par")
    trials = tuner.trials()
    assert result.trials == len(trials) == 10
    assert len({t.number for t in trials}) == 10
    owners = {t.attrs.get("candidate", {}).get("owner") for t in trials}
    assert owners == {"tune-worker-0", "tune-worker-1"}  # both processes ran trials
    assert sum(t.attrs.get("source") == "defaults" for t in trials) == 1
    values = [t.value for t in trials if t.state == "complete" and t.feasible and t.value is not None]
    assert result.best is not None and result.best.value == min(values)
    # resuming (here with one in-process worker) adds to the same study
    more = parallel_tune(WorkloadSpec(preset="sessions", max_requests=250), ClusterArgs({"pods": 2}), LIMITS,
                         storage=postgres_url, study="par", trials=3, workers=1, seed=4, in_process=True)
    assert more.trials == 13


def test_needs_a_shared_storage():
    with pytest.raises(ValueError, match="shared RDB storage"):
        parallel_tune(WorkloadSpec(preset="sessions"), ClusterArgs(), LIMITS, storage="memory", study="x",
                      trials=2, workers=2)
