"""The honest ceiling: the best static configuration per phase over everything the tuner may choose.

`ceiling(wl, cluster, space, memory_ms_per_gib=...)` searches, per phase, the deployment's whole
search space (every router, chunk size and L2 eviction policy it offers, the CPU buffer from 0 up
to the operator's headroom) under the tuner's own objective: TTFT p95 plus the memory price of the
CPU buffer pinned across the fleet (`tuners.objective.ObjectiveSpec`), ties broken by the mean.
It runs once with the configured memory price and once with memory priced at 0, sharing every
replay (a configuration is replayed once over the whole stream, warm, and scored on every phase).

The search is a coordinate descent from the best of the seeds (the held and the end-of-phase
configurations): each pass tries every value of every dimension with the others held at the
phase's best so far, until a pass changes nothing. The CPU buffer is tried on `cpu_levels`, a
ladder from 0 to the headroom. `exhaustive=True` replays the full product instead (slow: the
cross-check of the coordinate search).
"""
from __future__ import annotations

import dataclasses
import itertools
import math
from collections.abc import Callable, Sequence

import numpy as np

from contracts.knobs import Knobs
from emulator.demo.workload import DemoWorkload
from simulator.cluster import ClusterSpec
from tuners.space import SearchSpace

CPU_LADDER_GIB = (0.0, 2.0, 5.0, 8.0, 12.0, 16.0, 24.0, 32.0, 48.0, 64.0, 96.0, 128.0)
CEILING_DIMS = ("router", "cpu_gib", "chunk_tokens", "l2_eviction")
PhaseTtfts = Callable[[Knobs], dict[int, np.ndarray]]


@dataclasses.dataclass(frozen=True)
class Ceiling:
    """Per phase: the best configuration found, its TTFT (s) of that phase's requests, and its
    objective value (p95 + memory cost, s). label: how it was searched, for the report."""

    ttft: dict[int, np.ndarray]
    best: dict[int, Knobs]
    objective_s: dict[int, float]
    memory_ms_per_gib: float
    replays: int
    label: str


def cpu_levels(headroom_gib: float, step: float = 1.0) -> tuple[float, ...]:
    """The CPU buffer sizes the ceiling tries: the ladder up to the headroom, and the headroom."""
    top = math.floor(headroom_gib / step + 1e-9) * step
    return tuple(sorted({g for g in CPU_LADDER_GIB if g <= top} | {top}))


def dimension_values(space: SearchSpace) -> dict[str, tuple]:
    """What the ceiling varies: the space's router, chunk and L2 eviction choices (a coupled
    dimension moves its coupled knobs with it), and the CPU buffer ladder up to the headroom."""
    out: dict[str, tuple] = {}
    for d in space.dimensions:
        if d.name in ("router", "chunk_tokens", "l2_eviction", "cpu_eviction"):
            out[d.name] = tuple(d.grid())
        elif d.name == "cpu_gib":
            out["cpu_gib"] = cpu_levels(space.limits.node_memory_headroom_gib, space.limits.cpu_gib_step)
    return out


def objective_key(x: np.ndarray, knobs: Knobs, pods: int, memory_ms_per_gib: float) -> tuple[float, float]:
    p95 = float(np.quantile(x, 0.95)) if x.size else math.inf
    mean = float(x.mean()) if x.size else math.inf
    return p95 + memory_ms_per_gib / 1000.0 * knobs.cpu_gib * pods, mean


class _Replays:
    def __init__(self, phase_ttfts: PhaseTtfts) -> None:
        self.fn = phase_ttfts
        self.cache: dict[Knobs, dict[int, np.ndarray]] = {}

    def __call__(self, knobs: Knobs) -> dict[int, np.ndarray]:
        if knobs not in self.cache:
            self.cache[knobs] = self.fn(knobs)
        return self.cache[knobs]


def _with(space: SearchSpace, knobs: Knobs, name: str, value: object) -> Knobs:
    params = space.to_params(knobs)
    params[name] = value
    out = space.to_knobs(params)
    return out if name != "cpu_gib" else out.replace(cpu_gib=float(value))  # type: ignore[arg-type]


def _search_one(replays: _Replays, phases: Sequence[int], space: SearchSpace, values: dict[str, tuple],
                seeds: Sequence[Knobs], price: float, exhaustive: bool,
                max_passes: int) -> dict[int, tuple[tuple[float, float], Knobs]]:
    pods = space.limits.pods
    best: dict[int, tuple[tuple[float, float], Knobs]] = {}

    def consider(knobs: Knobs, only: int | None = None) -> None:
        for p, x in replays(knobs).items():
            if only is not None and p != only:
                continue
            key = objective_key(x, knobs, pods, price)
            if p not in best or key < best[p][0]:
                best[p] = (key, knobs)

    if exhaustive:
        names = list(values)
        for combo in itertools.product(*(values[n] for n in names)):
            k = seeds[0]
            for n, v in zip(names, combo):
                k = _with(space, k, n, v)
            consider(k)
        return best
    for k in seeds:
        consider(k)
    for p in phases:
        if p not in best:
            continue
        for _ in range(max_passes):
            start = best[p][1]
            for name in (n for n in CEILING_DIMS if n in values):
                here = best[p][1]
                for v in values[name]:
                    consider(_with(space, here, name, v), only=p)
            if best[p][1] == start:
                break
    return best


def search_ceiling(phase_ttfts: PhaseTtfts, phases: Sequence[int], space: SearchSpace, seeds: Sequence[Knobs], *,
                   memory_prices: Sequence[float], exhaustive: bool = False,
                   max_passes: int = 4) -> list[Ceiling]:
    """One `Ceiling` per memory price (pure, given `phase_ttfts`: knobs -> per-phase TTFT arrays)."""
    replays = _Replays(phase_ttfts)
    values = dimension_values(space)
    label = ("exhaustive over " if exhaustive else "coordinate search over ") + ", ".join(
        f"{n} ({len(v)})" for n, v in values.items())
    out = []
    for price in memory_prices:
        best = _search_one(replays, phases, space, values, seeds, price, exhaustive, max_passes)
        out.append(Ceiling({p: replays(k)[p] for p, (_key, k) in best.items()}, {p: k for p, (_key, k) in best.items()},
                           {p: key[0] for p, (key, _k) in best.items()}, price, len(replays.cache), label))
    return out


def ceiling(wl: DemoWorkload, cluster: ClusterSpec, space: SearchSpace, seeds: Sequence[Knobs], *,
            memory_ms_per_gib: float, exhaustive: bool = False) -> tuple[Ceiling, Ceiling]:
    """(under the tuner's memory price, with memory priced at 0) over `wl` on `cluster`."""
    from emulator.demo.sim_run import phase_ttfts

    phases = sorted(set(wl.frame["phase"].unique().to_list()))
    prices = (memory_ms_per_gib, 0.0) if memory_ms_per_gib else (0.0,)
    found = search_ceiling(lambda k: phase_ttfts(wl.frame, cluster, k), phases, space, seeds,
                           memory_prices=prices, exhaustive=exhaustive)
    return (found[0], found[-1])


__all__ = ["CPU_LADDER_GIB", "Ceiling", "ceiling", "cpu_levels", "dimension_values", "search_ceiling"]
