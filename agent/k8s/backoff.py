"""Exponential back-off as a small state object; time is injected, so tests never sleep."""
from __future__ import annotations

import dataclasses


@dataclasses.dataclass
class Backoff:
    base_s: float = 1.0
    max_s: float = 300.0
    factor: float = 2.0
    failures: int = 0

    def next_delay(self) -> float:
        """Record one failure and return how long to wait before the next attempt."""
        delay = min(self.base_s * self.factor ** self.failures, self.max_s)
        self.failures += 1
        return delay

    def reset(self) -> None:
        self.failures = 0
