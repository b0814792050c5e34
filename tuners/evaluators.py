"""Evaluators: how a candidate configuration becomes an `Evaluation`.

Both evaluators sit behind one interface, `Evaluator`: `start(candidate, now)` begins an
evaluation and `poll(now)` returns the result once it is ready (None until then). The twin
finishes at once; the live evaluator (`tuners.live.LiveEvaluator`) applies the candidate through
the guardrails, waits for rollout and settle, and measures a window from the agent's store.
`run_trials` drives any tuner with any evaluator; the CLI, the benchmark and the twin warm-start
use it with the twin.
"""
from __future__ import annotations

import dataclasses
import functools
import math
import time
from collections.abc import Callable, Mapping
from typing import Any, Protocol, runtime_checkable

import polars as pl

from contracts.knobs import Knobs
from tuners.base import Candidate, TrialRecord, Tuner
from tuners.objective import Evaluation, TtftObservations
from tuners.space.limits import CandidateError, DeploymentLimits, memory_cost_gib


@dataclasses.dataclass(frozen=True)
class StartResult:
    """What `Evaluator.start` did. status: started | blocked | rejected | retry | failed | dry_run."""

    status: str
    message: str = ""
    retry_after_s: float = 0.0
    permanent: bool = False

    @property
    def started(self) -> bool:
        return self.status == "started"


@runtime_checkable
class Evaluator(Protocol):
    """Evaluates one candidate at a time."""

    def start(self, candidate: Candidate, now: float) -> StartResult:
        ...

    def poll(self, now: float) -> Evaluation | None:
        ...


# -- the twin --------------------------------------------------------------------------------
ReplayFn = Callable[..., Any]


def _default_replay() -> ReplayFn:
    """The twin's replay, keeping the workload's per-stream work (chunk hashes per chunk size) from
    one trial to the next: an evaluator replays one workload with many knobs."""
    from simulator.replay import replay  # the digital twin
    from simulator.streams import StreamCache

    return functools.partial(replay, streams=StreamCache())


class EvaluationCache:
    """Twin results by configuration, shared by every sampler that evaluates the same workload."""

    def __init__(self) -> None:
        self._data: dict[Knobs, Evaluation] = {}
        self.hits = 0
        self.misses = 0

    def get(self, knobs: Knobs) -> Evaluation | None:
        ev = self._data.get(knobs)
        if ev is None:
            self.misses += 1
        else:
            self.hits += 1
        return ev

    def put(self, knobs: Knobs, ev: Evaluation) -> None:
        self._data[knobs] = ev

    def __len__(self) -> int:
        return len(self._data)

    def items(self) -> list[tuple[Knobs, Evaluation]]:
        return list(self._data.items())


class TwinEvaluator:
    """Replays a workload on the digital twin with each candidate.

    `replay_fn(workload, cluster, knobs, profile=...)` defaults to `simulator.replay.replay`; its
    result must offer `.summary()` with `ttft_p50_s`, `ttft_p95_s`, `hit_ratio`, and may offer
    `.requests` (polars) with a per-request `ttft_s` column, kept as TTFT samples.
    """

    def __init__(self, workload: Any, cluster: Any, limits: DeploymentLimits, *, profile: Any = None,
                 replay_fn: ReplayFn | None = None, cache: EvaluationCache | None = None,
                 keep_samples: bool = False) -> None:
        self.workload = workload
        self.cluster = cluster
        self.limits = limits
        self.profile = profile
        self.replay_fn = replay_fn or _default_replay()
        self.cache = cache if cache is not None else EvaluationCache()
        self.keep_samples = keep_samples
        self.replays = 0
        self.replay_seconds = 0.0
        self._pending: Evaluation | None = None

    def evaluate(self, knobs: Knobs) -> Evaluation:
        cached = self.cache.get(knobs)
        if cached is not None:
            return cached
        t0 = time.perf_counter()
        kwargs = {"profile": self.profile} if self.profile is not None else {}
        result = self.replay_fn(self.workload, self.cluster, knobs, **kwargs)
        self.replay_seconds += time.perf_counter() - t0
        self.replays += 1
        ev = evaluation_from_summary(result.summary(), knobs, self.limits,
                                     requests=getattr(result, "requests", None) if self.keep_samples else None)
        self.cache.put(knobs, ev)
        return ev

    def start(self, candidate: Candidate, now: float) -> StartResult:
        self._pending = self.evaluate(candidate.knobs)
        return StartResult("started")

    def poll(self, now: float) -> Evaluation | None:
        ev, self._pending = self._pending, None
        return ev


def evaluation_from_summary(summary: Mapping[str, Any], knobs: Knobs, limits: DeploymentLimits, *,
                            requests: Any = None, source: str = "twin") -> Evaluation:
    """Map a replay summary onto an Evaluation; missing keys are a clear error."""
    missing = [k for k in ("ttft_p50_s", "ttft_p95_s", "hit_ratio") if k not in summary]
    if missing:
        raise KeyError(f"replay summary lacks {', '.join(missing)}; got keys {sorted(summary)}")
    samples = None
    if requests is not None and "ttft_s" in getattr(requests, "columns", ()):
        samples = TtftObservations(samples=tuple(float(x) for x in requests["ttft_s"].to_list()))
    return Evaluation(
        ttft_p50_s=float(summary["ttft_p50_s"]), ttft_p95_s=float(summary["ttft_p95_s"]),
        hit_ratio=float(summary["hit_ratio"]), memory_gib=memory_cost_gib(knobs, limits),
        requests=int(summary.get("requests", summary.get("n_requests", 0)) or 0),
        ttft=samples, source=source)


class FunctionEvaluator:
    """An evaluator over a plain function knobs -> Evaluation (tests, what-if scripts)."""

    def __init__(self, fn: Callable[[Knobs], Evaluation]) -> None:
        self.fn = fn
        self._pending: Evaluation | None = None

    def evaluate(self, knobs: Knobs) -> Evaluation:
        return self.fn(knobs)

    def start(self, candidate: Candidate, now: float) -> StartResult:
        self._pending = self.fn(candidate.knobs)
        return StartResult("started")

    def poll(self, now: float) -> Evaluation | None:
        ev, self._pending = self._pending, None
        return ev


# -- a synchronous loop for evaluators that finish at once ------------------------------------
def run_trials(tuner: Tuner, evaluator: Evaluator, n_trials: int, *,
               on_trial: Callable[[TrialRecord], None] | None = None,
               clock: Callable[[], float] = time.time) -> list[TrialRecord]:
    """Ask/evaluate/tell `n_trials` times. Evaluation errors fail the trial and continue."""
    records: list[TrialRecord] = []
    for _ in range(n_trials):
        if getattr(tuner, "exhausted", lambda: False)():
            break
        try:
            candidate = tuner.ask()
        except CandidateError:
            continue
        try:
            started = evaluator.start(candidate, clock())
            ev = evaluator.poll(clock()) if started.started else None
            if ev is None or not math.isfinite(ev.ttft_p95_s):
                rec = tuner.fail(candidate, started.message or "no result")
            else:
                rec = tuner.tell(candidate, ev)
        except (KeyError, ValueError, RuntimeError) as exc:
            rec = tuner.fail(candidate, f"{type(exc).__name__}: {exc}")
        records.append(rec)
        if on_trial is not None:
            on_trial(rec)
    return records


@dataclasses.dataclass(frozen=True)
class _TailResult:
    requests: pl.DataFrame

    def summary(self) -> dict[str, float]:
        r = self.requests
        prompt = int(r["prompt_tokens"].sum())
        hits = int(r["gpu_hit_tokens"].sum() + r["cpu_hit_tokens"].sum() + r["l2_hit_tokens"].sum())
        ttft = r["ttft_s"]
        return {"requests": r.height, "hit_ratio": hits / prompt if prompt else 0.0,
                "ttft_p50_s": float(ttft.quantile(0.5, "linear")) if r.height else math.nan,
                "ttft_p95_s": float(ttft.quantile(0.95, "linear")) if r.height else math.nan}


@dataclasses.dataclass(frozen=True)
class WarmReplay:
    """A `replay_fn` for `TwinEvaluator` that replays the history and scores
    only the requests from `measure_from_s` on, so candidates are judged with warm caches, as the
    live cluster will see them (a cold replay of a short window over-rewards skipping L2)."""

    measure_from_s: float
    streams: Any = dataclasses.field(default=None, compare=False, repr=False)  # simulator.streams.StreamCache

    def __post_init__(self) -> None:
        if self.streams is None:
            from simulator.streams import StreamCache

            object.__setattr__(self, "streams", StreamCache())

    def __call__(self, workload: pl.DataFrame, cluster: Any, knobs: Knobs, **kw: object) -> _TailResult:
        from simulator.replay import replay

        result = replay(workload, cluster, knobs, streams=self.streams, **kw)  # type: ignore[arg-type]
        return _TailResult(result.requests.filter(pl.col("time_s") >= self.measure_from_s))
