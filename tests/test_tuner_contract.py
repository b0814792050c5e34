"""The tuner contract, run against every sampler (and in-memory + SQLite storage)."""
from __future__ import annotations

import math
from pathlib import Path

import optuna
import pytest

from contracts.knobs import Knobs
from tuners.base import Tuner
from tuners.evaluators import FunctionEvaluator, run_trials
from tuners.objective import Evaluation, ObjectiveSpec
from tuners.optuna_tuner import SAMPLERS, OptunaTuner, make_sampler
from tuners.space import Choice, DeploymentLimits, FloatRange, IntRange, SearchSpace, memory_cost_gib

optuna.logging.set_verbosity(optuna.logging.WARNING)

LIMITS = DeploymentLimits(pods=2, node_memory_headroom_gib=8.0, cpu_budget_gib=12.0, l2_backend="curvine")
SPACE = SearchSpace(
    (Choice("chunk_tokens", (128, 256, 512)), FloatRange("cpu_gib", 0.0, 8.0, 2.0),
     Choice("router", ("roundrobin", "prefixaware")), IntRange("l2_min_prompt_tokens", 0, 2048, 1024)),
    LIMITS,
)  # 3 x 5 x 2 x 3 = 90 grid points


def ttft(k: Knobs) -> float:
    """A deterministic stand-in objective with its optimum at 512 / 6 GiB / prefixaware / 0."""
    return (0.2 + 0.05 * abs(math.log2(k.chunk_tokens / 512)) + 0.01 * abs(k.cpu_gib - 6.0)
            + (0.0 if k.router == "prefixaware" else 0.08) + 0.00002 * k.l2_min_prompt_tokens)


def evaluate(k: Knobs) -> Evaluation:
    t = ttft(k)
    return Evaluation(ttft_p50_s=t / 2, ttft_p95_s=t, hit_ratio=min(1.0, k.cpu_gib / 8),
                      memory_gib=memory_cost_gib(k, LIMITS), requests=100)


@pytest.fixture(params=["memory"])
def storage(request: pytest.FixtureRequest, tmp_path: Path) -> str | None:
    return None if request.param == "memory" else f"sqlite:///{tmp_path / 'tuner.db'}"


def make(sampler: str, storage: str | None, **kw: object) -> OptunaTuner:
    return OptunaTuner(SPACE, storage=storage, study_name="contract", sampler=sampler, seed=3, **kw)


@pytest.mark.parametrize("sampler", SAMPLERS)
class TestTunerContract:
    def test_is_a_tuner_and_asks_valid_candidates(self, sampler: str, storage: str | None) -> None:
        tuner = make(sampler, storage)
        assert isinstance(tuner, Tuner)
        for _ in range(12):
            cand = tuner.ask()
            for dim in SPACE.dimensions:
                assert dim.contains(SPACE.to_params(cand.knobs)[dim.name])
            tuner.tell(cand, evaluate(cand.knobs))
        assert [t.number for t in tuner.trials()] == list(range(12))

    def test_enqueued_candidates_come_first_in_order(self, sampler: str, storage: str | None) -> None:
        tuner = make(sampler, storage)
        first = Knobs(chunk_tokens=512, cpu_gib=6.0, router="prefixaware")
        second = Knobs(chunk_tokens=128, cpu_gib=2.0, l2_min_prompt_tokens=1024)
        tuner.enqueue(first, source="twin")
        tuner.enqueue(second, source="twin")
        a, b = tuner.ask(), tuner.ask()
        assert (a.knobs, a.source) == (first, "twin")
        assert (b.knobs, b.source) == (second, "twin")

    def test_best_is_the_lowest_feasible_and_failures_are_kept(self, sampler: str, storage: str | None) -> None:
        tuner = make(sampler, storage)
        tuner.enqueue(Knobs(chunk_tokens=512, cpu_gib=8.0, router="prefixaware"), source="test")  # 16 GiB > 12
        tuner.enqueue(Knobs(chunk_tokens=512, cpu_gib=4.0, router="prefixaware"), source="test")
        records = run_trials(tuner, FunctionEvaluator(evaluate), 20)
        failed = tuner.fail(tuner.ask(), "evaluation crashed")
        assert failed.state == "failed" and failed.attrs["failure"] == "evaluation crashed"
        assert not records[0].feasible  # over the fleet budget: recorded, but never "best"
        feasible = [r for r in records if r.feasible]
        best = tuner.best()
        assert best is not None and best.feasible
        assert best.value == min(r.value for r in feasible)
        known = Knobs(chunk_tokens=512, cpu_gib=4.0, router="prefixaware")
        assert best.value <= ObjectiveSpec().values(evaluate(known))[0]  # TTFT + memory at the default rate
        assert len(tuner.trials()) == 21

    def test_same_seed_same_sequence(self, sampler: str, storage: str | None, tmp_path: Path) -> None:
        def sequence(tuner: OptunaTuner) -> list[Knobs]:
            return [r.knobs for r in run_trials(tuner, FunctionEvaluator(evaluate), 15)]

        other = None if storage is None else f"sqlite:///{tmp_path / 'other.db'}"
        assert sequence(make(sampler, storage)) == sequence(make(sampler, other))

    def test_study_survives_reopening(self, sampler: str, tmp_path: Path) -> None:
        url = f"sqlite:///{tmp_path / 'reopen.db'}"
        run_trials(make(sampler, url), FunctionEvaluator(evaluate), 6)
        again = make(sampler, url)
        assert [t.state for t in again.trials()] == ["complete"] * 6
        cand = again.ask()
        assert cand.number == 6

    def test_multi_objective_returns_a_pareto_front(self, sampler: str, storage: str | None) -> None:
        tuner = make(sampler, storage, objective=ObjectiveSpec(multi=True))
        records = run_trials(tuner, FunctionEvaluator(evaluate), 25)
        front = tuner.pareto_front()
        assert front
        done = [r for r in records if r.state == "complete" and r.feasible]

        def dominates(a: tuple[float, ...], b: tuple[float, ...]) -> bool:
            better_eq = a[0] <= b[0] and a[1] >= b[1] and a[2] <= b[2]
            return better_eq and a != b

        for f in front:
            assert f.feasible
            assert not any(dominates(r.values, f.values) for r in done)
        for r in done:
            if r.number not in {f.number for f in front}:
                assert any(dominates(f.values, r.values) or f.values == r.values for f in front)


def test_grid_sampler_visits_every_point_once() -> None:
    tuner = OptunaTuner(SPACE, storage=None, sampler="grid", seed=0)
    records = run_trials(tuner, FunctionEvaluator(evaluate), 200)
    assert len(records) == SPACE.grid_size() == 90
    assert len({r.knobs for r in records}) == 90
    assert tuner.exhausted()
    assert tuner.best().knobs == Knobs(chunk_tokens=512, cpu_gib=6.0, router="prefixaware",
                                       l2_min_prompt_tokens=0)


def test_unknown_sampler_and_mismatched_study_are_clear_errors(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="sampler: invalid value 'cmaes'; valid choices: tpe, random, grid"):
        make_sampler("cmaes", SPACE)
    url = f"sqlite:///{tmp_path / 'x.db'}"
    OptunaTuner(SPACE, storage=url, study_name="s")
    with pytest.raises(ValueError, match="exists with directions"):
        OptunaTuner(SPACE, ObjectiveSpec(multi=True), storage=url, study_name="s")


def test_enqueue_outside_the_space_is_refused() -> None:
    tuner = OptunaTuner(SPACE, storage=None)
    with pytest.raises(ValueError, match="chunk_tokens=64 is not one of 128, 256, 512"):
        tuner.enqueue(Knobs(chunk_tokens=64), source="twin")


def test_a_tuner_without_storage_writes_nothing_to_disk(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A library caller that names no storage gets an in-memory study, not a database file in the
    working directory that a later run would silently resume."""
    monkeypatch.chdir(tmp_path)
    tuner = OptunaTuner(SPACE, study_name="s")
    run_trials(tuner, FunctionEvaluator(evaluate), 3)
    assert list(tmp_path.iterdir()) == []
    assert len(OptunaTuner(SPACE, study_name="s").study.trials) == 0  # nothing resumed
