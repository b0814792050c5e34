"""Hit ratio versus capacity for each tier, from one pass over a workload's block stream.

The tiers' reference streams follow the twin's semantics (docs/twin.md), tier by tier:

- GPU (per pod, LRU): every full chunk of every prompt routed to the pod, looked up as a prefix;
- CPU (per pod, LMCache L1): the chunks past the prompt's GPU prefix hit. LMCache is asked only
  for what the GPU does not hold, and its recency moves when a chunk is stored and on the chunk's
  own hits, never on GPU hits; a prompt's CPU hits are the prefix of those chunks it holds;
- L2 (the fleet's shared pool): the chunks past the GPU and CPU hits of every prompt; prompts
  shorter than `l2_min_prompt_tokens` store into it but are not served from it.

The pod of each request and the hits of the tiers above come from a replay at the current knobs
(or any observed run): that is the stream each tier really saw. A reference hits an LRU tier of
C chunks when its reuse distance (`simulator.capacity.stack`), maximised over the prompt's
chunks before it, is < C: so one pass gives every capacity. The curves are for LRU tiers; another
L2 eviction policy (LFU, S3-FIFO, ARC) is judged by replay, not by the curve.

Hit ratio = hit tokens / tokens that reached the tier (as `ReplayResult.summary()["tiers"]`).
"""
from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import numpy as np
import polars as pl

from contracts.knobs import Knobs
from simulator.capacity.stack import NEVER, reuse_distances, sample_mask
from simulator.chunking import chunk_hash_array
from simulator.cluster import ClusterSpec
from simulator.models import GIB
from simulator.profile import HardwareProfile
from simulator.records import check_workload, observed_placement
from simulator.replay import ReplayResult, replay

TIERS: tuple[str, ...] = ("gpu", "cpu", "l2")


@dataclasses.dataclass(frozen=True)
class TierCurve:
    """Hits of one tier at every capacity. Capacities in GiB are per pod for GPU and CPU, for the
    fleet for L2; GiB convert to chunks exactly as the twin does (whole tokens, whole chunks)."""

    tier: str
    chunk_tokens: int
    kv_bytes_per_token: int
    pods: int
    requests: int
    prompt_tokens: int
    lookup_tokens: int  # tokens that reached the tier (the hit ratio's denominator)
    current_chunks: int  # the tier's capacity in the run the stream came from
    sample_rate: float  # 1.0: exact
    levels: np.ndarray  # sorted distinct hit distances d (a reference hits a tier of C > d chunks)
    cum_hit_chunks: np.ndarray  # chunks that hit at capacity levels[i] + 1 (rescaled when sampled)

    @property
    def per_pod(self) -> bool:
        return self.tier != "l2"

    def chunks_for_gib(self, gib: float) -> int:
        """The tier's capacity in chunks for `gib` GiB (per pod for GPU/CPU), as the twin sizes it."""
        return int(gib * GIB // self.kv_bytes_per_token) // self.chunk_tokens

    def gib_for_chunks(self, chunks: int) -> float:
        return chunks * self.chunk_tokens * self.kv_bytes_per_token / GIB

    @property
    def current_gib(self) -> float:
        return self.gib_for_chunks(self.current_chunks)

    def hit_chunks_at(self, chunks: int) -> float:
        """Chunk hits over the whole stream with a tier of `chunks` chunks (per pod for GPU/CPU)."""
        i = int(np.searchsorted(self.levels, chunks, side="left"))  # levels < chunks hit
        return float(self.cum_hit_chunks[i - 1]) if i else 0.0

    def hit_tokens_at(self, chunks: int) -> float:
        return self.hit_chunks_at(chunks) * self.chunk_tokens

    def hit_ratio_at(self, chunks: int) -> float:
        return min(self.hit_tokens_at(chunks) / self.lookup_tokens, 1.0) if self.lookup_tokens else 0.0

    def hit_ratio(self, gib: float) -> float:
        """Hit tokens / lookup tokens of this tier with `gib` GiB (per pod for GPU/CPU)."""
        return self.hit_ratio_at(self.chunks_for_gib(gib))

    def hit_tokens(self, gib: float) -> float:
        return self.hit_tokens_at(self.chunks_for_gib(gib))

    def prompt_share(self, gib: float) -> float:
        """Hit tokens / all prompt tokens: the part of the prefill this tier would serve."""
        return self.hit_tokens(gib) / self.prompt_tokens if self.prompt_tokens else 0.0

    @property
    def max_useful_chunks(self) -> int:
        """The smallest capacity at which every reuse the stream offers this tier hits."""
        return int(self.levels[-1]) + 1 if len(self.levels) else 0

    @property
    def max_useful_gib(self) -> float:
        return self.gib_for_chunks(self.max_useful_chunks)

    def grid(self, gibs: Sequence[float]) -> list[tuple[float, float]]:
        """(capacity GiB, hit ratio) at each of `gibs`."""
        return [(float(g), self.hit_ratio(g)) for g in gibs]

    def default_grid(self, points: int = 9, cap_gib: float | None = None) -> list[float]:
        """Capacities worth showing: 0, round steps up to the useful maximum (or `cap_gib`), and
        the size in force."""
        top = max(self.max_useful_gib, 1.0)
        if cap_gib is not None and cap_gib > 0:
            top = min(top, cap_gib)
        step = _round_step(top / max(points - 1, 1))
        out = {0.0, round(self.current_gib, 2)}
        k = 1
        while step * k < top + step * 0.999 and (cap_gib is None or cap_gib <= 0 or step * k <= cap_gib + 1e-9):
            out.add(round(step * k, 2))
            k += 1
        return sorted(out)


def _round_step(x: float) -> float:
    for s in (0.25, 0.5, 1, 2, 4, 5, 8, 10, 16, 20, 25, 32, 50, 64, 100, 128, 200, 256, 500, 1000):
        if x <= s:
            return float(s)
    return float(np.ceil(x / 1000.0) * 1000.0)


# -- the streams -----------------------------------------------------------------------------------
def _dense_chunks(frame: pl.DataFrame, chunk_tokens: int) -> tuple[np.ndarray, np.ndarray]:
    """(each chunk hash as a small integer id, offsets per request) for an arrival-ordered frame."""
    counts = frame["hash_ids"].list.len().to_numpy()
    block_offsets = np.zeros(len(counts) + 1, dtype=np.int64)
    np.cumsum(counts, out=block_offsets[1:])
    flat_ids = frame["hash_ids"].explode().drop_nulls().to_numpy()
    flat, offsets = chunk_hash_array(None, frame["input_length"].to_numpy(), chunk_tokens, flat_ids=flat_ids,
                                     block_offsets=block_offsets)
    _, dense = np.unique(flat, return_inverse=True)
    return dense.astype(np.int64).reshape(-1), offsets


def _gather(ids: np.ndarray, offsets: np.ndarray, skip: np.ndarray, order: np.ndarray,
            salt: np.ndarray | None, salts: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The references of requests `order`, each from its chunk `skip` on: (keys, request
    boundaries, index into `order` of each reference's request). `salt` (pod per request) makes
    keys distinct per pod, so one pass covers every pod's own tier."""
    first = offsets[:-1][order] + skip[order]
    counts = np.maximum(offsets[1:][order] - first, 0)
    starts = np.zeros(len(order) + 1, dtype=np.int64)
    np.cumsum(counts, out=starts[1:])
    req = np.repeat(np.arange(len(order), dtype=np.int64), counts)
    pos = first[req] + (np.arange(int(starts[-1]), dtype=np.int64) - starts[:-1][req])
    keys = ids[pos]
    if salt is not None:
        keys = keys * salts + salt[order][req]
    return keys, starts, req


def _prefix_max(dist: np.ndarray, req: np.ndarray) -> np.ndarray:
    """The running maximum of the distances within each request (a prompt stops at its first miss)."""
    n = len(dist)
    if not n:
        return dist
    top = np.int64(n + 1)  # above any finite distance: stands for NEVER while shifted
    span = np.int64(n + 2)
    shifted = np.minimum(dist, top) + req * span
    pm = np.maximum.accumulate(shifted) - req * span
    pm[pm == top] = NEVER
    return pm


def _tier_pass(keys: np.ndarray, starts: np.ndarray, req: np.ndarray, counted: np.ndarray,
               rate: float) -> tuple[np.ndarray, np.ndarray]:
    """(distinct hit levels, cumulative chunk hits) of one stream; `counted`: per reference,
    whether its request may hit this tier."""
    scale = 1.0
    if rate < 1.0:
        keep = sample_mask(keys, rate)
        # ratio estimate: hits per sampled reference x all references (a hot key drawn into, or
        # left out of, the sample moves both, so it does not bias the ratio as 1 / rate would)
        scale = len(keys) / max(int(keep.sum()), 1)
        cum = np.zeros(len(keys) + 1, dtype=np.int64)
        np.cumsum(keep, out=cum[1:])
        keys, starts, req, counted = keys[keep], cum[starts], req[keep], counted[keep]
        dist = reuse_distances(keys, starts)
        finite = dist != NEVER
        dist[finite] = np.floor(dist[finite] / rate).astype(np.int64)
    else:
        dist = reuse_distances(keys, starts)
    pm = _prefix_max(dist, req)
    pm = pm[counted & (pm != NEVER)]
    levels, counts = np.unique(pm, return_counts=True)
    return levels, np.cumsum(counts).astype(np.float64) * scale


def tier_curves(workload: pl.DataFrame, cluster: ClusterSpec, knobs: Knobs, *,
                profile: HardwareProfile | str | None = None, run: ReplayResult | None = None,
                sample_rate: float = 1.0, placement: np.ndarray | None = None) -> dict[str, TierCurve]:
    """The GPU, CPU and L2 curves of a workload under `knobs` (one pass per tier).

    `run`: a replay (or observed run) of this workload at `knobs` giving each request's pod and
    its GPU and CPU hits; None replays it once, sending each request to its pod in `placement`,
    by default the pods that served an observed stream (`simulator.records.observed_placement`: a
    frame rebuilt from KV events knows them), else routing it.
    `sample_rate` < 1: SHARDS sampling of the keys (fleet scale), hits rescaled; 1.0 is exact.
    """
    frame = check_workload(workload)
    if run is None:
        if placement is None:
            placement = observed_placement(workload, cluster.pods)
        # the frame as given: a placement follows its order, which replay checks
        run = replay(workload, cluster, knobs, profile=profile, placement=placement)
    c = knobs.chunk_tokens
    caps = run.capacities
    ids, offsets = _dense_chunks(frame, c)
    r = run.requests
    if r.height != frame.height:
        raise ValueError(f"run has {r.height} requests, the workload {frame.height}")
    pods = r["pod_index"].to_numpy().astype(np.int64)
    prompt = r["prompt_tokens"].to_numpy().astype(np.int64)
    gpu_hit = r["gpu_hit_tokens"].to_numpy().astype(np.int64) // c
    cpu_hit = r["cpu_hit_tokens"].to_numpy().astype(np.int64) // c
    n_pods = run.cluster.pods
    n_req = frame.height
    by_pod = np.argsort(pods, kind="stable")
    arrival = np.arange(n_req, dtype=np.int64)
    zero = np.zeros(n_req, dtype=np.int64)
    l2_ok = prompt >= knobs.l2_min_prompt_tokens
    streams = {
        "gpu": (zero, by_pod, True, np.ones(n_req, dtype=bool), int(prompt.sum()), caps.gpu_tokens),
        "cpu": (gpu_hit, by_pod, True, np.ones(n_req, dtype=bool), int((prompt - gpu_hit * c).sum()),
                caps.cpu_tokens),
        "l2": (gpu_hit + cpu_hit, arrival, False, l2_ok, int((prompt - (gpu_hit + cpu_hit) * c)[l2_ok].sum()),
               caps.l2_tokens),
    }
    out: dict[str, TierCurve] = {}
    for tier, (skip, order, per_pod, may_hit, lookup, cap_tokens) in streams.items():
        keys, starts, req = _gather(ids, offsets, skip, order, pods if per_pod else None, n_pods)
        levels, cum = _tier_pass(keys, starts, req, may_hit[order][req], sample_rate)
        out[tier] = TierCurve(
            tier=tier, chunk_tokens=c, kv_bytes_per_token=caps.kv_bytes_per_token, pods=n_pods, requests=n_req,
            prompt_tokens=int(prompt.sum()), lookup_tokens=lookup, current_chunks=cap_tokens // c,
            sample_rate=float(sample_rate), levels=levels, cum_hit_chunks=cum,
        )
    return out
