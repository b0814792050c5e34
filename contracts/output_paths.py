"""Output paths checked before the work: a command that will write a file or a directory at the end
(a plot, best.yaml, a report) says at once, in one line, why it could not, instead of failing with
a traceback after the whole run. Pure checks on the file system; no file is created or changed."""
from __future__ import annotations

import os
from pathlib import Path


class OutputPathError(ValueError):
    """An output path that cannot be written; the message names the option and what to change."""


def _nearest_existing(path: Path) -> Path:
    probe = path
    while not probe.exists() and probe != probe.parent:
        probe = probe.parent
    return probe


def check_output_file(path: Path, option: str) -> None:
    """`path` can be created or replaced: its directory exists and is writable, and it is not a
    directory itself."""
    path = Path(path)
    parent = path.parent if str(path.parent) else Path(".")
    if path.is_dir():
        raise OutputPathError(f"{option} {path}: is a directory; give a file name")
    if not parent.is_dir():
        what = "is not a directory" if parent.exists() else "does not exist"
        raise OutputPathError(f"{option} {path}: directory {parent} {what}; create it or give another path")
    if not os.access(parent, os.W_OK | os.X_OK) or (path.exists() and not os.access(path, os.W_OK)):
        raise OutputPathError(f"{option} {path}: not writable by this user")


def check_output_dir(path: Path, option: str) -> None:
    """`path` is a writable directory, or can be created (its nearest existing ancestor is a
    writable directory)."""
    path = Path(path)
    if path.exists() and not path.is_dir():
        raise OutputPathError(f"{option} {path}: exists and is not a directory")
    base = _nearest_existing(path)
    if not base.is_dir():
        raise OutputPathError(f"{option} {path}: {base} is not a directory")
    if not os.access(base, os.W_OK | os.X_OK):
        raise OutputPathError(f"{option} {path}: {base} is not writable by this user")
