"""Linux inotify through ctypes (no dependency): which files of a directory tree were written or opened.

    with TreeWatch(root) as w:
        ...
        for event in w.read():   # non-blocking: the events queued so far, in order
            event.path, event.kind   # "written" (closed after writing, or renamed into place), "opened"

The kernel queues an event when the system call happens, so a read right after another process's
`open()` sees it. Directories created under the root are watched when their creation event is read;
files created in one before that are not reported (a caller that must know every file also scans).
"""
from __future__ import annotations

import ctypes
import ctypes.util
import errno
import os
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Self

IN_CLOSE_WRITE, IN_CLOSE_NOWRITE, IN_OPEN = 0x8, 0x10, 0x20
IN_MOVED_TO, IN_CREATE, IN_DELETE_SELF, IN_IGNORED, IN_ISDIR, IN_Q_OVERFLOW = 0x80, 0x100, 0x400, 0x8000, 0x40000000, 0x4000
IN_NONBLOCK, IN_CLOEXEC = 0o4000, 0o2000000
# IN_CLOSE_NOWRITE is not reported, but asked for: the kernel merges an event identical to the last one
# queued, so without a close between them, three opens of one file would read as one.
MASK = IN_CLOSE_WRITE | IN_CLOSE_NOWRITE | IN_OPEN | IN_MOVED_TO | IN_CREATE | IN_DELETE_SELF
HEADER = struct.Struct("iIII")  # wd, mask, cookie, len


@dataclass(frozen=True)
class FileEvent:
    path: Path
    kind: str  # "written" | "opened"


class InotifyError(OSError):
    pass


def _libc() -> ctypes.CDLL:
    return ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)


class TreeWatch:
    """inotify watches on `root` and every directory below it."""

    def __init__(self, root: Path) -> None:
        self.root = Path(root)
        self._libc = _libc()
        self._fd = -1
        self._dirs: dict[int, Path] = {}
        self._paths: set[Path] = set()
        self.overflowed = False  # the kernel dropped events: a caller should rescan

    def __enter__(self) -> Self:
        self._fd = self._libc.inotify_init1(IN_NONBLOCK | IN_CLOEXEC)
        if self._fd < 0:
            raise InotifyError(ctypes.get_errno(), "inotify_init1 failed")
        for d, _subdirs, _files in os.walk(self.root):
            self.watch(Path(d))
        return self

    def __exit__(self, *exc: object) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1
        self._dirs.clear()
        self._paths.clear()

    def watching(self, directory: Path) -> bool:
        return directory in self._paths

    def watch(self, directory: Path) -> None:
        wd = self._libc.inotify_add_watch(self._fd, os.fsencode(directory), MASK)
        if wd < 0:
            err = ctypes.get_errno()
            if err in (errno.ENOENT, errno.ENOTDIR):
                return  # gone before we got to it
            raise InotifyError(err, f"inotify_add_watch {directory} failed")
        self._dirs[wd] = directory
        self._paths.add(directory)

    def read(self) -> list[FileEvent]:
        """The events queued so far (never blocks)."""
        out: list[FileEvent] = []
        while True:
            try:
                buf = os.read(self._fd, 1 << 16)
            except BlockingIOError:
                return out
            at = 0
            while at < len(buf):
                wd, mask, _cookie, size = HEADER.unpack_from(buf, at)
                name = buf[at + HEADER.size:at + HEADER.size + size].rstrip(b"\0").decode(errors="surrogateescape")
                at += HEADER.size + size
                self._one(wd, mask, name, out)

    def _one(self, wd: int, mask: int, name: str, out: list[FileEvent]) -> None:
        if mask & IN_Q_OVERFLOW:
            self.overflowed = True
            return
        if mask & IN_IGNORED:
            self._paths.discard(self._dirs.pop(wd, Path()))
            return
        parent = self._dirs.get(wd)
        if parent is None or not name:
            return
        path = parent / name
        if mask & IN_ISDIR:
            if mask & (IN_CREATE | IN_MOVED_TO):
                self.watch(path)
        elif mask & (IN_CLOSE_WRITE | IN_MOVED_TO):
            out.append(FileEvent(path, "written"))
        elif mask & IN_OPEN:
            out.append(FileEvent(path, "opened"))


__all__ = ["FileEvent", "InotifyError", "TreeWatch"]
