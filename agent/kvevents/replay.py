"""The bookkeeping of one replay request to an engine's replay ROUTER (pure, no sockets): which
replayed batches are wanted, the live messages queued behind it (bounded), and how the outcome is
counted: `replayed`, `lost`, or `unbuffered` (older than the engine's buffer at a late join)."""
from __future__ import annotations

import dataclasses

MAX_PENDING = 50_000  # live messages queued behind a replay before it is abandoned


@dataclasses.dataclass
class ReplayState:
    start: int  # first sequence number asked for
    stop: int  # exclusive: the live message that revealed the gap (or the first one, on a join)
    deadline: float
    count_lost: bool  # a gap (True) or a late join (False)
    pending: list[tuple[bytes, int, bytes]]
    pending_bytes: int = 0
    next_seq: int = 0
    recovered: int = 0
    first_seq: int | None = None  # first batch the engine still had

    def __post_init__(self) -> None:
        self.next_seq = self.start

    def accept(self, seq: int) -> bool:
        """Whether a replayed batch is one asked for and not seen yet (then it counts)."""
        if not self.next_seq <= seq < self.stop:
            return False
        self.next_seq = seq + 1
        self.recovered += 1
        if self.first_seq is None:
            self.first_seq = seq
        return True

    def queue(self, message: tuple[bytes, int, bytes], max_bytes: int) -> bool:
        """Queue a live message; False when the queue is over its bounds (abandon the replay)."""
        self.pending.append(message)
        self.pending_bytes += len(message[2])
        return len(self.pending) <= MAX_PENDING and self.pending_bytes <= max_bytes

    def outcome(self, timed_out: bool) -> tuple[int, int, int]:
        """(replayed, lost, unbuffered). A late join the engine answered: what precedes its
        buffer is history it no longer keeps, not a loss; a failed replay loses what it asked for."""
        missing = self.stop - self.start - self.recovered
        unbuffered = 0
        if not self.count_lost and not timed_out:
            unbuffered = (self.stop if self.first_seq is None else self.first_seq) - self.start
        return self.recovered, missing - unbuffered, unbuffered
