"""Benchmark: `tierpilot run` with no targets, from process start to a healthy /healthz and /readyz.

Runs the agent as a subprocess (`python -m agent.cli run`, default settings, loopback port) and
polls /healthz and /readyz every 5 ms. It also reads the agent process's CPU time (user + system,
/proc/PID/stat) when /healthz first answers 200: on a machine shared with other work the wall
time stretches with the load, the CPU time does not. Each round runs this tree and a reference tree alternately:
the reference is `git archive REFERENCE_COMMIT` (a tree that imports scipy, optuna, polars eagerly),
extracted to a temporary folder, run with the same interpreter and venv. Prints the median times
of both and their ratio (reference / this tree; > 1 means this tree starts faster).
Target: this tree < 2 s to a healthy /healthz.

    TIERPILOT_SHARED=../shared .venv/bin/python bench/startup.py [--rounds 5]
"""
from __future__ import annotations

import argparse
import os
import socket
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
REFERENCE_COMMIT = "c7afc03"  # a tree with eager imports of scipy, optuna, polars, ...)
TARGET_S = 2.0


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _status(url: str) -> int:
    try:
        with urllib.request.urlopen(url, timeout=1) as resp:
            return resp.status
    except urllib.error.HTTPError as exc:
        return exc.code
    except OSError:
        return 0


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of a running process so far (Linux /proc)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def start_once(tree: Path, home: Path, timeout: float = 60.0) -> tuple[float, float, float]:
    """Seconds from spawn to /healthz 200 and to /readyz 200 (the reference has no /readyz: the
    first 200 of /healthz counts for both), and the agent's CPU seconds at the first /healthz 200."""
    port = _free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TIERPILOT_", "KUBE"))}
    env.update(PYTHONPATH=str(tree), HOME=str(home), PYTHONDONTWRITEBYTECODE="1")
    t0 = time.perf_counter()
    proc = subprocess.Popen([sys.executable, "-m", "agent.cli", "run", "--host", "127.0.0.1", "--port", str(port)],
                            cwd=home, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    base = f"http://127.0.0.1:{port}"
    healthy = ready = cpu = None
    try:
        while time.perf_counter() - t0 < timeout and (healthy is None or ready is None):
            if proc.poll() is not None:
                raise RuntimeError(f"agent in {tree} exited with {proc.returncode}")
            now = time.perf_counter() - t0
            if healthy is None and _status(base + "/healthz") == 200:
                healthy = now
                cpu = cpu_seconds(proc.pid)
            if healthy is not None and ready is None:
                code = _status(base + "/readyz")
                ready = now if code in (200, 404) else None
            time.sleep(0.005)
    finally:
        proc.terminate()
        proc.wait(15)
    if healthy is None or ready is None or cpu is None:
        raise RuntimeError(f"agent in {tree} not healthy within {timeout}s")
    return healthy, ready, cpu


def reference_tree(dest: Path) -> Path | None:
    """The reference commit's files, or None when this is not a git checkout with that commit."""
    archive = dest / "ref.tar"
    with archive.open("wb") as out:
        proc = subprocess.run(["git", "-C", str(ROOT), "archive", REFERENCE_COMMIT], stdout=out,
                              stderr=subprocess.DEVNULL, check=False)
    if proc.returncode:
        return None
    tree = dest / "reference"
    with tarfile.open(archive) as tar:
        tar.extractall(tree, filter="data")
    return tree


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=5)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="tierpilot-startup-") as tmp:
        tmpdir = Path(tmp)
        ref = reference_tree(tmpdir)
        start_once(ROOT, tmpdir)  # warm the page cache and .pyc files of the venv
        new, old = [], []
        for _ in range(args.rounds):
            new.append(start_once(ROOT, tmpdir))
            if ref is not None:
                old.append(start_once(ref, tmpdir))
    h_new = statistics.median(h for h, _, _ in new)
    r_new = statistics.median(r for _, r, _ in new)
    c_new = statistics.median(c for _, _, c in new)
    load = os.getloadavg()[0]
    print(f"load      : {load:.1f} on {os.cpu_count()} CPUs (wall times stretch with it; CPU times do not)")
    print(f"this tree : /healthz {h_new:.2f} s wall, {c_new:.2f} s CPU; /readyz {r_new:.2f} s wall "
          f"(median of {len(new)}; target /healthz < {TARGET_S:g} s: wall {'met' if h_new < TARGET_S else 'MISSED'}, "
          f"CPU {'met' if c_new < TARGET_S else 'MISSED'})")
    if old:
        h_old = statistics.median(h for h, _, _ in old)
        c_old = statistics.median(c for _, _, c in old)
        print(f"reference : /healthz {h_old:.2f} s wall, {c_old:.2f} s CPU (commit {REFERENCE_COMMIT}, "
              f"median of {len(old)})")
        print(f"ratio     : {h_old / h_new:.2f}x faster wall, {c_old / c_new:.2f}x less CPU to a healthy /healthz")
    else:
        print(f"reference : commit {REFERENCE_COMMIT} not available (not a git checkout); no ratio")


if __name__ == "__main__":
    main()
