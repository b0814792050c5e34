"""What the agent can see, judged after every cycle from the target statuses (scraped targets and
`source: prometheus` groups alike):

- `TargetLog`: one log line per change of a target's state, never one per cycle. A state is
  (up or down, the down reason, the warnings raised): a target going down (WARNING, with the
  reason and detail), coming back (INFO, with how many cycles it was down), changing its reason
  while down, or raising or clearing a warning (no_mapped_series, lmcache_series_missing, a
  dropped histogram, an unknown family...). A cycle skipped in back-off keeps the state.
- `Blindness`: the agent is blind when no target was up for `after_cycles` cycles in a row (every
  static target refusing connections, a query source that answers errors or is not a Prometheus,
  discovery that finds nothing). /healthz then reports `status: degraded` with the reason; the
  liveness and readiness verdicts are not changed (agent/runtime/health.py).

Pure apart from the logger; the caller feeds the statuses of each finished cycle.
"""
from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass

from contracts.redact import redact_text, redact_url
from contracts.tier_model import TargetStatus

log = logging.getLogger("tierpilot.targets")


@dataclass(frozen=True, slots=True)
class TargetState:
    up: bool
    reason: str
    warnings: frozenset[str]


def state_of(st: TargetStatus) -> TargetState:
    return TargetState(st.up, "" if st.up else (st.reason or "down"), frozenset(r for r, _ in st.warnings))


def _name(st: TargetStatus) -> str:
    t = st.target
    return f"target {redact_url(t.url)} ({t.role}, pod {t.pod})"


class TargetLog:
    """Logs each change of a target's state (see the module docstring)."""

    def __init__(self, logger: logging.Logger = log) -> None:
        self.log = logger
        self.states: dict[str, TargetState] = {}
        self.down_cycles: dict[str, int] = {}

    def observe(self, statuses: Iterable[TargetStatus]) -> list[str]:
        """Record one cycle's statuses; returns the lines logged (for tests)."""
        lines: list[tuple[int, str]] = []
        seen: set[str] = set()
        for st in statuses:
            key = st.target.key
            seen.add(key)
            new, old = state_of(st), self.states.get(key)
            if not new.up:
                self.down_cycles[key] = self.down_cycles.get(key, 0) + 1
            if new != old and not (st.skipped and old is not None and not old.up):
                lines.extend(self._changes(st, old, new))
                self.states[key] = new
            if new.up:
                self.down_cycles.pop(key, None)
        for key in [k for k in self.states if k not in seen]:  # left discovery: forget quietly
            self.states.pop(key, None)
            self.down_cycles.pop(key, None)
        for level, line in lines:
            self.log.log(level, "%s", line)
        return [line for _, line in lines]

    def _changes(self, st: TargetStatus, old: TargetState | None, new: TargetState) -> list[tuple[int, str]]:
        name, out = _name(st), []
        detail = redact_text(st.detail) if st.detail else ""
        if not new.up and (old is None or old.up or old.reason != new.reason):
            was = f" (was down: {old.reason})" if old is not None and not old.up else ""
            out.append((logging.WARNING, f"{name} is down: {new.reason}" + (f": {detail}" if detail else "") + was))
        elif new.up and old is not None and not old.up:
            n = self.down_cycles.get(st.target.key, 0)
            out.append((logging.INFO, f"{name} is up again after {n} cycle{'s' if n != 1 else ''} down ({old.reason})"))
        before = old.warnings if old is not None else frozenset()
        details = dict(st.warnings)
        for reason in sorted(new.warnings - before):
            out.append((logging.WARNING, f"{name} warns {reason}: {redact_text(details.get(reason, ''))}".rstrip(": ")))
        for reason in sorted(before - new.warnings):
            out.append((logging.INFO, f"{name} no longer warns {reason}"))
        return out


class Blindness:
    """Counts the cycles in a row in which no target was up."""

    def __init__(self, after_cycles: int = 3) -> None:
        self.after_cycles = after_cycles
        self.cycles_blind = 0
        self.targets = 0
        self.reasons: Counter[str] = Counter()

    def observe(self, statuses: Iterable[TargetStatus]) -> None:
        statuses = list(statuses)
        self.targets = len(statuses)
        if any(st.up for st in statuses):
            self.cycles_blind = 0
            self.reasons = Counter()
            return
        self.cycles_blind += 1
        self.reasons = Counter(st.reason or "down" for st in statuses)

    def problem(self) -> str | None:
        """None while some target was read recently; else why the agent is blind (for /healthz)."""
        if self.cycles_blind < self.after_cycles:
            return None
        n = self.cycles_blind
        if not self.targets:
            return f"blind: no targets for {n} cycles (discovery found none, or the query source lists none)"
        why = ", ".join(f"{r} x{c}" for r, c in sorted(self.reasons.items(), key=lambda kv: (-kv[1], kv[0])))
        return f"blind: none of {self.targets} target{'s' if self.targets != 1 else ''} read for {n} cycles ({why})"
