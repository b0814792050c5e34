"""bench/helpers/core_share.py: the share of a core other processes took, from a /proc tree."""
from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "bench"))

from helpers.core_share import CoreShare, core_ticks, group_ticks


def _proc(root: Path, cpu0: tuple[int, ...], procs: dict[int, tuple[int, int, int]]) -> None:
    """cpu0: user nice system idle iowait irq softirq steal; procs: pid -> (pgrp, utime, stime)."""
    root.mkdir(exist_ok=True)
    (root / "stat").write_text("cpu  1 2 3 4 5 6 7 8 0 0\n"
                               f"cpu0 {' '.join(map(str, cpu0))} 0 0\ncpu1 9 9 9 9 9 9 9 9 0 0\n")
    for pid, (pgrp, ut, st) in procs.items():
        (root / str(pid)).mkdir(exist_ok=True)
        rest = ["S", "1", str(pgrp)] + ["0"] * 8 + [str(ut), str(st)] + ["0"] * 10
        (root / str(pid) / "stat").write_text(f"{pid} (a (b) c) {' '.join(rest)}\n")


def test_other_processes_share_is_the_cores_busy_time_beyond_the_groups(tmp_path: Path) -> None:
    _proc(tmp_path, (100, 0, 50, 800, 50, 0, 0, 0), {10: (10, 60, 20), 11: (10, 5, 5), 12: (12, 100, 100)})
    assert core_ticks(0, tmp_path) == (150, 1000)
    assert group_ticks(10, tmp_path) == 90  # pids 10 and 11 (a name with parentheses and spaces)
    share = CoreShare(0, 10, tmp_path).start()
    # 200 ticks pass on core 0: 120 busy, of which the group took 70 (+50 and +20)
    _proc(tmp_path, (200, 0, 70, 870, 60, 0, 0, 0), {10: (10, 110, 20), 11: (10, 5, 25), 12: (12, 150, 100)})
    assert share.others() == pytest.approx(50 / 200)
    with pytest.raises(RuntimeError, match="before start"):
        CoreShare(0, 10, tmp_path).others()
    with pytest.raises(ValueError, match="no cpu7"):
        core_ticks(7, tmp_path)
