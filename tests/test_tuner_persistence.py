"""Crash and resume on SQLite and on a real PostgreSQL: no finished trial is lost, the trial in
flight at the crash is marked failed, and the last good configuration is re-applied."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import optuna
import pytest

from contracts.knobs import Knobs
from tests.conftest import REPO_ROOT
from tests.support.postgres import postgres_url  # noqa: F401  (fixture)
from tests.support.tuner_crash import SPACE, controller
from tests.support.tuner_fakes import FakeClock
from tuners.evaluators import FunctionEvaluator, run_trials
from tuners.objective import Evaluation
from tuners.optuna_tuner import OptunaTuner

optuna.logging.set_verbosity(optuna.logging.WARNING)


@pytest.fixture(params=["sqlite", "postgresql"])
def storage_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'tierpilot.db'}"
    return request.getfixturevalue("postgres_url")


def test_crash_resume_loses_no_trial_and_restores_last_good(storage_url: str, tmp_path: Path) -> None:
    state = tmp_path / "target.json"
    proc = subprocess.run([sys.executable, "-m", "tests.support.tuner_crash", storage_url, str(state)],
                          cwd=REPO_ROOT, capture_output=True, text=True, timeout=180, check=False)
    assert proc.returncode == 17, proc.stderr[-3000:]
    crash = json.loads(proc.stdout.strip().splitlines()[-1])
    last_good = Knobs.from_mapping(crash["last_good"])
    assert crash["finished"], "the child finished trials before crashing"

    clock = FakeClock(crash["clock"] + 900)
    ctl, actuator = controller(storage_url, state, clock)
    assert actuator.current() == Knobs.from_mapping(crash["current"]) != last_good  # candidate still on
    orphans = ctl.resume(clock.now)

    assert orphans == [crash["in_flight"]]
    trials = {t.number: t for t in ctl.tuner.trials()}
    for number in crash["finished"]:
        assert trials[number].state in ("complete", "rolled_back")
        assert trials[number].values is not None
    orphan = trials[crash["in_flight"]]
    assert orphan.state == "failed"
    assert orphan.attrs["failure"] == "in flight when the agent restarted"
    assert actuator.current() == last_good  # re-applied at once
    assert ctl.tuner.last_good() == last_good
    assert actuator.calls[-1] == ("apply", last_good)

    # The study carries on: re-measure the baseline, then a new trial numbered after the orphan.
    for _ in range(500):
        r = ctl.step(clock.now)
        if r.state == "trial_started":
            break
        clock.advance(15)
    assert r.state == "trial_started" and r.trial > crash["in_flight"]


def test_two_agents_share_one_study(storage_url: str) -> None:
    def evaluate(k: Knobs) -> Evaluation:
        v = 0.1 + k.cpu_gib / 100 + (k.chunk_tokens == 64) * 0.05
        return Evaluation(v / 2, v, 0.5, k.cpu_gib * 2)

    a = OptunaTuner(SPACE, storage=storage_url, study_name="shared", sampler="random", seed=1, owner="agent-a")
    b = OptunaTuner(SPACE, storage=storage_url, study_name="shared", sampler="random", seed=2, owner="agent-b")
    for _ in range(4):
        run_trials(a, FunctionEvaluator(evaluate), 1)
        run_trials(b, FunctionEvaluator(evaluate), 1)
    hanging = b.ask()  # agent b dies with this trial in flight
    assert a.resume() == []  # agent a must not fail agent b's trial
    again = OptunaTuner(SPACE, storage=storage_url, study_name="shared", sampler="random", owner="agent-b")
    assert again.resume() == [hanging.number]
    states = [t.state for t in again.trials()]
    assert states == ["complete"] * 8 + ["failed"]
    owners = [t.attrs["candidate"]["owner"] for t in again.trials()]
    assert owners == ["agent-a", "agent-b"] * 4 + ["agent-b"]
