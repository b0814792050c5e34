"""Proposals: changes the tuner would make but its `apply` scope does not let it.

`tuner.apply` decides what the guardrails may change on their own:

- `all`: every change, restart-requiring ones included (chunk size, CPU buffer, eviction policies:
  the engines or the L2 master restart and their caches empty);
- `hot`: only the router's own knobs (`contracts.knobs.ROUTER_KNOBS`); a restart-requiring change
  becomes a proposal;
- `none`: nothing; every change becomes a proposal.

A proposal keeps what a person needs to decide: the running and the proposed configuration, the
knobs that restart processes, and the planner's priced line for the move (gain per hour,
transition cost, payback, verdict) when there is one. The agent serves the book on `/proposals`
(JSON) and, with `tuner.proposals_file`, writes it to a file; `tierpilot k8s apply-proposal`
applies one through the same validated actuator. `ProposalBook` is also the Prometheus collector
of the `tierpilot_tuner_proposal_*` families.
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
import threading
from collections import OrderedDict
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any, Literal

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from contracts.jsonsafe import dumps
from contracts.knobs import Knobs, restarting_knobs
from contracts.output_paths import write_output

ApplyScope = Literal["none", "hot", "all"]
APPLY_SCOPES: tuple[str, ...] = ("none", "hot", "all")
KEEP = 50  # proposals kept (the newest); older ones are dropped from the book and the file


def held_back(scope: str, before: Knobs, after: Knobs) -> str:
    """Why `scope` keeps the change `before` -> `after` from being applied ("" if it may be)."""
    if scope == "all":
        return ""
    if scope == "none":
        return "nothing is applied (tuner.apply none, or tuner.mode shadow)"
    if scope != "hot":
        raise ValueError(f"tuner.apply: {scope!r}; valid: {', '.join(APPLY_SCOPES)}")
    knobs = restarting_knobs(before, after)
    if not knobs:
        return ""
    return f"{', '.join(knobs)} restart the engines or the L2 master; tuner.apply is hot (all allows restarts)"


def proposal_id(before: Knobs, after: Knobs) -> str:
    """A short id that stays the same for the same move (the same plan made twice is one proposal)."""
    text = json.dumps([before.to_dict(), after.to_dict()], sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()[:10]


@dataclasses.dataclass(frozen=True)
class Proposal:
    """One held-back move. `plan`: the planner's priced line for it (None without a planner)."""

    id: str
    first_at: float
    last_at: float
    current: Knobs
    knobs: Knobs
    restarts: tuple[str, ...]
    reason: str
    times: int = 1
    plan: Mapping[str, Any] | None = None

    def to_dict(self) -> dict[str, Any]:
        return {"id": self.id, "first_at": self.first_at, "last_at": self.last_at, "times": self.times,
                "changes": {k: [a, b] for k, (a, b) in self.current.diff(self.knobs).items()},
                "restarts": list(self.restarts), "reason": self.reason, "plan": dict(self.plan) if self.plan else None,
                "current": self.current.to_dict(), "knobs": self.knobs.to_dict()}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Proposal:
        return cls(id=str(data["id"]), first_at=float(data["first_at"]), last_at=float(data["last_at"]),
                   current=Knobs.from_mapping(data["current"], source=f"proposal {data['id']} current"),
                   knobs=Knobs.from_mapping(data["knobs"], source=f"proposal {data['id']} knobs"),
                   restarts=tuple(data.get("restarts") or ()), reason=str(data.get("reason", "")),
                   times=int(data.get("times", 1)), plan=data.get("plan"))

    def describe(self) -> str:
        changes = ", ".join(f"{k} {a} -> {b}" for k, (a, b) in self.current.diff(self.knobs).items())
        line = f"proposal {self.id}: {changes or 'no change'}"
        if self.plan and self.plan.get("line"):
            line += f"; plan: {self.plan['line']}"
        return line + f" (held back: {self.reason})"


PlanLine = Callable[[Knobs, Knobs], "Mapping[str, Any] | None"]


class ProposalBook(Collector):
    """The newest `KEEP` proposals, by id; thread-safe. `plan_line(current, knobs)` looks up the
    planner's priced line for a move; `path`: written (atomically) after every change."""

    collector_name = "tuner_proposals"

    def __init__(self, scope: str, *, plan_line: PlanLine | None = None, path: Path | None = None,
                 target: str = "default") -> None:
        if scope not in APPLY_SCOPES:
            raise ValueError(f"tuner.apply: {scope!r}; valid: {', '.join(APPLY_SCOPES)}")
        self.scope = scope
        self.plan_line = plan_line
        self.path = path
        self.target = target
        self._lock = threading.Lock()
        self._book: OrderedDict[str, Proposal] = OrderedDict()
        self._total = {"hot": 0, "restart": 0}

    def record(self, current: Knobs, knobs: Knobs, reason: str, *, at: float) -> Proposal:
        pid = proposal_id(current, knobs)
        plan = self.plan_line(current, knobs) if self.plan_line is not None else None
        restarts = restarting_knobs(current, knobs)
        with self._lock:
            old = self._book.pop(pid, None)
            p = Proposal(pid, old.first_at if old else at, at, current, knobs, restarts, reason,
                         times=(old.times + 1) if old else 1, plan=plan if plan is not None else (old.plan if old else None))
            self._book[pid] = p
            while len(self._book) > KEEP:
                self._book.popitem(last=False)
            self._total["restart" if restarts else "hot"] += 1
            doc = self._doc()
        if self.path is not None:  # a reader never sees half a file (contracts/output_paths.py)
            self.path.parent.mkdir(parents=True, exist_ok=True)
            write_output(self.path, dumps(doc, indent=2) + "\n")
        return p

    def proposals(self) -> list[Proposal]:
        """Newest last."""
        with self._lock:
            return list(self._book.values())

    def to_json(self) -> dict[str, Any]:
        with self._lock:
            return self._doc()

    def _doc(self) -> dict[str, Any]:
        return {"apply": self.scope, "proposals": [p.to_dict() for p in self._book.values()]}

    # -- Collector ---------------------------------------------------------------------------
    def describe(self) -> Iterable[Metric]:
        return []

    def collect(self) -> Iterable[Metric]:
        with self._lock:
            total, book = dict(self._total), list(self._book.values())
        t = self.target
        fam = CounterMetricFamily("tierpilot_tuner_proposals", "Moves held back as proposals by tuner.apply, by kind "
                                  "(restart: restarts the engines or the L2 master; hot: the router's knobs).",
                                  labels=["workload", "kind"])
        for kind, n in sorted(total.items()):
            fam.add_metric([t, kind], n)
        yield fam
        g = GaugeMetricFamily("tierpilot_tuner_proposal_pending", "Proposals kept for a person to apply.",
                              labels=["workload"])
        g.add_metric([t], float(len(book)))
        yield g
        if not book:
            return
        latest = book[-1]
        g = GaugeMetricFamily("tierpilot_tuner_proposal_info", "The newest proposal: its id, the knobs it changes "
                              "and whether it restarts (value: unix time it was last made).",
                              labels=["workload", "id", "changes", "restart"])
        changes = ",".join(f"{k}={b}" for k, (_a, b) in latest.current.diff(latest.knobs).items())
        g.add_metric([t, latest.id, changes, str(bool(latest.restarts)).lower()], latest.last_at)
        yield g
        gain = (latest.plan or {}).get("gain_per_hour_s")
        if isinstance(gain, (int, float)):
            g = GaugeMetricFamily("tierpilot_tuner_proposal_gain_per_hour_seconds",
                                  "The newest proposal's predicted steady gain (TTFT seconds saved per hour).",
                                  labels=["workload", "id"])
            g.add_metric([t, latest.id], float(gain))
            yield g


def load_proposals(doc: object, *, source: str) -> list[Proposal]:
    """The proposals of a `/proposals` body or a proposals file (newest last)."""
    items = doc.get("proposals") if isinstance(doc, Mapping) else None
    if not isinstance(items, list):
        raise ValueError(f"{source}: not a proposals document (no `proposals` list)")  # noqa: TRY004 - a bad file
    try:
        return [Proposal.from_dict(p) for p in items]
    except (KeyError, TypeError, ValueError) as exc:
        raise ValueError(f"{source}: a malformed proposal: {exc}") from None


def pick(proposals: list[Proposal], pid: str | None, *, source: str) -> Proposal:
    """The proposal `pid` (a unique prefix will do), or the newest when None."""
    if not proposals:
        raise ValueError(f"{source}: no proposals")
    if pid is None:
        return proposals[-1]
    found = [p for p in proposals if p.id.startswith(pid)]
    if len(found) != 1:
        ids = ", ".join(p.id for p in proposals)
        raise ValueError(f"{source}: {'no' if not found else 'more than one'} proposal {pid!r} (ids: {ids})")
    return found[0]


__all__ = ["APPLY_SCOPES", "ApplyScope", "Proposal", "ProposalBook", "held_back", "load_proposals", "pick",
           "proposal_id"]
