"""What grows inside a process: a probe for `bench/soak.py --diagnose`.

Every `interval_s` it appends one JSON line to a file:
- `rss`, `anon`: the process's resident and anonymous memory (/proc/self/status, smaps_rollup);
- `traced`: the Python heap tracemalloc sees, and `top`: the source lines whose allocations grew
  most since the baseline (taken `baseline_s` after the start, once the process has warmed up);
- `malloc`: glibc's own view (malloc_info): arenas, bytes taken from the system, bytes free inside
  them (`free`: fast + regular bins; free / system = fragmentation) and mmapped chunks;
- `gc`: the object types whose live count grew most since the baseline.

RSS growth that tracemalloc sees is Python objects kept (a leak to find in `top`); growth of
`malloc.free` is memory freed but held by the allocator (fragmentation: try MALLOC_ARENA_MAX=2 or
malloc_trim); growth in neither is native memory outside malloc's arenas (mmapped buffers of
numpy, zmq, polars). The last line (`final`) also records the RSS before and after `malloc_trim(0)`.

Two ways in:
    python bench/helpers/soak_probe.py --out probe.jsonl [--interval-s 30] -- -m agent.cli run -c agent.yaml
    (wraps a module run as __main__), or `start(out, interval_s)` inside a process (the cluster).
"""
from __future__ import annotations

import argparse
import atexit
import collections
import contextlib
import ctypes
import gc
import json
import os
import re
import runpy
import signal
import sys
import tempfile
import threading
import time
import tracemalloc
from pathlib import Path
from typing import Any

TOP = 12
FRAMES = 1


def proc_kb(field: str, path: str = "/proc/self/status") -> int:
    """A memory field of /proc/self/status or smaps_rollup, in bytes (0 when absent)."""
    try:
        with open(path) as f:
            for line in f:
                if line.startswith(field + ":"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


_MALLOC_TOTAL = re.compile(r'<(total|system) type="(\w+)"(?: count="(\d+)")? size="(\d+)"/>')


def parse_malloc_info(xml: str) -> dict[str, int]:
    """The totals of glibc's malloc_info XML: arenas, system (current), free (fast + rest), mmap."""
    tail = xml[xml.rfind("</heap>") + len("</heap>"):] if "</heap>" in xml else xml
    totals = {(m.group(1), m.group(2)): int(m.group(4)) for m in _MALLOC_TOTAL.finditer(tail)}
    free = totals.get(("total", "fast"), 0) + totals.get(("total", "rest"), 0)
    return {"arenas": xml.count("<heap nr="), "system": totals.get(("system", "current"), 0),
            "free": free, "mmap": totals.get(("total", "mmap"), 0)}


def malloc_info() -> dict[str, int] | None:
    """glibc's allocator state (None off glibc)."""
    try:
        libc = ctypes.CDLL("libc.so.6")
        libc.fopen.restype = ctypes.c_void_p
        libc.fopen.argtypes = [ctypes.c_char_p, ctypes.c_char_p]
        libc.malloc_info.argtypes = [ctypes.c_int, ctypes.c_void_p]
        libc.fclose.argtypes = [ctypes.c_void_p]
    except (OSError, AttributeError):
        return None
    with tempfile.NamedTemporaryFile(prefix="malloc-info-", suffix=".xml") as tmp:
        fp = libc.fopen(tmp.name.encode(), b"w")
        if not fp:
            return None
        libc.malloc_info(0, fp)
        libc.fclose(fp)
        return parse_malloc_info(Path(tmp.name).read_text())


def malloc_trim() -> bool:
    try:
        return bool(ctypes.CDLL("libc.so.6").malloc_trim(0))
    except (OSError, AttributeError):
        return False


def type_counts() -> collections.Counter[str]:
    return collections.Counter(type(o).__name__ for o in gc.get_objects())


class Probe:
    def __init__(self, out: Path, interval_s: float = 30.0, baseline_s: float = 120.0, label: str = "") -> None:
        self.out, self.interval_s, self.baseline_s, self.label = out, interval_s, baseline_s, label
        self.t0 = time.monotonic()
        self.baseline: tracemalloc.Snapshot | None = None
        self.base_types: collections.Counter[str] = collections.Counter()
        self.stop = threading.Event()
        self.lock = threading.Lock()

    def sample(self, final: bool = False) -> dict[str, Any]:
        t = time.monotonic() - self.t0
        rec: dict[str, Any] = {"label": self.label, "pid": os.getpid(), "t": round(t, 1),
                               "rss": proc_kb("VmRSS"), "anon": proc_kb("Anonymous", "/proc/self/smaps_rollup"),
                               "traced": tracemalloc.get_traced_memory()[0] if tracemalloc.is_tracing() else 0,
                               "malloc": malloc_info()}
        if tracemalloc.is_tracing():
            snap = tracemalloc.take_snapshot().filter_traces([tracemalloc.Filter(False, tracemalloc.__file__)])
            if self.baseline is None and t >= self.baseline_s:
                self.baseline, self.base_types = snap, type_counts()
                rec["baseline"] = True
            elif self.baseline is not None:
                rec["top"] = [{"where": f"{s.traceback[0].filename}:{s.traceback[0].lineno}",
                               "size_diff": s.size_diff, "count_diff": s.count_diff}
                              for s in snap.compare_to(self.baseline, "lineno")[:TOP]]
                grown = type_counts()
                grown.subtract(self.base_types)
                rec["gc"] = grown.most_common(TOP)
        if final:
            rec["final"] = True
            rec["rss_after_trim"] = proc_kb("VmRSS") if malloc_trim() else None
        return rec

    def write(self, rec: dict[str, Any]) -> None:
        with self.lock, self.out.open("a") as f:
            f.write(json.dumps(rec) + "\n")

    def run(self) -> None:
        while not self.stop.wait(self.interval_s):
            with contextlib.suppress(Exception):  # a probe must never take its process down
                self.write(self.sample())

    def finish(self) -> None:
        if self.stop.is_set():
            return
        self.stop.set()
        with contextlib.suppress(Exception):
            self.write(self.sample(final=True))


def start(out: Path, interval_s: float = 30.0, baseline_s: float = 120.0, label: str = "") -> Probe:
    """Start tracing and the sampling thread in this process; `finish()` (also at exit) writes the
    final line."""
    tracemalloc.start(FRAMES)
    probe = Probe(Path(out), interval_s, baseline_s, label or Path(sys.argv[0]).name)
    threading.Thread(target=probe.run, name="soak-probe", daemon=True).start()
    atexit.register(probe.finish)
    return probe


def _slope(ts: list[float], ys: list[float]) -> float:
    """Least-squares slope per hour (0 for fewer than two points)."""
    if len(ts) < 2:
        return 0.0
    mt, my = sum(ts) / len(ts), sum(ys) / len(ys)
    var = sum((t - mt) ** 2 for t in ts)
    return 0.0 if var == 0 else sum((t - mt) * (y - my) for t, y in zip(ts, ys, strict=True)) / var * 3600.0


def diagnose(path: Path) -> list[str]:
    """What grew in the process a probe file describes, after its baseline: one line per measure
    (MB/h), the biggest growing source lines and object types, and the allocator's share."""
    recs = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    # the periodic samples from the baseline on (the final line is taken after the run: trim only)
    after = [r for r in recs if not r.get("final") and (r.get("top") is not None or r.get("baseline"))]
    if len(after) < 2:
        return [f"{path.name}: too few samples after the baseline ({len(after)})"]
    ts = [r["t"] for r in after]

    def mb_h(get: Any) -> float:
        return _slope(ts, [get(r) / 1e6 for r in after])

    m = [r["malloc"] or {} for r in after]
    label = after[0]["label"]
    rss, traced = mb_h(lambda r: r["rss"]), mb_h(lambda r: r["traced"])
    free = _slope(ts, [x.get("free", 0) / 1e6 for x in m])
    system = _slope(ts, [x.get("system", 0) / 1e6 for x in m])
    mmap = _slope(ts, [x.get("mmap", 0) / 1e6 for x in m])
    last = after[-1]
    anon = mb_h(lambda r: r["anon"])
    lines = [(f"{label} (pid {last['pid']}, {ts[-1] - ts[0]:.0f} s after the baseline): RSS {rss:+.1f} MB/h, "
              f"anon {anon:+.1f}, Python heap (tracemalloc) {traced:+.1f}, malloc arenas {system:+.1f} of which "
              f"free {free:+.1f}, mmapped chunks {mmap:+.1f}; anon outside malloc {anon - system - mmap:+.1f} MB/h")]
    lm = last["malloc"] or {}
    if lm:
        frag = lm["free"] / lm["system"] if lm.get("system") else 0.0
        lines.append(f"  malloc now: {lm['arenas']} arenas, {lm['system'] / 1e6:.0f} MB from the system, "
                     f"{lm['free'] / 1e6:.0f} MB free inside ({frag:.0%} fragmentation), {lm['mmap'] / 1e6:.0f} MB mmap")
    final = next((r for r in reversed(recs) if r.get("final")), None)
    if final and final.get("rss_after_trim"):
        lines.append(f"  malloc_trim(0) at the end: RSS {final['rss'] / 1e6:.0f} -> {final['rss_after_trim'] / 1e6:.0f} MB")
    top = last.get("top") or []
    lines += [f"  grew {t['size_diff'] / 1e6:+8.2f} MB {t['count_diff']:+9d} blocks  {t['where']}" for t in top[:6]]
    if last.get("gc"):
        lines.append("  live objects grown: " + ", ".join(f"{n} {c:+d}" for n, c in last["gc"][:6]))
    return lines


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, required=True, help="JSON lines file to append to")
    ap.add_argument("--interval-s", type=float, default=30.0, help="seconds between samples (default: 30)")
    ap.add_argument("--baseline-s", type=float, default=120.0,
                    help="seconds after the start to take the baseline (default: 120)")
    ap.add_argument("--label", default="agent")
    ap.add_argument("-m", dest="module", required=True, help="the module to run as __main__, then its arguments")
    args, rest = ap.parse_known_args(argv)
    rest = rest[1:] if rest[:1] == ["--"] else rest
    probe = start(args.out, args.interval_s, args.baseline_s, args.label)
    # until the module installs its own handler, SIGTERM exits through atexit (the final line)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    sys.argv = [args.module, *rest]
    try:
        runpy.run_module(args.module, run_name="__main__", alter_sys=True)
    finally:
        probe.finish()


if __name__ == "__main__":
    main()
