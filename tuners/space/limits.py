"""What the deployment allows: the limits the search space is derived from.

`DeploymentLimits` bounds the space: the node memory headroom caps the CPU buffer, the L2 pool has
a fixed size (it is not a knob), and the L2 backend decides which eviction policies and thresholds
exist. `TargetAcceptance` is what the deployment's actuation targets can express
(`target_violations` lists a configuration's breaches of it). `memory_cost_gib` is the host memory
a configuration pins across the fleet. A value outside any of these is a `CandidateError`.
"""
from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from typing import Any

from contracts.knobs import (
    CHUNK_TOKEN_CHOICES,
    CPU_EVICTION_CHOICES,
    L2_EVICTION_CHOICES,
    ROUTER_CHOICES,
    KnobError,
    Knobs,
)
from simulator.policies import POLICIES
from simulator.router import ROUTERS

# L2 backend -> (eviction policies it offers, whether it has high/low watermarks).
L2_BACKENDS: dict[str, tuple[tuple[str, ...], bool]] = {
    # Curvine quota eviction: lru|lfu with quota_eviction_high_rate / _low_rate.
    "curvine": (("lru", "lfu"), True),
    # LMCache local disk backend: cache_policy LRU|LFU|FIFO, no watermarks.
    "lmcache": (("lru", "lfu", "fifo"), False),
    # The digital twin implements every policy in Knobs, with watermarks.
    "twin": (L2_EVICTION_CHOICES, True),
    # No shared L2 (production-stack style: LMCache CPU offload only): no L2 knob exists.
    "none": ((), False),
}
DEFAULT_WATERMARKS: tuple[tuple[float, float], ...] = ((1.0, 1.0), (0.9, 0.8), (0.8, 0.6))
# What the digital twin can evaluate: a candidate outside these is never proposed (the knob values
# of vllm-project/router's other policies, LMCache MP's IsolatedLRU and noop exist, but the twin
# has no model of them).
TWIN_ROUTERS: tuple[str, ...] = tuple(r for r in ROUTER_CHOICES if r in ROUTERS)
TWIN_CPU_EVICTIONS: tuple[str, ...] = tuple(p for p in CPU_EVICTION_CHOICES if p in POLICIES)


class CandidateError(KnobError):
    """A candidate configuration outside the deployment's limits. Never applied."""


@dataclasses.dataclass(frozen=True)
class TargetAcceptance:
    """What the deployment's actuation targets accept (built from the targets file `tierpilot k8s`
    uses, by agent/k8s/offline.py).

    accepts: knob -> the values some target can express (None: any number); a knob is absent when
    no target owns it.
    fixed: the value of every knob no target owns (`fixed_knobs` of the targets file, else the
    component default): the tuner must leave those alone.
    source: the targets file, for messages.
    above: knob -> the value it must exceed (a numeric knob some target refuses at or below it,
        e.g. vLLM's native CPU tier refuses 0 bytes): the dimension starts at its first step above.
    """

    accepts: Mapping[str, tuple[Any, ...] | None]
    fixed: Mapping[str, Any]
    source: str = "targets"
    above: Mapping[str, float] = dataclasses.field(default_factory=dict)


@dataclasses.dataclass(frozen=True)
class DeploymentLimits:
    """What the deployment allows; the search space is derived from it.

    pods: serving pods in the fleet (memory cost = cpu_gib x pods).
    node_memory_headroom_gib: host memory free per pod for the LMCache CPU buffer (caps cpu_gib).
    cpu_budget_gib: optional fleet-wide cap on cpu_gib x pods (a constraint, not a bound).
    cpu_gib_step: resolution of the CPU buffer dimension.
    l2_pool_gib: size of the shared L2 pool; fixed, so not a knob.
    l2_backend: one of L2_BACKENDS; decides eviction choices and whether watermarks exist.
    watermarks: (high, low) pairs to try when the backend has watermarks.
    chunk_choices / routers: allowed values (subsets of the Knobs choices).
    l2_threshold_max / l2_threshold_step: the L2 read threshold range 0..max tokens.
    """

    pods: int = 4
    node_memory_headroom_gib: float = 32.0
    cpu_budget_gib: float | None = None
    cpu_gib_step: float = 1.0
    l2_pool_gib: float = 1024.0
    l2_backend: str = "twin"
    watermarks: tuple[tuple[float, float], ...] = DEFAULT_WATERMARKS
    chunk_choices: tuple[int, ...] = CHUNK_TOKEN_CHOICES
    routers: tuple[str, ...] = TWIN_ROUTERS
    cpu_evictions: tuple[str, ...] = TWIN_CPU_EVICTIONS
    l2_threshold_max: int = 4096
    l2_threshold_step: int = 256

    def __post_init__(self) -> None:
        if not isinstance(self.pods, int) or self.pods < 1:
            raise CandidateError(f"limits.pods: must be an integer >= 1, got {self.pods!r}")
        if self.node_memory_headroom_gib < 0:
            raise CandidateError(
                f"limits.node_memory_headroom_gib: must be >= 0, got {self.node_memory_headroom_gib!r}")
        if self.cpu_budget_gib is not None and self.cpu_budget_gib < 0:
            raise CandidateError(f"limits.cpu_budget_gib: must be >= 0, got {self.cpu_budget_gib!r}")
        if self.cpu_gib_step <= 0:
            raise CandidateError(f"limits.cpu_gib_step: must be > 0, got {self.cpu_gib_step!r}")
        if self.l2_pool_gib <= 0:
            raise CandidateError(f"limits.l2_pool_gib: must be > 0, got {self.l2_pool_gib!r}")
        if self.l2_backend not in L2_BACKENDS:
            raise CandidateError(
                f"limits.l2_backend: invalid value {self.l2_backend!r}; valid choices: "
                f"{', '.join(L2_BACKENDS)}")
        _check_subset("limits.chunk_choices", self.chunk_choices, CHUNK_TOKEN_CHOICES)
        _check_subset("limits.routers", self.routers, TWIN_ROUTERS)
        _check_subset("limits.cpu_evictions", self.cpu_evictions, TWIN_CPU_EVICTIONS)
        for high, low in self.watermarks:
            if not (0.0 < low <= high <= 1.0):
                raise CandidateError(
                    f"limits.watermarks: pair ({high}, {low}) must satisfy 0 < low <= high <= 1")
        if not self.watermarks:
            raise CandidateError("limits.watermarks: need at least one (high, low) pair")
        if not 0 <= self.l2_threshold_max or self.l2_threshold_step <= 0:
            raise CandidateError("limits.l2_threshold_max must be >= 0 and l2_threshold_step > 0")

    @property
    def cpu_gib_max(self) -> float:
        """The largest CPU buffer the grid reaches: headroom rounded down to the step."""
        return math.floor(self.node_memory_headroom_gib / self.cpu_gib_step + 1e-9) * self.cpu_gib_step

    @property
    def l2_evictions(self) -> tuple[str, ...]:
        return L2_BACKENDS[self.l2_backend][0]

    @property
    def has_watermarks(self) -> bool:
        return L2_BACKENDS[self.l2_backend][1]

    @property
    def has_l2(self) -> bool:
        return self.l2_backend != "none"



def target_violations(knobs: Knobs, acc: TargetAcceptance) -> list[str]:
    """Knob values the targets cannot express, and changes to knobs no target owns."""
    out = []
    for name, value in knobs.to_dict().items():
        if name in acc.accepts:
            allowed = acc.accepts[name]
            if allowed is not None and value not in allowed:
                out.append(f"{name}={value!r} is not accepted by the targets in {acc.source}; "
                           f"valid: {', '.join(map(str, allowed))}")
        elif name in acc.fixed and value != acc.fixed[name]:
            out.append(f"{name}={value!r}: no target in {acc.source} owns {name}; the cluster keeps "
                       f"{acc.fixed[name]!r}")
    return out


def memory_cost_gib(knobs: Knobs, limits: DeploymentLimits) -> float:
    """Host memory the configuration pins across the fleet: the CPU buffer on every pod."""
    return knobs.cpu_gib * limits.pods


def _check_subset(key: str, values: tuple[Any, ...], allowed: tuple[Any, ...]) -> None:
    bad = [v for v in values if v not in allowed]
    if bad or not values:
        raise CandidateError(f"{key}: invalid value(s) {bad or '(empty)'}; valid choices: "
                             f"{', '.join(map(str, allowed))}")

