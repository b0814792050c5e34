"""How much of one core other processes took while a process group ran on it (Linux /proc).

A timed comparison with a real engine pinned to a core means something only when the engine had
that core (nearly) to itself. `CoreShare` reads the core's busy clock ticks (`/proc/stat`) and the
group's own CPU time (`/proc/<pid>/stat` of every process in the group) at the start and at the
end; what the core spent on anything else is other processes' share.
"""
from __future__ import annotations

from pathlib import Path

PROC = Path("/proc")


def core_ticks(core: int, proc: Path = PROC) -> tuple[int, int]:
    """(busy, total) clock ticks of `core` since boot."""
    for line in (proc / "stat").read_text().splitlines():
        if line.startswith(f"cpu{core} "):
            v = [int(x) for x in line.split()[1:9]]  # user nice system idle iowait irq softirq steal
            return sum(v) - v[3] - v[4], sum(v)
    raise ValueError(f"/proc/stat has no cpu{core} line")


def group_ticks(pgid: int, proc: Path = PROC) -> int:
    """User + system clock ticks of the processes now in process group `pgid`."""
    total = 0
    for stat in proc.glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rpartition(")")[2].split()
        except OSError:  # the process ended meanwhile
            continue
        if int(fields[2]) == pgid:  # fields from the state on: state ppid pgrp ... utime(11) stime(12)
            total += int(fields[11]) + int(fields[12])
    return total


class CoreShare:
    """`start()` then `others()`: the share of `core`'s time other processes than `pgid`'s took."""

    def __init__(self, core: int, pgid: int, proc: Path = PROC) -> None:
        self.core, self.pgid, self.proc = core, pgid, proc
        self._start: tuple[int, int, int] | None = None

    def start(self) -> CoreShare:
        self._start = (*core_ticks(self.core, self.proc), group_ticks(self.pgid, self.proc))
        return self

    def others(self) -> float:
        if self._start is None:
            raise RuntimeError("CoreShare.others() before start()")
        busy0, total0, group0 = self._start
        busy1, total1 = core_ticks(self.core, self.proc)
        elapsed = total1 - total0
        return max(0.0, (busy1 - busy0) - (group_ticks(self.pgid, self.proc) - group0)) / elapsed if elapsed > 0 else 0.0
