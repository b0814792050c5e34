"""A ConfigMap volume's files, written as the kubelet writes them: atomically, so a process that
re-reads a file sees the old content or the new, never a mix."""
from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path


def project_configmap(target: Path, data: Mapping[str, str], stamp: str) -> None:
    """The kubelet's atomic writer: keys as symlinks into `..data`, itself a symlink swapped at once."""
    target.mkdir(parents=True, exist_ok=True)
    fresh = target / f"..{stamp}"
    fresh.mkdir()
    for key, value in data.items():
        (fresh / key).write_text(value)
    tmp = target / "..data_tmp"
    tmp.unlink(missing_ok=True)
    tmp.symlink_to(fresh.name)
    old = (target / "..data").resolve() if (target / "..data").is_symlink() else None
    tmp.replace(target / "..data")
    for key in data:
        link = target / key
        if not link.is_symlink():
            link.symlink_to(f"..data/{key}")
    if old is not None and old != fresh.resolve():
        for f in old.iterdir():
            f.unlink()
        old.rmdir()


__all__ = ["project_configmap"]
