"""The actuator interface: the only way a configuration change leaves the tuner.

Implementations: the Kubernetes actuator (agent/k8s/) and the demo's local actuator
(simulator/), both applying a `contracts.knobs.Knobs` to their targets.
"""
from __future__ import annotations

import dataclasses
from typing import Protocol, runtime_checkable

from contracts.knobs import Knobs


class ActuationError(Exception):
    """A change could not be applied. Never crashes the agent; the caller records it."""


class RetriableActuationError(ActuationError):
    """Transient failure (409 conflict, 5xx, watch dropped). Retry after `delay_s`."""

    def __init__(self, message: str, delay_s: float = 1.0) -> None:
        super().__init__(message)
        self.delay_s = delay_s


class PermanentActuationError(ActuationError):
    """Will not succeed by retrying (403 missing RBAC, invalid object). Stop and report."""


class RefusedConfigError(PermanentActuationError):
    """This configuration cannot be expressed by the targets (a value they do not accept, a coupled
    knob asked apart, a change an env var would defeat, a switch that needs a restart the target
    cannot do). Raised while planning, before anything is written: the candidate is rejected,
    the targets themselves are fine, and tuning goes on."""


class TargetGoneError(PermanentActuationError):
    """The target object is gone (404). Stop tuning it."""


class RolloutTimeoutError(ActuationError):
    """The rollout did not complete in time. The caller rolls back."""


@dataclasses.dataclass(frozen=True)
class ApplyResult:
    """What an apply (or rollback) did."""

    knobs: Knobs
    applied: bool  # False in dry-run, or when nothing changed
    dry_run: bool = False
    changed: dict[str, tuple[object, object]] = dataclasses.field(default_factory=dict)
    restarted: tuple[str, ...] = ()  # pods/objects that restart because of this change
    message: str = ""


@runtime_checkable
class Actuator(Protocol):
    """Applies knob configurations to a deployment, one change at a time."""

    def current(self) -> Knobs:
        """The configuration the target runs now."""
        ...

    def apply(self, knobs: Knobs, *, dry_run: bool = False) -> ApplyResult:
        """Apply `knobs` and wait until the rollout has completed (or raise)."""
        ...

    def last_good(self) -> Knobs | None:
        """The last configuration marked good, if any (stored with the target)."""
        ...

    def mark_good(self, knobs: Knobs) -> None:
        """Record `knobs` as the last good configuration."""
        ...

    def rollback(self) -> ApplyResult:
        """Restore the last good configuration exactly."""
        ...
