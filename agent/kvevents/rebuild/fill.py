"""Capping and completing a rebuilt window (pure): outlier engines, fully cached requests from
the counters, partial last blocks (history.py's module doc says what each assumes)."""
from __future__ import annotations

import dataclasses
from collections.abc import Mapping

import numpy as np

from agent.kvevents.rebuild.chains import Rebuilt
from agent.kvevents.rebuild.log import mix64, ranges, sampled
from agent.kvevents.rebuild.reuse import reach_draws
from simulator.chunking import BLOCK_TOKENS

CANDIDATES = 16  # earlier requests of its pod a fully cached request may repeat (whole, or a prefix)


@dataclasses.dataclass(frozen=True)
class PodRequests:
    """One pod's counters over a window: finished requests, their prompt tokens and the tokens its
    GPU prefix cache served (`vllm:prefix_cache_hits_total`). `intervals`: when the requests were
    counted, one (start, end, requests) per scrape of the counter in the window, oldest first
    (empty: not known)."""

    requests: float
    prompt_tokens: float | None = None
    gpu_hit_tokens: float | None = None
    intervals: tuple[tuple[float, float, float], ...] = ()


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
    refs, shared = chain_refs(r)
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
        ts = arrival_times(c, r.ts[mine], missing, since, until, rng)
        per = _blocks_left(r, mine, missing, c)
        # candidates: CANDIDATES of the pod's earlier requests, as far back as its visible reuses reach
        before = np.searchsorted(r.ts[mine], ts, side="left")
        back = reach_draws(r, mine, per, rng, (missing, CANDIDATES))
        cand = mine[np.clip(before[:, None] - back, 0, len(mine) - 1)]
        opts = np.concatenate([cand, cand, cand], axis=1)
        olen = np.concatenate([r.lengths[cand], r.lengths[cand] - r.own[cand], shared[cand]], axis=1)
        olen = np.where(olen > 0, olen, r.lengths[opts])
        weight = refs[r.offsets[:-1][opts] + np.maximum(olen, 1) - 1].astype(np.float64)
        choice = tilted_choice(olen, per, rng, weight)
        rows = np.arange(missing)
        picks.append(opts[rows, choice])
        lens.append(olen[rows, choice])
        times.append(ts)
        made[pod] = missing
    if not picks:
        return r.take(np.zeros(r.requests, dtype=bool)), made, outliers
    cut = _select(r, np.concatenate(picks), np.concatenate(lens))
    return dataclasses.replace(cut, ts=np.concatenate(times)), made, outliers


def chain_refs(r: Rebuilt) -> tuple[np.ndarray, np.ndarray]:
    """Per chain position, how many requests' chains hold that block (a chain holds a block once);
    per request, its longest prefix some other request shares (positions held more than once)."""
    if not len(r.flat):
        return np.zeros(0, dtype=np.int64), np.zeros(r.requests, dtype=np.int64)
    _, inv, cnt = np.unique(r.flat, return_inverse=True, return_counts=True)
    refs = cnt[inv]
    shared = np.zeros(r.requests, dtype=np.int64)
    np.add.at(shared, np.repeat(np.arange(r.requests), r.lengths), (refs > 1).astype(np.int64))
    return refs, shared


def tilted_choice(options: np.ndarray, mean: float | None, rng: np.random.Generator,
                  weight: np.ndarray | None = None) -> np.ndarray:
    """One column per row of `options` (lengths), with probability proportional to `weight` (1
    without) times exp(theta x length), theta such that the expected mean length is `mean` (of
    the choices with that mean, the nearest the weights: the mix of lengths is kept, not pulled to
    the mean); theta = 0 without `mean`; the shortest or longest option when `mean` is beyond what
    they allow."""
    rows, cols = options.shape
    w0 = np.ones(options.shape) if weight is None else np.maximum(weight, 1e-12)
    if mean is None or not rows:
        cum = np.cumsum(w0, axis=1)
        return np.minimum((cum < rng.random(rows)[:, None] * cum[:, -1:]).sum(axis=1), cols - 1)
    x = options.astype(np.float64)
    scale = max(float(x.std()), 1e-9)
    x = (x - mean) / scale

    def probs(theta: float) -> np.ndarray:
        z = theta * x + np.log(w0)
        w = np.exp(z - z.max(axis=1, keepdims=True))
        return w / w.sum(axis=1, keepdims=True)

    lo, hi = -60.0, 60.0
    for _ in range(60):  # the expected mean rises with theta
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if float((probs(mid) * x).sum(axis=1).mean()) < 0 else (lo, mid)
    cum = np.cumsum(probs((lo + hi) / 2), axis=1)
    return np.minimum((cum < rng.random(rows)[:, None] * cum[:, -1:]).sum(axis=1), cols - 1)


def arrival_times(c: PodRequests, stored_ts: np.ndarray, missing: int, since: float, until: float,
                  rng: np.random.Generator) -> np.ndarray:
    """When a pod's `missing` fully cached requests arrived (ascending): spread over the counter's
    scrape intervals in proportion to what each counted beyond the pod's rebuilt requests stored in
    it (`stored_ts`, sorted), evenly inside each; in proportion to their lengths when none counted
    more; evenly over [since, until] without intervals. So they start at the counter's first sample
    and follow its rate."""
    iv = [(max(a, since), min(b, until), n) for a, b, n in c.intervals if min(b, until) > max(a, since)]
    if not iv:
        return since + (np.arange(missing) + rng.random(missing)) * (until - since) / missing
    start, end, counted = (np.array(x, dtype=np.float64) for x in zip(*iv, strict=True))
    stored = np.searchsorted(stored_ts, end, side="right") - np.searchsorted(stored_ts, start, side="right")
    weight = np.maximum(counted - stored, 0.0)
    if weight.sum() <= 0:
        weight = end - start
    share = weight / weight.sum() * missing
    k = np.floor(share).astype(np.int64)
    k[np.argsort(k - share, kind="stable")[:missing - int(k.sum())]] += 1  # largest remainders
    at = np.repeat(np.arange(len(k)), k)
    j = np.arange(missing) - np.repeat(np.cumsum(k) - k, k)
    return start[at] + (j + rng.random(missing)) / k[at] * (end - start)[at]


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


def plan_cap(r: Rebuilt, max_requests: int | None, max_block_refs: int | None) -> tuple[np.ndarray, int]:
    """The requests a plan replays under its caps: the smallest sample level L whose requests (key in
    the first 2^-L of hash space: the same ones on every call) fit both `max_requests` and
    `max_block_refs` (512-token ids). Returns the mask and L (0: all of them)."""
    ids = -(-(r.lengths * np.maximum(r.block_size.astype(np.int64), 1)) // BLOCK_TOKENS)
    keys = r.keys
    for level in range(64):
        keep = sampled(keys, level)
        if (max_requests is None or keep.sum() <= max_requests) and \
                (max_block_refs is None or ids[keep].sum() <= max_block_refs):
            return keep, level
    return np.zeros(r.requests, dtype=bool), 64
