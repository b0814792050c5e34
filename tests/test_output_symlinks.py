"""Output files are written through one helper (contracts/output_paths.py `replacing`): the content
goes to a temporary file beside the output and is renamed over it. A symlink planted at an output
path is replaced, never followed (`tune --out`, `replay --plot`, the demo's report and plots), and
a failed write leaves the old file and no temporary behind."""
from __future__ import annotations

import json
import os
import stat

import pytest
from click.testing import CliRunner

from agent.cli import main
from contracts.knobs import DEFAULT_KNOBS
from contracts.output_paths import replacing, write_output
from emulator.cluster.timeline import Recorder
from emulator.demo.report import write_report

pytestmark = pytest.mark.timeout(120)


@pytest.fixture
def victim(tmp_path):
    """A file some link will point to; it must come out of every test unchanged."""
    path = tmp_path / "elsewhere" / "precious.txt"
    path.parent.mkdir()
    path.write_text("do not touch\n")
    return path


def _planted(link, victim):
    link.symlink_to(victim)
    return link


def _untouched(link, victim) -> None:
    assert victim.read_text() == "do not touch\n"
    assert not link.is_symlink() and link.is_file()
    assert [p.name for p in link.parent.iterdir() if "-tmp" in p.name] == []


def test_the_helper_replaces_a_link_and_keeps_the_usual_mode(tmp_path, victim):
    link = _planted(tmp_path / "out.yaml", victim)
    write_output(link, "a: 1\n")
    _untouched(link, victim)
    assert link.read_text() == "a: 1\n"
    umask = os.umask(0o022)
    os.umask(umask)
    assert stat.S_IMODE(link.stat().st_mode) == 0o666 & ~umask
    write_output(tmp_path / "bin", b"\x00\x01")
    assert (tmp_path / "bin").read_bytes() == b"\x00\x01"


def test_a_failed_write_leaves_the_old_file_and_no_temporary(tmp_path):
    out = tmp_path / "plot.png"
    out.write_text("old")
    with pytest.raises(RuntimeError), replacing(out) as tmp:
        assert tmp.parent == tmp_path and tmp.suffix == ".png" and tmp.exists()
        tmp.write_text("half")
        raise RuntimeError("disk full")
    assert out.read_text() == "old" and sorted(p.name for p in tmp_path.iterdir()) == ["plot.png"]


def test_tune_out_does_not_follow_a_symlink(tmp_path, victim):
    link = _planted(tmp_path / "best.yaml", victim)
    result = CliRunner().invoke(main, ["tune", "--workload", "rag", "--max-requests", "60", "--trials", "1", "-q",
                                       "--storage", f"sqlite:///{tmp_path / 't.db'}", "--out", str(link)])
    assert result.exit_code == 0, result.output
    _untouched(link, victim)
    assert "knobs:" in link.read_text()


def test_replay_plot_does_not_follow_a_symlink(tmp_path, victim):
    trace = tmp_path / "tiny.jsonl"
    trace.write_text("".join(json.dumps({"timestamp": t, "input_length": 600, "output_length": 10, "hash_ids": [1, 2]})
                             + "\n" for t in (0, 500, 900)))
    link = _planted(tmp_path / "p.png", victim)
    result = CliRunner().invoke(main, ["replay", "--trace", str(trace), "--plot", str(link)])
    assert result.exit_code == 0, result.output
    _untouched(link, victim)
    assert link.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_the_demo_report_does_not_follow_symlinks(tmp_path, victim):
    links = [_planted(tmp_path / name, victim) for name in ("report.md", "ttft_p95.png", "hit_ratios.png")]
    path = write_report(tmp_path, Recorder(), title_facts={}, phase_starts=[0.0],
                        final_config=DEFAULT_KNOBS.to_dict(), partial=False)
    assert path == links[0]
    for link in links:
        _untouched(link, victim)
