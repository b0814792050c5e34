"""`RebuiltHistory`: the planner's recent history, rebuilt from the recorded block stream.

`history(now, seconds)` (the object is callable, like `agent.runtime.paying_runtime.FittedHistory`)
returns the requests that arrived in [now - seconds, now] as a `WORKLOAD_SCHEMA` frame:

1. the requests rebuilt from the GPU stores (chains.py), their chains in 512-token ids (layout.py);
2. outlier engines capped: an engine whose own stored blocks in the window exceed `engine_share`
   times the lower median engine's keeps only requests the other engines corroborate (rooted where
   they stored, with some own blocks they stored too, each chain once), at most the median's
   worth (those whose root hashes mix lowest: the same ones on every replica), and is named in a
   log line and in `outliers` (exported by collector.py);
3. requests that stored nothing (every block already on the GPU) are invisible in the events. The
   counters give how many there were: per pod, finished requests in the window (`requests`)
   minus the rebuilt ones (a pod claiming more than `engine_share` times the lower median pod's
   requests counts as the median pod). They are synthesised (fill.py, fixed seed):
   - arrival: within the counter's scrape intervals (`PodRequests.intervals`), in proportion to
     what each interval counted beyond the pod's rebuilt requests, so they start at the counter's
     first sample and follow its rate (evenly over the window when the intervals are unknown);
   - prompt: a repeat, whole or up to a prefix, of one of `CANDIDATES` earlier requests of the
     pod, drawn as far back as the pod's visible reuses reach (reuse.py); among those options one
     is drawn in proportion to how many rebuilt requests share its last block (a popular prefix is
     repeated more often), tilted so that the mean length is the blocks the counters leave per
     missing request (GPU hit tokens less the rebuilt requests' cached prefixes, or else prompt
     tokens less the rebuilt prompts).
   The assumption: a fully cached prompt repeats, up to its partial last block, a prompt its pod
   served (its GPU cache holds it by definition); which one, and exactly when it arrived, are not
   observable.

`counts(since, until) -> {pod: PodRequests}` supplies the counters; `store_counts(store)` reads
them from the agent's store (`vllm:request_success_total`, `vllm:prompt_tokens_total`,
`vllm:prefix_cache_hits_total`).
"""
from __future__ import annotations

import dataclasses
import logging
import math
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np
import polars as pl

from agent.kvevents.rebuild.chains import Rebuilt, empty, rebuild
from agent.kvevents.rebuild.fill import (
    PodRequests,
    cap_engines,
    concat,
    plan_cap,
    pod_of,
    synthesise,
    tail_tokens,
)
from agent.kvevents.rebuild.layout import to_frame
from agent.kvevents.rebuild.recorder import BlockRecorder

log = logging.getLogger(__name__)
COUNTER_FIELDS = {"requests": "requests", "prompt_tokens": "prompt_tokens", "gpu_hit_tokens": "gpu_hit_tokens"}
Counts = Callable[[float, float], Mapping[str, PodRequests]]


def capped_frame(history: RebuiltHistory, w: RebuiltWindow) -> pl.DataFrame:
    """A window as the plan workload, within the history's caps (fill.plan_cap); a cut is logged."""
    keep, level = plan_cap(w.requests, history.max_requests, history.max_block_refs)
    if level:
        log.warning("plan workload capped: %d rebuilt requests over max_requests=%s / max_block_refs=%s; "
                    "replaying the %d whose key falls in 1/%d of hash space", w.requests.requests,
                    history.max_requests, history.max_block_refs, int(keep.sum()), 1 << level)
    history.capped_level = level
    r = w.requests.take(keep) if level else w.requests
    return to_frame(r, output_tokens=history.output_tokens, tails=w.tails[keep] if level else w.tails)


def scaled(c: PodRequests, rate: float) -> PodRequests:
    def mul(v: float | None) -> float | None:
        return None if v is None else v * rate
    return PodRequests(c.requests * rate, mul(c.prompt_tokens), mul(c.gpu_hit_tokens),
                       tuple((a, b, n * rate) for a, b, n in c.intervals))


def store_counts(store: Any) -> Counts:
    """The per-pod request and prompt-token increases of the agent's store over [since, until], and
    when the requests were counted (each scrape's increase, `PodRequests.intervals`)."""
    def counts(since: float, until: float) -> dict[str, PodRequests]:
        w = store.window_between(since, until)
        rows = w.filter(pl.col("le").is_null() & pl.col("signal").is_in(list(COUNTER_FIELDS)))
        found: dict[str, dict[str, float]] = {}
        for pod, signal, inc in rows.select("pod", "signal", "increase").iter_rows():
            if inc is not None and math.isfinite(inc) and inc >= 0:
                found.setdefault(pod, {})[signal] = found.get(pod, {}).get(signal, 0.0) + inc
        when = request_intervals(store.frame(since=since), since, until)
        return {pod: PodRequests(**{COUNTER_FIELDS[k]: v for k, v in f.items()}, intervals=when.get(pod, ()))
                for pod, f in found.items() if "requests" in f}
    return counts


def request_intervals(frame: pl.DataFrame, since: float, until: float) -> dict[str, tuple[tuple[float, float, float], ...]]:
    """Per pod, each scrape's increase of the request counter in (since, until]: (start, end,
    requests), the start at the scrape before (never before `since`). A series' first sample
    (no increase yet) starts none."""
    rows = (frame.filter(pl.col("le").is_null() & (pl.col("signal") == "requests") & (pl.col("ts") <= until)
                         & pl.col("delta").is_not_null() & pl.col("delta").is_finite() & (pl.col("delta") >= 0)
                         & pl.col("dt").is_not_null() & (pl.col("dt") > 0))
            .group_by("pod", "ts").agg(pl.col("delta").sum(), pl.col("dt").max()).sort("pod", "ts"))
    out: dict[str, list[tuple[float, float, float]]] = {}
    for pod, ts, delta, dt in rows.iter_rows():
        out.setdefault(str(pod), []).append((max(ts - dt, since), ts, delta))
    return {pod: tuple(v) for pod, v in out.items()}


@dataclasses.dataclass(frozen=True)
class RebuiltWindow:
    """One window's rebuilt workload and what went into it."""

    requests: Rebuilt  # stored + synthesised, arrival order
    tails: np.ndarray  # per request, tokens past its whole blocks (estimated from the counters)
    stored: int  # requests rebuilt from stores
    synthesised: dict[str, int]  # per pod, fully cached requests added from the counters
    outliers: dict[str, int]  # engines capped: their own stored blocks in the window
    counter_outliers: set[str]  # pods whose request counters were not believed
    sample_level: int

    @property
    def pods(self) -> list[str]:
        return [pod_of(self.requests.engines[e]) for e in self.requests.eng.tolist()]


class RebuiltHistory:
    """The planner's history from the block stream (module doc). `kind = "rebuilt"`."""

    kind = "rebuilt"

    def __init__(self, recorder: BlockRecorder, counts: Counts | None, clock: Callable[[], float], *,
                 join_s: float, engine_share: float, output_tokens: int, model: str | None = None,
                 seed: int = 0, max_requests: int | None = None, max_block_refs: int | None = None) -> None:
        self.recorder, self.counts, self.clock = recorder, counts, clock
        self.join_s, self.engine_share, self.output_tokens = join_s, engine_share, output_tokens
        self.model, self.seed = model, seed
        self.max_requests, self.max_block_refs = max_requests, max_block_refs
        self.capped_level = 0  # the sample level the last plan workload was cut to (0: whole)
        self.outliers: dict[str, int] = {}
        self.counter_outliers: set[str] = set()
        self.last: RebuiltWindow | None = None

    @classmethod
    def from_settings(cls, recorder: BlockRecorder, counts: Counts | None, clock: Callable[[], float], spec: Any,
                      **kw: Any) -> RebuiltHistory:
        """From `KvEventsSettings.rebuild` (agent.kvevents.settings.RebuildSpec)."""
        return cls(recorder, counts, clock, join_s=spec.join_s, engine_share=spec.engine_share,
                   output_tokens=spec.output_tokens, **kw)

    def _model(self) -> str | None:
        if self.model is not None:
            return self.model
        models = self.recorder.models()
        return models[0] if len(models) == 1 else None

    def available(self) -> bool:
        """True once GPU stores were recorded for the model (else the caller falls back)."""
        model = self._model()
        return model is not None and self.recorder.arrays(model) is not None

    def stored(self, now: float, seconds: float) -> tuple[Rebuilt, int]:
        """The requests rebuilt from this recorder's stores in [now - seconds, now], uncapped, and
        the recorder's sample level (what a sharded replica exports: merge.py)."""
        model = self._model()
        arr = self.recorder.arrays(model) if model is not None else None
        if arr is None:
            return empty(), self.recorder.level
        return rebuild(arr, now - seconds, now, join_s=self.join_s), arr.sample_level

    def window(self, now: float, seconds: float) -> RebuiltWindow:
        r, level = self.stored(now, seconds)
        counts = self.counts(now - seconds, now) if self.counts is not None else None
        return self.finish(r, counts, level, now - seconds, now)

    def finish(self, r: Rebuilt, counts: Mapping[str, PodRequests] | None, level: int, since: float,
               now: float) -> RebuiltWindow:
        """Cap the outliers, add the fully cached requests and the partial last blocks (module doc).
        Sampled at `level`, the counters are scaled by 2^-level first."""
        r, outliers = cap_engines(r, self.engine_share)
        made: dict[str, int] = {}
        liars: set[str] = set()
        tails = np.zeros(r.requests, dtype=np.int64)
        if counts is not None:
            if level:
                counts = {p: scaled(c, 0.5 ** level) for p, c in counts.items()}
            extra, made, liars = synthesise(r, counts, since, now, share=self.engine_share, seed=self.seed)
            r = concat(r, extra)
            tails = tail_tokens(r, counts, liars)
        self._note_outliers(outliers, liars, since, now)
        self.last = RebuiltWindow(r, tails, r.requests - sum(made.values()), made, outliers, liars, level)
        return self.last

    def _note_outliers(self, outliers: dict[str, int], liars: set[str], since: float, until: float) -> None:
        for eng in sorted(set(outliers) - set(self.outliers)):
            log.warning("kv-events rebuild: engine %s stored %d blocks in [%.0f, %.0f], beyond %.1fx the "
                        "median engine's: only its requests rooted where other engines stored count, at most "
                        "the median's", eng, outliers[eng], since, until, self.engine_share)
        for pod in sorted(liars - self.counter_outliers):
            log.warning("kv-events rebuild: pod %s counted more than %.1fx the median pod's requests in "
                        "[%.0f, %.0f]: it counts as the median pod", pod, self.engine_share, since, until)
        self.outliers, self.counter_outliers = outliers, liars

    def __call__(self, now: float, seconds: float) -> pl.DataFrame:
        return capped_frame(self, self.window(now, seconds))


__all__ = ["Counts", "PodRequests", "RebuiltHistory", "RebuiltWindow", "store_counts"]
