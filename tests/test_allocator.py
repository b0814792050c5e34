"""The agent pins glibc's mmap threshold, so the large arrays it frees every minute (the KV
capacity curve's pass) go back to the system instead of staying resident in the heap arenas."""
from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

from agent.runtime.allocator import DEFAULT_THRESHOLD, M_MMAP_THRESHOLD, pin_mmap_threshold

ROOT = Path(__file__).resolve().parent.parent


class FakeLibc:
    def __init__(self) -> None:
        self.calls: list[tuple[int, int]] = []

        def mallopt(param: int, value: int) -> int:
            self.calls.append((param, value))
            return 1
        self.mallopt = mallopt


def test_pins_the_threshold_unless_the_environment_chose_one() -> None:
    libc = FakeLibc()
    assert pin_mmap_threshold(env={}, libc=lambda: libc) is True
    assert libc.calls == [(M_MMAP_THRESHOLD, DEFAULT_THRESHOLD)]
    chosen = FakeLibc()
    assert pin_mmap_threshold(env={"MALLOC_MMAP_THRESHOLD_": "65536"}, libc=lambda: chosen) is False
    assert chosen.calls == []


def test_no_glibc_is_a_no_op() -> None:
    def missing() -> object:
        raise OSError("libc.so.6: cannot open shared object file")
    assert pin_mmap_threshold(env={}, libc=missing) is False


REBUILDS = textwrap.dedent("""
    import sys
    import threading
    import numpy as np
    from agent.kvevents.store_curve import StoreCurveCollector, StoreStream
    from agent.runtime.allocator import pin_mmap_threshold
    if sys.argv[1] == "pin":
        assert pin_mmap_threshold(env={})
    def rss():
        return next(int(l.split()[1]) for l in open("/proc/self/status") if l.startswith("VmRSS")) / 1024
    rng = np.random.default_rng(0)
    stream = StoreStream()
    for i in range(2000):
        stream.add("m", f"pod-{i % 4}", rng.integers(0, 300_000, 500).tolist(), 16)
    curve = StoreCurveCollector(stream, 131072.0)
    after = []
    for _ in range(6):
        for i in range(200):
            stream.add("m", f"pod-{i % 4}", rng.integers(0, 300_000, 500).tolist(), 16)
        worker = threading.Thread(target=curve.rebuild)  # as the agent's job: in a worker thread
        worker.start()
        worker.join()
        after.append(rss())
    print(max(after) - after[0])
""")


def test_rebuilds_of_the_capacity_curve_leave_rss_flat_once_pinned() -> None:
    out = subprocess.run([sys.executable, "-c", REBUILDS, "pin"], capture_output=True, text=True, timeout=300,
                         check=False, cwd=ROOT, env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"})
    assert out.returncode == 0, out.stderr
    grown_mb = float(out.stdout.split()[-1])
    assert grown_mb < 24, f"RSS grew {grown_mb:.0f} MB over 6 rebuilds of a 1M-block curve"


def test_tierpilot_run_sets_the_collector_up_before_and_freezes_what_it_assembled(tmp_path):
    """`tierpilot run` (here with --check-config, which assembles the runtime and returns): the
    collector's thresholds are raised before the agent is built, and what it built is frozen."""
    probe = textwrap.dedent("""
        import gc, sys
        from agent.cli import main
        from agent.runtime.process import GC_THRESHOLDS
        assert gc.get_threshold() != GC_THRESHOLDS and gc.get_freeze_count() == 0
        sys.argv = ["tierpilot", "run", "--check-config"]
        try:
            main()
        except SystemExit as exc:
            assert not exc.code, exc.code
        print(gc.get_threshold() == GC_THRESHOLDS, gc.get_freeze_count() > 10_000)
    """)
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120, cwd=ROOT,
                         env={**os.environ, "HOME": str(tmp_path)}, check=False)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split()[-2:] == ["True", "True"], out.stdout + out.stderr


def test_the_emulated_demo_sets_the_agent_s_process_up_as_tierpilot_run_does(tmp_path):
    """`tierpilot demo` runs the agent in its own process: the collector's thresholds are raised
    before the loop starts (the loop itself is replaced here by a probe)."""
    probe = textwrap.dedent("""
        import gc, sys
        import emulator.demo.loop as loop
        from agent.cli import main
        from agent.runtime.process import GC_THRESHOLDS
        assert gc.get_threshold() != GC_THRESHOLDS
        loop.run_demo = lambda settings: print("loop", gc.get_threshold() == GC_THRESHOLDS)
        sys.argv = ["tierpilot", "demo", "--duration", "30", "--no-live", "--report-dir", sys.argv[1]]
        try:
            main()
        except SystemExit as exc:
            assert not exc.code, exc.code
    """)
    out = subprocess.run([sys.executable, "-c", probe, str(tmp_path / "report")], capture_output=True, text=True,
                         timeout=120, cwd=ROOT, env={**os.environ, "HOME": str(tmp_path)}, check=False)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split()[-2:] == ["loop", "True"], out.stdout + out.stderr
