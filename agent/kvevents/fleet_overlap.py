"""The drift detector's `reuse_ratio` when the agent is sharded: the fleet's workload overlap,
merged from every shard's window reading and cold-block sketch (pure functions + one reader).

Unsharded (workload.py), overlap = 1 - (cold + tail) / P over the window: P prompt tokens, cold
the tokens of blocks never seen anywhere in the fleet, tail the prompts' unhashed last chunks.
Sharded, each replica follows only its pods' KV events. P and tail are per pod, so they add up
across shards; cold does not: a block first stored on a pod of shard A and later on a pod of
shard B is new to both indexes. The fleet's cold set is the union of the shards' cold sets, so
each replica also sketches the hashes its index counted cold (a HyperLogLog per time slot next
to the exact count, fleet.py) and the merge scales the summed cold tokens by

    u = |union of the shards' cold sets| / sum over shards of |cold set|     (HLL union / exact)
    fleet overlap = 1 - (u x sum(cold_i) + sum(tail_i)) / sum(P_i)

u is the share of shard-cold blocks the fleet had not seen either; the rest (1 - u) were stored
on another shard's pod first, and count as routing misses in the merged reading (fleet-wide
they are routing or capacity misses; the split is not observable from the sketches).

Error bound: the union's estimate has relative standard error e = 1.04 / sqrt(2^16) (0.41%), so
with 99.7% confidence the fleet cold share is within 3e of itself and the overlap within
3e x (cold tokens / P) <= 3e x (1 - overlap): at most 1.2 percentage points, whatever the fleet
size. Not covered by the bound: a block first stored on one shard before the window and first on
another inside it counts as cold (the unsharded index remembers it); this vanishes when the
window covers the workload's reuse distances, and tests/test_kv_fleet_overlap.py measures it on a
window that starts mid-run. u comes from the sketches' whole slots, the token sums from the
counters' window; both cover the same `window_s`.

`FleetOverlap.current_overlap(model, window_s)` has the signature of
`KvEventManager.current_overlap`, so `drift_signals` (agent/runtime/tuning_bridge.py) reads the
fleet through it unchanged. A shard that does not answer makes the read raise
`contracts.fleet.PartialFleetError` (never a partial fleet presented as whole).
"""
from __future__ import annotations

import json
import math
from collections.abc import Callable, Iterable, Mapping, Sequence

from agent.kvevents.fleet import BlockSketches
from agent.kvevents.hll import HyperLogLog, relative_error
from agent.kvevents.workload import OverlapReading
from contracts.fleet import PartialFleetError

_FIELDS = ("start", "end", "prompt_tokens", "cold_tokens", "capacity_tokens", "routing_tokens", "l1_hit_tokens")
_OPTIONAL = ("tail_tokens", "l2_hit_tokens", "computed_tokens", "l2_unmatched_tokens")


def overlap_state(readings: Mapping[str, OverlapReading | None], blocks: BlockSketches | None) -> dict:
    """This replica's window readings per model, each with the cold sketches over its span
    (`blocks`, when kept), as served in `/kv/sketch` (`overlap`)."""
    out = {}
    for model, r in readings.items():
        if r is None:
            continue
        out[model] = {**{f: float(getattr(r, f)) for f in _FIELDS}, **{f: getattr(r, f) for f in _OPTIONAL}}
        if blocks is not None:
            out[model]["cold"] = blocks.cold_state(model, r.start, r.end)
    return out


def _reading(model: str, doc: object) -> dict[str, float | None]:
    if not isinstance(doc, Mapping):
        raise ValueError(f"model {model!r}: overlap reading is not an object")  # noqa: TRY004 - bad input
    try:
        out: dict[str, float | None] = {f: float(doc[f]) for f in _FIELDS}
        for f in _OPTIONAL:
            out[f] = None if doc.get(f) is None else float(doc[f])
    except (KeyError, TypeError, ValueError) as exc:
        raise ValueError(f"model {model!r}: malformed overlap reading ({exc})") from None
    if not all(v is None or math.isfinite(v) for v in out.values()):
        raise ValueError(f"model {model!r}: overlap reading with a non-finite value")
    return out


def validate(state: object) -> None:
    """ValueError unless `state` carries well-formed overlap readings and cold sketches."""
    if not isinstance(state, Mapping) or not isinstance(state.get("overlap", {}), Mapping):
        raise ValueError("sketch state without an `overlap` object")  # noqa: TRY004 - bad input, one error kind
    for model, doc in state.get("overlap", {}).items():
        _reading(model, doc)
        _cold(model, doc)


def _cold(model: str, doc: Mapping) -> tuple[HyperLogLog | None, HyperLogLog | None, int]:
    """A shard's cold sketches over its reading's span and before it, and the exact count."""
    cold = doc.get("cold")
    if cold is None:
        return None, None, 0
    try:
        p = int(cold["p"])
        return (HyperLogLog.from_text(p, str(cold["registers"])),
                HyperLogLog.from_text(p, str(cold["before_registers"])), int(cold["blocks"]))
    except (KeyError, TypeError, ValueError) as exc:
        raise ValueError(f"model {model!r}: malformed cold sketch ({exc})") from None


def _union(acc: HyperLogLog | None, h: HyperLogLog | None) -> HyperLogLog | None:
    if h is None:
        return acc
    return h.copy() if acc is None else acc.merge(h)


def merge_overlap(states: Sequence[Mapping], model: str | None = None) -> OverlapReading | None:
    """The fleet's reading merged from every shard's `/kv/sketch` state (None without prompt
    tokens; with `model=None` the single model the shards report, None if several)."""
    return merge_overlap_bounded(states, model)[0]


def merge_overlap_bounded(states: Sequence[Mapping], model: str | None = None
                          ) -> tuple[OverlapReading | None, float]:
    """`merge_overlap` and the 3-sigma error bound of its ratio from the sketches' estimates."""
    if model is None:
        models = {m for st in states for m in st.get("overlap", {})}
        if len(models) != 1:
            return None, math.nan
        model = next(iter(models))
    sums = dict.fromkeys(_FIELDS, 0.0)
    sums["start"], sums["end"] = math.inf, -math.inf
    tail: float | None = 0.0
    l2: float | None = 0.0
    inside: HyperLogLog | None = None
    before: HyperLogLog | None = None
    cold_blocks = 0
    seen = False
    for st in states:
        doc = st.get("overlap", {}).get(model)
        if doc is None:
            continue
        h_in, h_before, n = _cold(model, doc)
        inside, before = _union(inside, h_in), _union(before, h_before)
        cold_blocks += n
        r = _reading(model, doc)
        seen = True
        for f in _FIELDS:
            v = r[f]
            assert v is not None
            sums[f] = min(sums[f], v) if f == "start" else max(sums[f], v) if f == "end" else sums[f] + v
        tail = None if tail is None or r["tail_tokens"] is None else tail + _tail(r)
        l2 = None if l2 is None or r["l2_hit_tokens"] is None else l2 + r["l2_hit_tokens"]
    p = sums["prompt_tokens"]
    if not seen or p <= 0:
        return None, math.nan
    u, spread = 1.0, 0.0
    if cold_blocks > 0 and inside is not None:
        e = relative_error(inside.p)
        if before is None:
            fleet_cold, spread = inside.estimate(), e * inside.estimate()
        else:
            everything = before.copy().merge(inside).estimate()
            fleet_cold = everything - before.estimate()
            spread = e * math.hypot(everything, before.estimate())
        u = min(1.0, max(0.0, fleet_cold / cold_blocks))
        spread = spread / cold_blocks  # in units of u
    cold = u * sums["cold_tokens"]
    ratio = min(1.0, max(0.0, 1.0 - (cold + (tail or 0.0)) / p))
    reading = OverlapReading(model, sums["start"], sums["end"], p, ratio, cold, sums["capacity_tokens"],
                             sums["routing_tokens"] + sums["cold_tokens"] - cold, tail, sums["l1_hit_tokens"], l2)
    return reading, 3 * spread * sums["cold_tokens"] / p


def _tail(r: Mapping[str, float | None]) -> float:
    """A shard's tail with the L2 hits its index took for cold taken out of its computed blocks."""
    computed, tail = r.get("computed_tokens"), r["tail_tokens"]
    assert tail is not None
    if computed is None:
        return tail
    full = (r["cold_tokens"] or 0.0) - (r.get("l2_unmatched_tokens") or 0.0) + (r["capacity_tokens"] or 0.0) \
        + (r["routing_tokens"] or 0.0)
    return max(0.0, computed - full)


Fetch = Callable[[str, float], bytes]


class FleetOverlap:
    """`current_overlap(model, window_s)` over this replica and every peer's `/kv/sketch`.

    `local(window_s)` gives this replica's state; `fetch(url, timeout)` reads a peer. A peer
    that fails (down, refused, malformed) is counted in `peer_errors` and the read raises
    `PartialFleetError`: the drift detector and the workload fit never take a partial fleet for
    the whole one (the tuning loop skips that cycle)."""

    def __init__(self, local: Callable[[float | None], dict], peers: Iterable[str], fetch: Fetch,
                 timeout_s: float = 5.0) -> None:
        self.local = local
        self.peers = tuple(p.rstrip("/") for p in peers)
        self.fetch = fetch
        self.timeout_s = timeout_s
        self.peer_errors: dict[str, int] = {}

    def states(self, window_s: float | None) -> list[dict]:
        states = [self.local(window_s)]
        query = "" if window_s is None else f"?window_s={window_s:g}"
        for peer in self.peers:
            try:
                doc = json.loads(self.fetch(f"{peer}/kv/sketch{query}", self.timeout_s))
                validate(doc)
            except (OSError, ValueError) as exc:  # json.JSONDecodeError is a ValueError
                self.peer_errors[peer] = self.peer_errors.get(peer, 0) + 1
                raise PartialFleetError(peer, str(exc) or type(exc).__name__) from None
            states.append(doc)
        return states

    def current_overlap(self, model: str | None = None, window_s: float | None = None) -> OverlapReading | None:
        return merge_overlap(self.states(window_s), model)


__all__ = ["FleetOverlap", "merge_overlap", "merge_overlap_bounded", "overlap_state", "validate"]
