"""Child process for the crash-resume tests: run the live controller until a trial is in flight
after at least one improvement, print what storage holds, then die without any cleanup.

    python -m tests.support.tuner_crash STORAGE_URL ACTUATOR_STATE.json
"""
from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import optuna

from contracts.knobs import Knobs
from tests.support.tuner_fakes import FakeActuator, FakeClock, FakeFleet
from tests.support.tuner_settings import controller_settings, guardrail_settings, live_settings
from tuners.controller import TuningController
from tuners.guardrails import Guardrails
from tuners.live import LiveEvaluator
from tuners.metrics import TunerMetrics
from tuners.optuna_tuner import open_storage
from tuners.space import Choice, DeploymentLimits, FloatRange, SearchSpace

SPACE = SearchSpace(
    (Choice("chunk_tokens", (64, 256, 512)), FloatRange("cpu_gib", 0.0, 10.0, 5.0),
     Choice("router", ("roundrobin", "prefixaware"))),
    DeploymentLimits(pods=2, node_memory_headroom_gib=10.0),
)
GOOD = Knobs(chunk_tokens=512, cpu_gib=10.0, router="prefixaware")
CANDIDATE = Knobs(chunk_tokens=256, cpu_gib=5.0, router="prefixaware")


def median(k: Knobs) -> float:
    return {GOOD: 0.14, CANDIDATE: 0.2}.get(k, 0.25)


class FixedWarmStart:
    def candidates(self, k: int) -> list[Knobs]:
        return [GOOD, CANDIDATE][:k]


def controller(url: str, state: Path, clock: FakeClock) -> tuple[TuningController, FakeActuator]:
    actuator = FakeActuator(clock, path=state)
    metrics = TunerMetrics(target="crash")
    guard = Guardrails(actuator, SPACE, metrics, guardrail_settings(apply="all", cooldown_s=60), clock=clock)
    ctl = TuningController(
        space=SPACE, objective=None, storage=open_storage(url), guardrails=guard,
        evaluator=LiveEvaluator(guard, FakeFleet(actuator, median), live_settings(settle_s=30, window_s=120)),
        metrics=metrics, settings=controller_settings(study="crash", seed=2, trials_per_phase=10),
        warm_start=FixedWarmStart())
    return ctl, actuator


def main() -> None:
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    url, state = sys.argv[1], Path(sys.argv[2])
    clock = FakeClock()
    ctl, actuator = controller(url, state, clock)
    improved = False
    for _ in range(2000):
        r = ctl.step(clock.now)
        improved = improved or r.state == "improved"
        if improved and r.state == "trial_started":
            finished = [t.number for t in ctl.tuner.trials() if t.state != "running"]
            print(json.dumps({"finished": finished, "in_flight": r.trial, "clock": clock.now,
                              "current": actuator.current().to_dict(),
                              "last_good": ctl.tuner.last_good().to_dict()}), flush=True)
            os._exit(17)  # crash: no tell, no close, no cleanup
        clock.advance(15)
    raise SystemExit("never reached an in-flight trial after an improvement")


if __name__ == "__main__":
    main()
