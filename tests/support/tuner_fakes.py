"""In-memory stand-ins for the tuner's tests: an Actuator with fault injection, a fake clock, and
a window source whose TTFT depends on the configuration in force (so regressions are real)."""
from __future__ import annotations

import dataclasses
import json
import math
import zlib
from collections.abc import Callable
from pathlib import Path

import numpy as np

from contracts.actuator import ActuationError, ApplyResult, PermanentActuationError
from contracts.knobs import Knobs
from tuners.objective import TtftObservations


class FakeClock:
    def __init__(self, start: float = 1_000_000.0) -> None:
        self.now = start

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> float:
        self.now += seconds
        return self.now


class FakeActuator:
    """Implements contracts.actuator.Actuator in memory; records every call with the clock's time.
    With `path`, its state (the "cluster object") survives the process, like a real target."""

    def __init__(self, clock: Callable[[], float], initial: Knobs | None = None, *,
                 path: Path | None = None) -> None:
        self.clock = clock
        self.path = path
        self._current = initial or Knobs()
        self._last_good: Knobs | None = None
        self.history: list[tuple[float, Knobs]] = [(-math.inf, self._current)]
        self.calls: list[tuple[str, object]] = []
        self.fail_next: list[ActuationError] = []  # raised (in order) by the next apply calls
        if path is not None and path.exists():
            state = json.loads(path.read_text())
            self._current = Knobs.from_mapping(state["current"])
            self._last_good = Knobs.from_mapping(state["last_good"]) if state["last_good"] else None
            self.history = [(t, Knobs.from_mapping(k)) for t, k in state["history"]]

    def _save(self) -> None:
        if self.path is not None:
            self.path.write_text(json.dumps({
                "current": self._current.to_dict(),
                "last_good": self._last_good.to_dict() if self._last_good else None,
                "history": [(max(t, -1e300), k.to_dict()) for t, k in self.history]}))

    def current(self) -> Knobs:
        return self._current

    def apply(self, knobs: Knobs, *, dry_run: bool = False) -> ApplyResult:
        self.calls.append(("apply_dry_run" if dry_run else "apply", knobs))
        if self.fail_next:
            raise self.fail_next.pop(0)
        changed = self._current.diff(knobs)
        if dry_run:
            return ApplyResult(knobs, applied=False, dry_run=True, changed=changed, message="dry run")
        if not changed:
            return ApplyResult(knobs, applied=False, message="unchanged")
        self._set(knobs)
        return ApplyResult(knobs, applied=True, changed=changed, restarted=("pod-0",))

    def last_good(self) -> Knobs | None:
        return self._last_good

    def mark_good(self, knobs: Knobs) -> None:
        self.calls.append(("mark_good", knobs))
        self._last_good = knobs
        self._save()

    def rollback(self) -> ApplyResult:
        self.calls.append(("rollback", self._last_good))
        if self._last_good is None:
            raise PermanentActuationError("no last good configuration to roll back to")
        changed = self._current.diff(self._last_good)
        self._set(self._last_good)
        return ApplyResult(self._current, applied=bool(changed), changed=changed)

    def knobs_at(self, t: float) -> Knobs:
        k = self.history[0][1]
        for since, knobs in self.history:
            if since <= t:
                k = knobs
        return k

    def _set(self, knobs: Knobs) -> None:
        self._current = knobs
        self.history.append((self.clock(), knobs))
        self._save()


@dataclasses.dataclass
class FakeFleet:
    """A WindowSource: `rate` requests/s, lognormal TTFT whose median is `median_fn(knobs)` for the
    configuration in force at each second (read from the actuator's history). Deterministic."""

    actuator: FakeActuator
    median_fn: Callable[[Knobs], float]
    rate: float = 2.0
    sigma: float = 0.25
    seed: int = 7
    buckets: tuple[float, ...] | None = None  # serve histogram deltas instead of samples

    def _second(self, t: int) -> np.ndarray:
        knobs = self.actuator.knobs_at(float(t))
        rng = np.random.default_rng(zlib.crc32(f"{self.seed}:{t}".encode()))
        n = rng.poisson(self.rate)
        return np.exp(np.log(self.median_fn(knobs)) + self.sigma * rng.standard_normal(n))

    def ttft_observations(self, since: float, until: float) -> TtftObservations | None:
        xs = np.concatenate([self._second(t) for t in range(int(since), int(until))] or [np.empty(0)])
        if xs.size == 0:
            return None
        if self.buckets is None:
            return TtftObservations(samples=tuple(float(x) for x in xs))
        bounds = np.asarray(self.buckets + (math.inf,))
        idx = np.searchsorted(bounds, xs, side="left")
        counts = np.bincount(idx, minlength=len(bounds)).astype(float)
        return TtftObservations(buckets=tuple(zip(bounds.tolist(), counts.tolist(), strict=True)))

    def cumulative_hit_ratio(self, since: float, until: float) -> float | None:
        return 0.5
