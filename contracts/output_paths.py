"""Output paths checked before the work, and written in one way at the end.

A command that will write a file or a directory at the end (a plot, best.yaml, a report) says at
once, in one line, why it could not, instead of failing with a traceback after the whole run: the
`check_*` functions are pure checks on the file system; no file is created or changed.

Every output file is then written through `replacing(path)` (or `write_output(path, data)`): the
content goes to a new temporary file in the same directory, which is renamed over `path` once it
is complete. A reader never sees half a file, a failed write leaves the old file as it was, and a
symlink at `path` is replaced by the file, never followed: `--out best.yaml` cannot overwrite what
a link planted there points to.
"""
from __future__ import annotations

import os
import secrets
from collections.abc import Iterator
from contextlib import contextmanager
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


@contextmanager
def replacing(path: Path) -> Iterator[Path]:
    """A fresh temporary path beside `path` (same suffix, so a plotting library picks the same
    format) to write the content to; on success it is renamed over `path` (a symlink there is
    replaced, not followed), on failure removed."""
    path = Path(path)
    tmp = path.with_name(f".{path.stem}-tmp{secrets.token_hex(4)}{path.suffix}")
    # created here, exclusively and without following links, with the usual mode (umask applies)
    os.close(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0), 0o666))
    try:
        yield tmp
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def write_output(path: Path, data: str | bytes) -> None:
    """Write `data` to `path` through `replacing`."""
    with replacing(path) as tmp:
        if isinstance(data, bytes):
            tmp.write_bytes(data)
        else:
            tmp.write_text(data)
