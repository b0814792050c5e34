"""The queue between the sockets and the index, bounded by the wire bytes it holds (pure, no
sockets): each engine may hold its share of `queue_bytes` (or one message, whichever is larger)
of batches received and not yet applied. A batch beyond that is shed: the caller counts it, and
`Backlog` says when an engine starts and stops shedding, so the log gets one line per change, not
one per batch."""
from __future__ import annotations

import dataclasses
from collections.abc import Hashable


@dataclasses.dataclass
class _Engine:
    held: int = 0  # wire bytes queued
    shedding: bool = False
    shed: int = 0  # batches shed since shedding started
    shed_bytes: int = 0


@dataclasses.dataclass(frozen=True)
class ShedChange:
    """An engine started (`started`) or stopped shedding; `messages`/`nbytes` shed in that spell."""

    engine: Hashable
    started: bool
    messages: int
    nbytes: int
    share: int


class Backlog:
    def __init__(self, share: int) -> None:
        self.share = share
        self._engines: dict[Hashable, _Engine] = {}
        self.held = 0  # all engines

    def admit(self, engine: Hashable, nbytes: int) -> tuple[bool, ShedChange | None]:
        """Queue `nbytes` for `engine` (True) or shed them (False); the change of state, if any."""
        e = self._engines.setdefault(engine, _Engine())
        if e.held and e.held + nbytes > self.share:
            e.shed += 1
            e.shed_bytes += nbytes
            change = None
            if not e.shedding:
                e.shedding = True
                change = ShedChange(engine, True, 1, nbytes, self.share)
            return False, change
        e.held += nbytes
        self.held += nbytes
        return True, None

    def done(self, engine: Hashable, nbytes: int) -> ShedChange | None:
        """`nbytes` of `engine` were applied (or dropped); a shedding engine stops once its queue
        is back under half its share."""
        e = self._engines.get(engine)
        if e is None:
            return None
        taken = min(nbytes, e.held)
        e.held -= taken
        self.held -= taken
        if e.shedding and e.held <= self.share // 2:
            change = ShedChange(engine, False, e.shed, e.shed_bytes, self.share)
            e.shedding, e.shed, e.shed_bytes = False, 0, 0
            return change
        return None

    def held_by(self, engine: Hashable) -> int:
        e = self._engines.get(engine)
        return 0 if e is None else e.held

    def forget(self, engine: Hashable) -> None:
        e = self._engines.pop(engine, None)
        if e is not None:
            self.held -= e.held
