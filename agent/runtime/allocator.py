"""The C allocator, set once for a process that runs for weeks (glibc only; a no-op elsewhere).

glibc's malloc serves a block of at least its mmap threshold with its own mmap, returned to the
system on free; smaller blocks come from the heap arenas, which keep freed pages. The threshold
is dynamic: each time a large mmapped block is freed it rises to that block's size (up to
32 MiB). The agent frees large transient numpy arrays all the time (the KV capacity curve's pass
over a million blocks allocates about 100 MB of 8-16 MB temporaries each minute), so after the
first pass they are carved from the arenas instead, whose freed pages stay resident: RSS wanders
up by 100 MB and more and does not come back. Pinning the threshold (`mallopt(M_MMAP_THRESHOLD)`,
which also turns the dynamic rise off) keeps every large block mmapped and returned on free.

`MALLOC_MMAP_THRESHOLD_` in the environment (glibc's own variable) wins: nothing is changed.
"""
from __future__ import annotations

import ctypes
import logging
import os
from collections.abc import Callable, Mapping
from typing import Any

log = logging.getLogger(__name__)

M_MMAP_THRESHOLD = -3  # glibc's malloc.h
DEFAULT_THRESHOLD = 1 << 20  # 1 MiB: a large block is mmapped, small ones stay in the arenas


def _glibc() -> Any:
    return ctypes.CDLL("libc.so.6")


def pin_mmap_threshold(threshold: int = DEFAULT_THRESHOLD, env: Mapping[str, str] | None = None,
                       libc: Callable[[], Any] = _glibc) -> bool:
    """Pin glibc's mmap threshold at `threshold` bytes; True when it was set."""
    env = os.environ if env is None else env
    if "MALLOC_MMAP_THRESHOLD_" in env:
        return False
    try:
        mallopt = libc().mallopt
    except (OSError, AttributeError):  # not glibc (musl, macOS)
        return False
    mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    mallopt.restype = ctypes.c_int
    ok = bool(mallopt(M_MMAP_THRESHOLD, threshold))
    if not ok:
        log.debug("mallopt(M_MMAP_THRESHOLD, %d) refused", threshold)
    return ok
