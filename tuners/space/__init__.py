"""The search space as data, bounded by the deployment, and candidate validation.

A `SearchSpace` is a tuple of dimensions (`tuners.space.dimensions`: each names one optuna
parameter and knows its optuna distribution and its grid values). Parameters map onto
`contracts.knobs.Knobs` one-to-one, except the L2 watermarks, which travel as one categorical
parameter `l2_watermarks` (`"high/low"`) so that every sampled pair is valid by construction.

Bounds come from a `DeploymentLimits` (`tuners.space.limits`): the node memory headroom caps the
CPU buffer, the L2 pool has a fixed size (it is not a knob), and the L2 backend decides which
eviction policies and thresholds exist. A fleet-wide host-memory budget is a *constraint* (see
`constraints`), which optuna records with `Trial.set_constraint`; `validate` refuses any candidate
outside the bounds or violating a constraint, so nothing invalid is ever applied.
"""
from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterator, Mapping
from typing import Any

from optuna.distributions import BaseDistribution

from contracts.knobs import Knobs
from tuners.space.dimensions import (
    WATERMARKS_PARAM,
    Choice,
    Dimension,
    FloatRange,
    IntRange,
    parse_watermark_label,
    watermark_label,
)
from tuners.space.limits import (
    TWIN_CPU_EVICTIONS,
    TWIN_ROUTERS,
    CandidateError,
    DeploymentLimits,
    TargetAcceptance,
    memory_cost_gib,
    target_violations,
)

# the names code outside `tuners` imports from here
__all__ = [
    "TWIN_CPU_EVICTIONS", "TWIN_ROUTERS", "WATERMARKS_PARAM", "CandidateError", "Choice", "DeploymentLimits",
    "FloatRange", "IntRange", "SearchSpace", "TargetAcceptance", "memory_cost_gib",
]


# -- the space -------------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class SearchSpace:
    """Dimensions plus the limits they came from. Knobs not covered by a dimension are fixed."""

    dimensions: tuple[Dimension, ...]
    limits: DeploymentLimits = dataclasses.field(default_factory=lambda: DeploymentLimits())
    fixed: Knobs = dataclasses.field(default_factory=Knobs)
    targets: TargetAcceptance | None = None

    def __post_init__(self) -> None:
        names = [d.name for d in self.dimensions]
        valid = {f.name for f in dataclasses.fields(Knobs)} - {"l2_high_watermark", "l2_low_watermark"}
        valid.add(WATERMARKS_PARAM)
        for name in names:
            if name not in valid:
                raise CandidateError(
                    f"search space: unknown dimension {name!r}; valid: {', '.join(sorted(valid))}")
        coupled = [c for d in self.dimensions if isinstance(d, Choice) for c in d.couples]
        for c in coupled:
            if c not in valid or c in names:
                raise CandidateError(f"search space: {c!r} cannot be coupled (unknown, or a dimension itself)")
        if len(set(names + coupled)) != len(names + coupled):
            raise CandidateError(f"search space: duplicate dimensions in {names + coupled}")

    @classmethod
    def from_limits(cls, limits: DeploymentLimits | None = None, *,
                    tune_cpu_eviction: bool = False) -> SearchSpace:
        """The standard space of DESIGN.md "Search space", bounded by `limits`. A tier the deployment
        does not have contributes no dimension: without an L2 there is no L2 eviction, watermark or
        read threshold to tune (those knobs keep their defaults); a choice with one value is fixed."""
        limits = limits or DeploymentLimits()
        dims: list[Dimension] = []
        if len(limits.chunk_choices) > 1:
            dims.append(Choice("chunk_tokens", tuple(limits.chunk_choices)))
        if limits.cpu_gib_max > 0:
            dims.append(FloatRange("cpu_gib", 0.0, limits.cpu_gib_max, limits.cpu_gib_step))
        if len(limits.l2_evictions) > 1:
            dims.append(Choice("l2_eviction", limits.l2_evictions))
        if limits.has_watermarks and len(limits.watermarks) > 1:
            dims.append(Choice(WATERMARKS_PARAM, tuple(watermark_label(h, lo) for h, lo in limits.watermarks)))
        if len(limits.routers) > 1:
            dims.append(Choice("router", tuple(limits.routers)))
        if limits.has_l2 and limits.l2_threshold_max > 0:
            dims.append(IntRange("l2_min_prompt_tokens", 0, limits.l2_threshold_max, limits.l2_threshold_step))
        if tune_cpu_eviction:
            dims.append(Choice("cpu_eviction", tuple(limits.cpu_evictions)))
        fixed = Knobs()
        if len(limits.chunk_choices) == 1:
            fixed = fixed.replace(chunk_tokens=limits.chunk_choices[0])
        if len(limits.routers) == 1:
            fixed = fixed.replace(router=limits.routers[0])
        if len(limits.l2_evictions) == 1:
            fixed = fixed.replace(l2_eviction=limits.l2_evictions[0])
        if limits.has_watermarks and len(limits.watermarks) == 1:
            high, low = limits.watermarks[0]
            fixed = fixed.replace(l2_high_watermark=high, l2_low_watermark=low)
        return cls(tuple(dims), limits, fixed)

    def for_targets(self, acc: TargetAcceptance) -> SearchSpace:
        """Only what the targets accept: dimensions of knobs no target owns are dropped (the knob
        keeps its fixed value), choices are cut to the values the owning targets can express.
        CandidateError when a dimension has no value left."""
        dims: list[Dimension] = []
        for d in self.dimensions:
            knobs = _dimension_knobs(d.name)
            if not all(k in acc.accepts for k in knobs):
                continue
            allowed = acc.accepts[knobs[0]]
            if isinstance(d, Choice) and allowed is not None and d.name != WATERMARKS_PARAM:
                values = tuple(v for v in d.values if v in allowed)
                if not values:
                    raise CandidateError(f"{acc.source}: {d.name} accepts {', '.join(map(str, allowed))}, none of "
                                         f"which the search space offers ({', '.join(map(str, d.values))})")
                d = dataclasses.replace(d, values=values)  # a coupled knob stays coupled
            if isinstance(d, (FloatRange, IntRange)) and d.name in acc.above:
                d = _above(d, acc.above[d.name], acc.source)
            dims.append(d)
        fixed = self.fixed.to_dict()
        fixed.update({k: v for k, v in acc.fixed.items() if k not in acc.accepts})
        return dataclasses.replace(self, dimensions=tuple(dims),
                                   fixed=Knobs.from_mapping(fixed, source=acc.source), targets=acc)

    def choices(self, name: str) -> tuple[Any, ...]:
        """The values of the choice dimension `name` ((): the space does not search it)."""
        return next((tuple(d.values) for d in self.dimensions if d.name == name and isinstance(d, Choice)), ())

    # -- optuna views ------------------------------------------------------------------------
    def distributions(self) -> dict[str, BaseDistribution]:
        return {d.name: d.distribution() for d in self.dimensions}

    def grid(self) -> dict[str, tuple[Any, ...]]:
        """Every dimension's grid values (the input of optuna's GridSampler)."""
        return {d.name: d.grid() for d in self.dimensions}

    def grid_size(self) -> int:
        return math.prod(len(v) for v in self.grid().values())

    def iter_grid(self) -> Iterator[Knobs]:
        """Every grid point as Knobs (in a fixed order)."""
        import itertools

        names = [d.name for d in self.dimensions]
        for combo in itertools.product(*(d.grid() for d in self.dimensions)):
            yield self.to_knobs(dict(zip(names, combo)))

    # -- conversions -------------------------------------------------------------------------
    def to_knobs(self, params: Mapping[str, Any]) -> Knobs:
        """Parameters (as optuna reports them) -> Knobs. Missing parameters keep `fixed`."""
        values = dict(params)
        for d in self.dimensions:
            if isinstance(d, Choice) and d.name in values:
                values.update(dict.fromkeys(d.couples, values[d.name]))
        if WATERMARKS_PARAM in values:
            high, low = parse_watermark_label(values.pop(WATERMARKS_PARAM))
            values["l2_high_watermark"], values["l2_low_watermark"] = high, low
        if "cpu_gib" in values:
            values["cpu_gib"] = float(values["cpu_gib"])
        base = self.fixed.to_dict()
        base.update(values)
        return Knobs.from_mapping(base, source="candidate")

    def to_params(self, knobs: Knobs) -> dict[str, Any]:
        """Knobs -> parameters for `study.enqueue_trial` (only the tuned dimensions)."""
        out: dict[str, Any] = {}
        for d in self.dimensions:
            if d.name == WATERMARKS_PARAM:
                out[d.name] = watermark_label(knobs.l2_high_watermark, knobs.l2_low_watermark)
            else:
                out[d.name] = getattr(knobs, d.name)
        return out

    # -- validation --------------------------------------------------------------------------
    def violations(self, knobs: Knobs) -> list[str]:
        """Every way `knobs` breaks the bounds or limits, as readable messages (empty = valid)."""
        problems: list[str] = []
        lim = self.limits
        if knobs.chunk_tokens not in lim.chunk_choices:
            problems.append(f"chunk_tokens={knobs.chunk_tokens} not allowed; valid: "
                            f"{', '.join(map(str, lim.chunk_choices))}")
        if knobs.cpu_gib > lim.node_memory_headroom_gib + 1e-9:
            problems.append(f"cpu_gib={knobs.cpu_gib:g} exceeds the node memory headroom "
                            f"({lim.node_memory_headroom_gib:g} GiB)")
        if not lim.has_l2:
            if knobs.l2_eviction != self.fixed.l2_eviction or knobs.l2_min_prompt_tokens != self.fixed.l2_min_prompt_tokens:
                problems.append("this deployment has no L2: l2_eviction and l2_min_prompt_tokens keep "
                                f"{self.fixed.l2_eviction!r} / {self.fixed.l2_min_prompt_tokens}")
        elif knobs.l2_eviction not in lim.l2_evictions:
            problems.append(f"l2_eviction={knobs.l2_eviction!r} not offered by the {lim.l2_backend} backend; "
                            f"valid: {', '.join(lim.l2_evictions)}")
        pair = (knobs.l2_high_watermark, knobs.l2_low_watermark)
        if lim.has_watermarks:
            if pair not in lim.watermarks and pair != (1.0, 1.0):
                valid = ", ".join(watermark_label(h, lo) for h, lo in lim.watermarks)
                problems.append(f"l2 watermarks {watermark_label(*pair)} not allowed; valid: {valid}")
        elif pair != (1.0, 1.0):
            problems.append(f"the {lim.l2_backend} L2 backend has no watermarks; "
                            f"l2_high/low_watermark must stay 1/1, got {watermark_label(*pair)}")
        # the running value of a knob the space does not tune is always allowed (e.g. a
        # vllm-project/router's cache_aware, which the twin does not model)
        if knobs.router not in lim.routers and knobs.router != self.fixed.router:
            problems.append(f"router={knobs.router!r} not allowed; valid: {', '.join(lim.routers)}")
        if knobs.cpu_eviction not in lim.cpu_evictions and knobs.cpu_eviction != self.fixed.cpu_eviction:
            problems.append(f"cpu_eviction={knobs.cpu_eviction!r} not allowed; valid: {', '.join(lim.cpu_evictions)}")
        for d in self.dimensions:
            for c in d.couples if isinstance(d, Choice) else ():
                if getattr(knobs, c) != getattr(knobs, d.name):
                    problems.append(f"{c}={getattr(knobs, c)!r} must equal {d.name}={getattr(knobs, d.name)!r} "
                                    f"(one setting in this deployment)")
        for name, allowed in (("router", _choice(self, "router")), ("cpu_eviction", _choice(self, "cpu_eviction"))):
            if allowed is not None and getattr(knobs, name) not in allowed:
                problems.append(f"{name}={getattr(knobs, name)!r} not accepted by this deployment; "
                                f"valid: {', '.join(allowed)}")
        if not 0 <= knobs.l2_min_prompt_tokens <= lim.l2_threshold_max:
            problems.append(f"l2_min_prompt_tokens={knobs.l2_min_prompt_tokens} outside "
                            f"0..{lim.l2_threshold_max}")
        for name, value in self.constraints(knobs).items():
            if value > 0:
                problems.append(f"constraint {name} violated by {value:g}")
        if self.targets is not None:
            problems += target_violations(knobs, self.targets)
        return problems

    def validate(self, knobs: Knobs) -> Knobs:
        """Return `knobs` if it may be applied; otherwise raise CandidateError listing every problem."""
        problems = self.violations(knobs)
        if problems:
            raise CandidateError("invalid candidate: " + "; ".join(problems))
        return knobs

    def constraints(self, knobs: Knobs) -> dict[str, float]:
        """Constraint values (<= 0 is feasible), as optuna's `set_constraint` takes them."""
        lim = self.limits
        out = {"node_memory_gib": knobs.cpu_gib - lim.node_memory_headroom_gib}
        if lim.cpu_budget_gib is not None:
            out["fleet_cpu_budget_gib"] = memory_cost_gib(knobs, lim) - lim.cpu_budget_gib
        return out



def _dimension_knobs(name: str) -> tuple[str, ...]:
    return ("l2_high_watermark", "l2_low_watermark") if name == WATERMARKS_PARAM else (name,)


def _choice(space: SearchSpace, knob: str) -> tuple[Any, ...] | None:
    """Values the space offers for `knob` (its own dimension, or the one it is coupled to)."""
    for d in space.dimensions:
        if isinstance(d, Choice) and (d.name == knob or knob in d.couples):
            return d.values
    return None



def _above(d: Any, bound: float, source: str) -> Any:
    """Range `d` from its first step above `bound` (CandidateError when none is left)."""
    low = d.low
    while low <= bound + 1e-12:
        low += d.step
    if low > d.high + 1e-12:
        raise CandidateError(f"{source}: {d.name} must be above {bound:g}, and the search space stops at {d.high:g}")
    return dataclasses.replace(d, low=round(low, 9) if isinstance(d, FloatRange) else low)
