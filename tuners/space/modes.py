"""The search space as the discovered deployment mode allows (pure).

The live agent's Kubernetes actuator says, per enum knob, which values its targets can express
(`accepted_values()`: LMCache in-process lru/lfu/fifo, the LMCache MP server lru/arc/isolated_lru/
noop, vllm-project/router its own policies) and which knobs are coupled (`coupled_knobs()`:
LMCache's cache_policy drives l2_eviction too while its local-disk backend is the L2).
`follow_deployment` narrows the space to that; `agent/runtime/tuning_bridge.restrict_space` calls it.
"""
from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from tuners.space import SearchSpace
from tuners.space.dimensions import Choice, Dimension


def follow_deployment(space: SearchSpace, accepted: Mapping[str, tuple[Any, ...]],
                      coupled: Mapping[str, str]) -> SearchSpace:
    """The space as the discovered deployment mode allows: each categorical dimension keeps only
    the values every actuation target accepts (LMCache MP: lru/arc, not lfu/fifo; vllm-project/
    router: its own policies), and a knob coupled to another (`{coupled: driver}`, e.g. LMCache's
    cache_policy driving a local-disk L2) becomes part of one dimension. A dimension left with no
    value is dropped (its knob stays fixed)."""
    dims = {d.name: d for d in space.dimensions}
    fixed = space.fixed
    for c, driver in coupled.items():
        if driver == "cpu_eviction" and c == "l2_eviction" and "l2_eviction" in dims:
            l2 = dims.pop("l2_eviction")
            cpu = dims.pop("cpu_eviction", None)
            allowed = cpu.values if isinstance(cpu, Choice) else space.limits.cpu_evictions
            values = tuple(v for v in l2.values if v in allowed)  # type: ignore[union-attr]
            dims["cpu_eviction"] = Choice("cpu_eviction", values, couples=("l2_eviction",))
            fixed = fixed.replace(l2_eviction=fixed.cpu_eviction)
    out: list[Dimension] = []
    for d in dims.values():
        if isinstance(d, Choice):
            knobs = (d.name, *d.couples)
            values = tuple(v for v in d.values if all(v in accepted.get(k, d.values) for k in knobs))
            if not values:
                continue
            d = dataclasses.replace(d, values=values)
        out.append(d)
    return dataclasses.replace(space, dimensions=tuple(out), fixed=fixed)
