"""The dimensions of the search space, as data.

Each dimension names one optuna parameter and knows its optuna distribution, its grid values, and
whether a value lies in it. Parameters map onto `contracts.knobs.Knobs` one-to-one, except the L2
watermarks, which travel as one categorical parameter `l2_watermarks` (`"high/low"`) so that every
sampled pair is valid by construction.
"""
from __future__ import annotations

import dataclasses
from typing import Any

from optuna.distributions import (
    BaseDistribution,
    CategoricalDistribution,
    FloatDistribution,
    IntDistribution,
)

from tuners.space.limits import CandidateError

WATERMARKS_PARAM = "l2_watermarks"


@dataclasses.dataclass(frozen=True)
class Choice:
    """A categorical dimension."""

    name: str
    values: tuple[Any, ...]
    couples: tuple[str, ...] = ()  # knobs that always take this dimension's value (one setting upstream)

    def distribution(self) -> BaseDistribution:
        return CategoricalDistribution(self.values)

    def grid(self) -> tuple[Any, ...]:
        return self.values

    def contains(self, value: Any) -> bool:
        return value in self.values

    def describe(self) -> str:
        return "one of " + ", ".join(map(str, self.values))


@dataclasses.dataclass(frozen=True)
class IntRange:
    """An integer dimension low..high (inclusive) in steps."""

    name: str
    low: int
    high: int
    step: int = 1

    def distribution(self) -> BaseDistribution:
        return IntDistribution(self.low, self.high, step=self.step)

    def grid(self) -> tuple[int, ...]:
        return tuple(range(self.low, self.high + 1, self.step))

    def contains(self, value: Any) -> bool:
        return (isinstance(value, int) and self.low <= value <= self.high
                and (value - self.low) % self.step == 0)

    def describe(self) -> str:
        return f"an integer in {self.low}..{self.high} in steps of {self.step}"


@dataclasses.dataclass(frozen=True)
class FloatRange:
    """A float dimension low..high (inclusive) in steps."""

    name: str
    low: float
    high: float
    step: float

    def distribution(self) -> BaseDistribution:
        return FloatDistribution(self.low, self.high, step=self.step)

    def grid(self) -> tuple[float, ...]:
        n = int((self.high - self.low) / self.step + 0.5)
        return tuple(round(self.low + i * self.step, 6) for i in range(n + 1))

    def contains(self, value: Any) -> bool:
        if not isinstance(value, (int, float)) or not self.low - 1e-9 <= value <= self.high + 1e-9:
            return False
        k = (value - self.low) / self.step
        return abs(k - round(k)) < 1e-6

    def describe(self) -> str:
        return f"a number in {self.low:g}..{self.high:g} in steps of {self.step:g}"


Dimension = Choice | IntRange | FloatRange


def watermark_label(high: float, low: float) -> str:
    return f"{high:g}/{low:g}"


def parse_watermark_label(label: str) -> tuple[float, float]:
    try:
        high, low = (float(x) for x in str(label).split("/"))
    except ValueError:
        raise CandidateError(f"{WATERMARKS_PARAM}: expected 'high/low', got {label!r}") from None
    return high, low
