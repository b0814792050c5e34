"""Fixtures shared by the whole suite."""
from __future__ import annotations

import os
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parent.parent


def shared_path() -> Path:
    """`../shared` beside the repository root (dev and CI), or $TIERPILOT_SHARED."""
    env = os.environ.get("TIERPILOT_SHARED")
    return Path(env) if env else REPO_ROOT.parent / "shared"


@pytest.fixture(scope="session")
def shared_dir() -> Path:
    p = shared_path()
    if not p.is_dir():
        pytest.fail(f"shared data folder not found at {p}; set TIERPILOT_SHARED")
    return p


@pytest.fixture(scope="session")
def traces_dir(shared_dir: Path) -> Path:
    return shared_dir / "traces"


@pytest.fixture(scope="session")
def samples_dir(shared_dir: Path) -> Path:
    return shared_dir / "reference" / "samples"
