"""The hostile and soak benches have a real command line: --help with examples, a list of the
attacks, and a one-line error for a selection that matches nothing."""
from __future__ import annotations

import json
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


def test_soak_help_offers_diagnose() -> None:
    out = _run("soak.py", "--help")
    assert out.returncode == 0, out.stderr
    assert "--diagnose" in out.stdout and "what grows" in out.stdout


def test_the_soak_probe_reports_what_grows_in_a_wrapped_module(tmp_path: Path) -> None:
    sys.path.insert(0, str(ROOT / "bench" / "helpers"))
    import soak_probe

    info = soak_probe.malloc_info()  # glibc's own view of this process
    assert info is not None and info["arenas"] >= 1 and info["system"] > 0 and 0 <= info["free"] <= info["system"]
    out = tmp_path / "probe.jsonl"
    # the module waits for the probe's baseline, grows 24 MB it keeps until exit, then waits for two
    # more samples: on a loaded machine the probe's thread may sample late, but never out of order
    grow = (f"import builtins, pathlib, time\nlog = pathlib.Path({str(out)!r})\n"
            "def text(): return log.read_text() if log.exists() else ''\n"
            "while '\"baseline\"' not in text(): time.sleep(0.02)\n"
            "builtins.keep = []\n"
            "for _ in range(12): builtins.keep.append(bytearray(2_000_000)); time.sleep(0.05)\n"
            "n = text().count('\\n')\n"
            "while text().count('\\n') < n + 2: time.sleep(0.02)")
    run = subprocess.run([sys.executable, str(ROOT / "bench" / "helpers" / "soak_probe.py"), "--out", str(out), "--interval-s",
                          "0.2", "--baseline-s", "0.2", "--label", "probed", "-m", "timeit", "-n", "1", "-r", "1",
                          grow], capture_output=True, text=True, timeout=120, check=False)
    assert run.returncode == 0, run.stderr
    records = [json.loads(line) for line in out.read_text().splitlines()]
    assert any(r.get("baseline") for r in records) and records[-1].get("final")
    assert all(r["label"] == "probed" and r["rss"] > 0 for r in records)
    lines = soak_probe.diagnose(out)
    assert lines[0].startswith("probed (pid ") and "Python heap (tracemalloc) +" in lines[0], lines
    assert any("grew" in line and "<timeit-src>" in line for line in lines), lines
