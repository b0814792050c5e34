"""The layering in `.importlinter` holds, and the check is able to fail.

The contract is the one `make lint` runs. The second test copies the source packages into a
temporary folder, adds one forbidden import at the bottom layer, and expects the same contract
to break: a test that could never fail would prove nothing.
"""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("contracts", "simulator", "tuners", "exporters", "dashboards", "agent", "emulator")
LINT = Path(sys.executable).with_name("lint-imports")


def _lint(cwd: Path, config: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(cwd)}
    return subprocess.run([str(LINT), "--config", str(config), "--no-cache"], check=False, cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=300)


def test_layer_contracts_are_kept() -> None:
    out = _lint(ROOT, ROOT / ".importlinter")
    assert out.returncode == 0, out.stdout + out.stderr
    assert "0 broken" in out.stdout


def test_a_forbidden_import_breaks_the_contract(tmp_path: Path) -> None:
    for name in PACKAGES:
        shutil.copytree(ROOT / name, tmp_path / name, ignore=shutil.ignore_patterns("__pycache__"))
    knobs = tmp_path / "contracts" / "knobs.py"
    knobs.write_text(knobs.read_text() + "\nfrom agent.collect import parse as _forbidden  # noqa\n")
    out = _lint(tmp_path, ROOT / ".importlinter")
    assert out.returncode != 0
    assert "BROKEN" in out.stdout
    assert "contracts.knobs -> agent.collect.parse" in out.stdout
