"""The rebuilt workload of a sharded agent: each replica rebuilds its own pods, the leader merges.

A pod's chains never need another replica's records: the parent of what an engine stores is a
block on that engine's own GPU, which the engine stored itself (the replica following the pod saw
it). So a replica exports its window's requests already rebuilt, uncapped, with its pods' counters
(`window_state`, `encode_state`: msgpack, the arrays as raw little-endian bytes); the leader
decodes every replica's (`decode_state` checks shapes and sizes), keeps the requests whose key
falls in the highest sample level among them (hash sampling is the same rule everywhere, so the
parts stay comparable: recorder.py) and completes the union once, fleet-wide
(`MergedHistory`): outlier engines against the fleet's median, fully cached requests and partial
last blocks from every pod's counters.
"""
from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

import msgspec
import numpy as np
import polars as pl

from agent.kvevents.rebuild.chains import Rebuilt, empty
from agent.kvevents.rebuild.fill import PodRequests, concat
from agent.kvevents.rebuild.history import RebuiltHistory, capped_frame
from agent.kvevents.rebuild.log import sampled
from contracts.fleet import PartialFleetError

STATE_VERSION = 1
MAX_STATE_REFS = 200_000_000  # a state claiming more chain references than this is refused
_ARRAYS = {"ts": "<f8", "eng": "<i4", "bsize": "<i4", "own": "<i8", "offsets": "<i8", "flat": "<u8"}


class StateError(ValueError):
    """A replica's rebuilt-window state is malformed (the message says how)."""


def window_state(history: RebuiltHistory, now: float, seconds: float) -> dict[str, Any]:
    """This replica's requests in [now - seconds, now] and its pods' counters, mergeable."""
    r, level = history.stored(now, seconds)
    counts = history.counts(now - seconds, now) if history.counts is not None else {}
    arrays = {"ts": r.ts, "eng": r.eng, "bsize": r.block_size, "own": r.own, "offsets": r.offsets, "flat": r.flat}
    return {"version": STATE_VERSION, "level": level, "engines": list(r.engines),
            **{k: np.ascontiguousarray(v, dtype=_ARRAYS[k]).tobytes() for k, v in arrays.items()},
            "counts": {p: [c.requests, c.prompt_tokens, c.gpu_hit_tokens, [x for iv in c.intervals for x in iv]]
                       for p, c in counts.items()}}


def encode_state(state: Mapping[str, Any]) -> bytes:
    return msgspec.msgpack.encode(state)


def _array(state: Mapping[str, Any], key: str) -> np.ndarray:
    raw = state.get(key)
    if not isinstance(raw, bytes):
        raise StateError(f"rebuilt state: {key} must be bytes")
    dtype = np.dtype(_ARRAYS[key])
    if len(raw) % dtype.itemsize:
        raise StateError(f"rebuilt state: {key} is {len(raw)} bytes, not a whole number of {dtype}")
    return np.frombuffer(raw, dtype=dtype).astype(dtype.newbyteorder("="))


def decode_state(data: bytes) -> tuple[Rebuilt, dict[str, PodRequests], int]:
    """A replica's state -> (its requests, its pods' counters, its sample level); StateError when
    it is malformed (inconsistent lengths, offsets out of range, an unknown engine)."""
    try:
        state = msgspec.msgpack.decode(data)
    except msgspec.DecodeError as exc:
        raise StateError(f"rebuilt state: not msgpack ({exc})") from None
    if not isinstance(state, dict) or state.get("version") != STATE_VERSION:
        raise StateError(f"rebuilt state: expected a map with version {STATE_VERSION}")
    level, engines = state.get("level"), state.get("engines")
    if not isinstance(level, int) or not 0 <= level < 64:
        raise StateError("rebuilt state: level must be an integer in 0..63")
    if not isinstance(engines, list) or not all(isinstance(e, str) for e in engines):
        raise StateError("rebuilt state: engines must be a list of names")
    a = {k: _array(state, k) for k in _ARRAYS}
    n = len(a["ts"])
    if any(len(a[k]) != n for k in ("eng", "bsize", "own")) or len(a["offsets"]) != n + 1:
        raise StateError("rebuilt state: per-request arrays of different lengths")
    off = a["offsets"]
    if len(a["flat"]) > MAX_STATE_REFS or off[0] != 0 or off[-1] != len(a["flat"]) or (np.diff(off) < 0).any():
        raise StateError("rebuilt state: offsets do not index the chains")
    if n and (a["eng"].min() < 0 or a["eng"].max() >= len(engines)):
        raise StateError("rebuilt state: an engine id out of range")
    counts = {}
    for pod, v in (state.get("counts") or {}).items():
        if not (isinstance(pod, str) and isinstance(v, list) and len(v) in (3, 4)):
            raise StateError("rebuilt state: counts must map pods to [requests, prompt tokens, GPU hit tokens, "
                             "intervals]")
        counts[pod] = PodRequests(float(v[0]), None if v[1] is None else float(v[1]), None if v[2] is None else float(v[2]),
                                  _intervals(v[3] if len(v) == 4 else []))
    return Rebuilt(a["ts"], a["eng"], a["bsize"], a["own"], a["flat"], off, tuple(engines)), counts, level


def _intervals(flat: Any) -> tuple[tuple[float, float, float], ...]:
    """[start, end, requests, ...] -> PodRequests.intervals; StateError when malformed."""
    if not isinstance(flat, list) or len(flat) % 3 or not all(isinstance(x, (int, float)) for x in flat):
        raise StateError("rebuilt state: a pod's intervals must be a flat list of (start, end, requests) numbers")
    return tuple((float(flat[i]), float(flat[i + 1]), float(flat[i + 2])) for i in range(0, len(flat), 3))


def _renamed(r: Rebuilt, names: Sequence[str]) -> Rebuilt:
    """`r` with its engine ids in the list `names` (which holds all of r's engines)."""
    index = {n: i for i, n in enumerate(names)}
    remap = np.array([index[e] for e in r.engines], dtype=np.int32) if r.engines else np.zeros(0, dtype=np.int32)
    return Rebuilt(r.ts, remap[r.eng] if r.requests else r.eng, r.block_size, r.own, r.flat, r.offsets, tuple(names))


def merge_states(parts: Iterable[tuple[Rebuilt, Mapping[str, PodRequests], int]]
                 ) -> tuple[Rebuilt, dict[str, PodRequests], int]:
    """Every replica's requests at the highest sample level among them, one engine list, arrival
    order; the counters of every pod."""
    parts = list(parts)
    level = max((lv for _r, _c, lv in parts), default=0)
    names = sorted({e for r, _c, _lv in parts for e in r.engines})
    out = empty(tuple(names))
    counts: dict[str, PodRequests] = {}
    for r, c, _lv in parts:
        if r.requests:
            keep = sampled(r.keys, level)
            out = concat(out, _renamed(r.take(keep), names))
        counts.update(c)
    return out, counts, level


def peer_states(peers: Iterable[str], fetch: Callable[[str, float], bytes], timeout_s: float
                ) -> Callable[[float, float], list[bytes]]:
    """`peers(now, seconds)` for MergedHistory: every peer's `GET /kv/rebuilt?since=&until=`.
    A peer that does not answer raises contracts.fleet.PartialFleetError (no plan on part of the
    fleet)."""
    urls = tuple(p.rstrip("/") for p in peers)

    def states(now: float, seconds: float) -> list[bytes]:
        out = []
        for peer in urls:
            try:
                out.append(bytes(fetch(f"{peer}/kv/rebuilt?since={now - seconds!r}&until={now!r}", timeout_s)))
            except (OSError, ValueError) as exc:
                raise PartialFleetError(peer, str(exc) or type(exc).__name__) from None
        return out
    return states


def serve_state(history: RebuiltHistory) -> Callable[[dict[str, str]], tuple[bytes, str]]:
    """The `/kv/rebuilt?since=T0&until=T1` handler: this replica's window, encoded."""
    def handler(query: dict[str, str]) -> tuple[bytes, str]:
        try:
            since, until = float(query["since"]), float(query["until"])
        except (KeyError, ValueError):
            raise ValueError("/kv/rebuilt needs since and until, in seconds") from None
        if not until >= since:
            raise ValueError("/kv/rebuilt: until must not be before since")
        return encode_state(window_state(history, until, until - since)), "application/x-msgpack"
    return handler


class MergedHistory:
    """The leader's `history(now, seconds)`: its own replica's window merged with every peer's
    (`peers(now, seconds)` returns their encoded states), completed fleet-wide."""

    kind = "rebuilt"

    def __init__(self, local: RebuiltHistory, peers: Callable[[float, float], list[bytes]]) -> None:
        self.local, self.peers = local, peers

    def window(self, now: float, seconds: float):  # -> RebuiltWindow
        own = decode_state(encode_state(window_state(self.local, now, seconds)))
        r, counts, level = merge_states([own, *(decode_state(b) for b in self.peers(now, seconds))])
        return self.local.finish(r, counts if counts else None, level, now - seconds, now)

    def __call__(self, now: float, seconds: float) -> pl.DataFrame:
        return capped_frame(self.local, self.window(now, seconds))
