"""What bench/real_engine.py reads besides the responses: the processor it runs on, the load on
core 0 while a stream runs (the load average; core 0's busy share, all of it and the engine's
process group's, from /proc), and the engine's own /metrics (a sample's value, the KV capacity)."""
from __future__ import annotations

import dataclasses
import math
import os
import re
import urllib.request
from pathlib import Path

from emulator.engines.engine import EngineProcess
from emulator.engines.tier_probe import ProbeError, kv_cache_tokens


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.partition(":")[2].strip()
    except OSError:
        pass
    return "unknown processor"


# -- the machine's load ---------------------------------------------------------------------------
def cpu0_jiffies() -> tuple[int, int]:
    with open("/proc/stat") as f:
        for line in f:
            if line.startswith("cpu0 "):
                v = [int(x) for x in line.split()[1:]]
                return sum(v) - v[3] - v[4], sum(v)  # busy, total
    return 0, 0


def group_jiffies(pgid: int) -> int:
    total = 0
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            with open(f"/proc/{d}/stat") as f:
                parts = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(parts[2]) == pgid:
            total += int(parts[11]) + int(parts[12])
    return total


@dataclasses.dataclass
class Load:
    loadavg: float
    core0_busy: float  # share of core 0 busy, everyone
    engine: float  # share of core 0 the engine used

    def text(self) -> str:
        return (f"load avg {self.loadavg:.2f}; core 0 busy {self.core0_busy:.0%} "
                f"(engine {self.engine:.0%}, others {max(self.core0_busy - self.engine, 0):.0%})")


class LoadMeter:
    def __init__(self, pgid: int) -> None:
        self.pgid = pgid
        self.b0, self.t0 = cpu0_jiffies()
        self.g0 = group_jiffies(pgid)

    def done(self) -> Load:
        b1, t1 = cpu0_jiffies()
        g1 = group_jiffies(self.pgid)
        span = max(t1 - self.t0, 1)
        return Load(os.getloadavg()[0], (b1 - self.b0) / span, (g1 - self.g0) / span)


# -- the engine's counters ------------------------------------------------------------------------
def metric(text: str, name: str) -> float:
    m = re.search(rf"^{re.escape(name)}(?:{{[^}}]*}})? ([0-9.e+-]+)$", text, re.MULTILINE)
    return float(m.group(1)) if m else math.nan


def gpu_tokens(text: str) -> int:
    """The engine's KV cache in tokens (tier_probe's reading); a one-line exit without it."""
    try:
        return kv_cache_tokens(text)
    except ProbeError as exc:
        raise SystemExit(str(exc)) from None


def scrape(engine: EngineProcess) -> str:
    with urllib.request.urlopen(engine.metrics_url, timeout=5) as r:
        return r.read().decode()
