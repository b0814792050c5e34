"""What a sharded agent's fleet reads raise when a shard did not answer (shared by the store's
fleet view, agent/collect/fleetstore.py, and the KV-event fleet overlap,
agent/kvevents/fleet_overlap.py, which must not import each other; the tuning loop catches it)."""
from __future__ import annotations


class PartialFleetError(RuntimeError):
    """A fleet read left out at least one shard: the caller must not take it for the fleet."""

    def __init__(self, peer: str, reason: str) -> None:
        super().__init__(f"shard {peer} left out of the fleet view: {reason}")
        self.peer = peer
        self.reason = reason


__all__ = ["PartialFleetError"]
