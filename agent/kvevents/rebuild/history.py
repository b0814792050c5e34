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
   requests counts as the median pod). Each is synthesised at an arrival time spread evenly
   over the window as a repeat of one of the pod's `RECENT_SOURCES` latest requests before that
   time: of `CANDIDATES` drawn (fixed seed), the one whose length is nearest the blocks the
   counters leave per missing request (GPU hit tokens less the rebuilt requests' cached prefixes,
   or else prompt tokens less the rebuilt prompts). The assumption: a fully cached prompt repeats a prompt the pod
   served recently, up to its partial last block (its GPU cache holds it by definition; which
   prompt, and when it arrived, are not observable).

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

from agent.kvevents.rebuild.chains import Rebuilt, rebuild
from agent.kvevents.rebuild.layout import to_frame
from agent.kvevents.rebuild.log import ranges
from agent.kvevents.rebuild.recorder import BlockRecorder, mix64

log = logging.getLogger(__name__)
RECENT_SOURCES = 16  # a fully cached request repeats one of its pod's this many latest prompts
COUNTER_FIELDS = {"requests": "requests", "prompt_tokens": "prompt_tokens", "gpu_hit_tokens": "gpu_hit_tokens"}
CANDIDATES = 4  # drawn among them; the one nearest the length the prompt-token counter leaves wins


@dataclasses.dataclass(frozen=True)
class PodRequests:
    """One pod's counters over a window: finished requests, their prompt tokens and the tokens its
    GPU prefix cache served (`vllm:prefix_cache_hits_total`)."""

    requests: float
    prompt_tokens: float | None = None
    gpu_hit_tokens: float | None = None


Counts = Callable[[float, float], Mapping[str, PodRequests]]


def store_counts(store: Any) -> Counts:
    """The per-pod request and prompt-token increases of the agent's store over [since, until]."""
    def counts(since: float, until: float) -> dict[str, PodRequests]:
        w = store.window_between(since, until)
        rows = w.filter(pl.col("le").is_null() & pl.col("signal").is_in(list(COUNTER_FIELDS)))
        found: dict[str, dict[str, float]] = {}
        for pod, signal, inc in rows.select("pod", "signal", "increase").iter_rows():
            if inc is not None and math.isfinite(inc) and inc >= 0:
                found.setdefault(pod, {})[signal] = found.get(pod, {}).get(signal, 0.0) + inc
        return {pod: PodRequests(**{COUNTER_FIELDS[k]: v for k, v in f.items()})
                for pod, f in found.items() if "requests" in f}
    return counts


def pod_of(engine: str) -> str:
    """The pod of an engine key (`pod` or `pod/dp<rank>`)."""
    return engine.split("/dp", 1)[0]


def lower_median(values: np.ndarray) -> float:
    if not len(values):
        return 0.0
    s = np.sort(values)
    return float(s[(len(s) - 1) // 2])


def cap_engines(r: Rebuilt, share: float) -> tuple[Rebuilt, dict[str, int]]:
    """An engine storing more than `share` x the lower median engine's blocks is an outlier: it keeps
    only requests whose root (first block) the other engines stored too, each chain once (an engine
    does not store again what it holds), at most the median's blocks of them: first those whose own
    blocks other engines stored too, each group lowest mixed root first (the same ones on every
    replica). A flood of forged chains thus adds little, and an honest
    busy engine keeps its shared traffic. Returns the outliers' own stored blocks in the window."""
    if r.requests == 0:
        return r, {}
    per = np.bincount(r.eng, weights=r.own, minlength=len(r.engines))
    active = per[per > 0]
    med = lower_median(active)
    if len(active) < 2 or med <= 0:
        return r, {}
    outliers = np.flatnonzero(per > share * med)
    if not len(outliers):
        return r, {}
    roots = r.flat[r.offsets[:-1]]
    bad = np.isin(r.eng, outliers)
    shared = np.isin(roots, roots[~bad])
    keep = ~bad
    tails = r.flat[r.offsets[1:] - 1]
    others = np.unique(r.flat[ranges(r.offsets[:-1][~bad], r.lengths[~bad])])
    for e in outliers:
        idx = np.flatnonzero((r.eng == e) & shared)
        _, first = np.unique(tails[idx], return_index=True)  # a chain it stores again is no new request
        idx = idx[np.sort(first)]
        # only requests some of whose own blocks other engines stored too, lowest mixed root first
        own = r.own[idx].astype(np.int64)
        pos = ranges(r.offsets[1:][idx] - own, own)
        seen = np.add.reduceat(np.isin(r.flat[pos], others).astype(np.int64), np.cumsum(own) - own) \
            if len(idx) else np.zeros(0, dtype=np.int64)
        idx = idx[seen > 0]
        order = idx[np.argsort(mix64(roots[idx]), kind="stable")]
        keep[order[np.cumsum(r.own[order]) <= med]] = True
    return r.take(keep), {r.engines[e]: int(per[e]) for e in outliers}


def synthesise(r: Rebuilt, counts: Mapping[str, PodRequests], since: float, until: float, *, share: float,
               seed: int) -> tuple[Rebuilt, dict[str, int], set[str]]:
    """The fully cached requests the counters show beyond the rebuilt ones (module doc, step 3).
    Returns them, how many per pod, and the pods whose request counts were outliers."""
    pods = np.array([pod_of(e) for e in r.engines], dtype=object) if r.engines else np.zeros(0, dtype=object)
    req_pod = pods[r.eng] if r.requests else np.zeros(0, dtype=object)
    counted = {p: c for p, c in counts.items() if c.requests > 0}
    med = lower_median(np.array([c.requests for c in counted.values()]))
    rng = np.random.default_rng(seed)
    picks: list[np.ndarray] = []
    times: list[np.ndarray] = []
    lens: list[np.ndarray] = []
    made: dict[str, int] = {}
    outliers: set[str] = set()
    for pod in sorted(counted):
        c = counted[pod]
        mine = np.flatnonzero(req_pod == pod)  # arrival order
        want = c.requests
        if len(counted) > 1 and c.requests > share * med:  # an outlier counts as the median pod
            want = med
            outliers.add(pod)
        missing = round(want - len(mine))
        if missing <= 0 or not len(mine):
            continue
        ts = since + (np.arange(missing) + rng.random(missing)) * (until - since) / missing
        # candidates: CANDIDATES of the pod's RECENT_SOURCES latest requests before each arrival
        before = np.searchsorted(r.ts[mine], ts, side="left")
        lo = np.maximum(before - RECENT_SOURCES, 0)
        span = np.maximum(before - lo, 1)
        at = np.minimum(lo[:, None] + (rng.random((missing, CANDIDATES)) * span[:, None]).astype(np.int64),
                        len(mine) - 1)
        cand = mine[at]
        opts = np.concatenate([cand, cand], axis=1)
        olen = np.concatenate([r.lengths[cand], r.lengths[cand] - r.own[cand]], axis=1)
        olen = np.where(olen > 0, olen, r.lengths[opts])
        choice = np.zeros(missing, dtype=np.int64)
        per = _blocks_left(r, mine, missing, c)
        if per is not None:  # the option nearest the blocks the counters leave per request
            choice = np.argmin(np.abs(olen - per), axis=1)
        rows = np.arange(missing)
        picks.append(opts[rows, choice])
        lens.append(olen[rows, choice])
        times.append(ts)
        made[pod] = missing
    if not picks:
        return r.take(np.zeros(r.requests, dtype=bool)), made, outliers
    cut = _select(r, np.concatenate(picks), np.concatenate(lens))
    return dataclasses.replace(cut, ts=np.concatenate(times)), made, outliers


def _blocks_left(r: Rebuilt, mine: np.ndarray, missing: int, c: PodRequests) -> float | None:
    """Mean whole blocks of the pod's fully cached requests, by its GPU hit tokens less the cached
    prefixes of its rebuilt requests; else by its prompt tokens less the rebuilt prompts (partial
    last blocks taken at half a block); None without either counter."""
    bs = np.maximum(r.block_size[mine], 1)
    block = float(bs.mean())
    if c.gpu_hit_tokens is not None:
        cached = float(((r.lengths[mine] - r.own[mine]) * bs).sum())
        return max(c.gpu_hit_tokens - cached, 0.0) / missing / block
    if c.prompt_tokens is not None:
        seen = float((r.lengths[mine] * bs).sum()) + block / 2 * (len(mine) + missing)
        return max(c.prompt_tokens - seen, 0.0) / missing / block
    return None


def tail_tokens(r: Rebuilt, counts: Mapping[str, PodRequests], outliers: set[str] = frozenset()) -> np.ndarray:
    """Per request, its pod's mean partial last block: (prompt tokens counted - whole blocks
    rebuilt) / requests, within [0, block size - 1]; the median pod's for `outliers` (pods whose
    counters are not believed). Zero where the counters lack prompt tokens."""
    out = np.zeros(r.requests, dtype=np.int64)
    if not r.requests:
        return out
    pods = np.array([pod_of(e) for e in r.engines], dtype=object)[r.eng]
    bsize = np.maximum(r.block_size.astype(np.int64), 1)
    full = r.lengths * bsize
    tails: dict[str, float] = {}
    for pod, c in counts.items():
        n = int((pods == pod).sum())
        if c.prompt_tokens is not None and n:
            tails[pod] = (c.prompt_tokens - float(full[pods == pod].sum())) / n
    honest = [t for p, t in tails.items() if p not in outliers]
    med = lower_median(np.array(honest)) if honest else 0.0
    for pod, t in tails.items():
        mine = pods == pod
        out[mine] = np.clip(int(med if pod in outliers else t), 0, bsize[mine] - 1)
    return out


def _select(r: Rebuilt, idx: np.ndarray, lengths: np.ndarray | None = None) -> Rebuilt:
    """Requests `idx` (repeats allowed), in that order, each cut to its first `lengths[i]` blocks."""
    lengths = r.lengths[idx] if lengths is None else np.minimum(lengths, r.lengths[idx])
    offsets = np.zeros(len(idx) + 1, dtype=np.int64)
    np.cumsum(lengths, out=offsets[1:])
    flat = r.flat[ranges(r.offsets[:-1][idx], lengths)]
    return Rebuilt(r.ts[idx], r.eng[idx], r.block_size[idx], np.zeros(len(idx), dtype=np.int64), flat, offsets,
                   r.engines)


def concat(a: Rebuilt, b: Rebuilt) -> Rebuilt:
    """Both sets of requests, in arrival order."""
    ts = np.concatenate([a.ts, b.ts])
    order = np.argsort(ts, kind="stable")
    lengths = np.concatenate([a.lengths, b.lengths])
    flat_all = np.concatenate([a.flat, b.flat])
    starts = np.concatenate([a.offsets[:-1], b.offsets[:-1] + len(a.flat)])
    offsets = np.zeros(len(ts) + 1, dtype=np.int64)
    np.cumsum(lengths[order], out=offsets[1:])
    flat = flat_all[ranges(starts[order], lengths[order])]
    return Rebuilt(ts[order], np.concatenate([a.eng, b.eng])[order], np.concatenate([a.block_size, b.block_size])[order],
                   np.concatenate([a.own, b.own])[order], flat, offsets, a.engines)


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
                 seed: int = 0) -> None:
        self.recorder, self.counts, self.clock = recorder, counts, clock
        self.join_s, self.engine_share, self.output_tokens = join_s, engine_share, output_tokens
        self.model, self.seed = model, seed
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

    def window(self, now: float, seconds: float) -> RebuiltWindow:
        since = now - seconds
        model = self._model()
        arr = self.recorder.arrays(model) if model is not None else None
        if arr is None:
            from agent.kvevents.rebuild.chains import empty
            return RebuiltWindow(empty(), np.zeros(0, dtype=np.int64), 0, {}, {}, set(), 0)
        r = rebuild(arr, since, now, join_s=self.join_s)
        r, outliers = cap_engines(r, self.engine_share)
        made: dict[str, int] = {}
        liars: set[str] = set()
        tails = np.zeros(r.requests, dtype=np.int64)
        if self.counts is not None and arr.sample_level == 0:
            counts = self.counts(since, now)
            extra, made, liars = synthesise(r, counts, since, now, share=self.engine_share, seed=self.seed)
            r = concat(r, extra)
            tails = tail_tokens(r, counts, liars)
        self._note_outliers(outliers, liars, since, now)
        stored = r.requests - sum(made.values())
        self.last = RebuiltWindow(r, tails, stored, made, outliers, liars, arr.sample_level)
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
        w = self.window(now, seconds)
        return to_frame(w.requests, output_tokens=self.output_tokens, tails=w.tails)


__all__ = ["Counts", "PodRequests", "RebuiltHistory", "RebuiltWindow", "cap_engines", "store_counts", "synthesise"]
