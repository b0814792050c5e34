"""The hostile and soak benches have a real command line: --help with examples, a list of the
attacks, and a one-line error for a selection that matches nothing."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _run(script: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, str(ROOT / "bench" / script), *args], capture_output=True, text=True,
                          timeout=120, check=False, cwd=ROOT)


def test_hostile_help_lists_examples() -> None:
    out = _run("hostile.py", "--help")
    assert out.returncode == 0, out.stderr
    assert "examples:" in out.stdout and "--only" in out.stdout and "--budget" in out.stdout


def test_hostile_lists_its_attacks_and_refuses_an_unknown_one() -> None:
    listed = _run("hostile.py", "--list")
    assert listed.returncode == 0, listed.stderr
    names = listed.stdout.splitlines()
    assert "gzip without its trailer" in names and "gzip, empty body" in names and "none" not in names
    bad = _run("hostile.py", "--only", "no-such-attack")
    assert bad.returncode == 2 and bad.stderr.strip().splitlines()[-1] == \
        "bench/hostile.py: error: --only no-such-attack: no attack matches (see --list)"
    both = _run("hostile.py", "--budget", "--no-budget")
    assert both.returncode == 2 and "not allowed with argument" in both.stderr
