"""Curvine's quota eviction (pure): the LRU and LFU trackers, the watermark plan and the eviction loop.

Follows Curvine's master (`curvine-server/src/master/quota/`): every access to a file (its creation,
an open) is reported to the tracker; when `fs_used / (fs_used + available)` reaches the high
watermark, the master plans to free `fs_used - low x quota` bytes and, page by page
(`quota_eviction_scan_page` files at a time), takes the tracker's first victims, adds up their
sizes, evicts them all (a page can overshoot the target), and stops once the target is met, or when
the tracker has no victim left or a page frees nothing.

- LRU: victims are the least recently accessed files first.
- LFU: victims are the least frequently accessed files first; among equal counts, the one that
  reached that count first (a new file starts at 1, so a file just written goes before a file read
  twice).

Keys are opaque (the master over real files uses paths).
"""
from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Hashable, Iterable, Mapping
from dataclasses import dataclass
from typing import Protocol

POLICIES = ("lru", "lfu")


class QuotaError(ValueError):
    """A quota configuration Curvine would not run (one-line message)."""


@dataclass(frozen=True)
class QuotaConfig:
    """Curvine master's `[master]` quota keys, with Curvine's defaults."""

    capacity_bytes: int  # the quota: fs_used + available
    policy: str = "lru"  # quota_eviction_policy
    high_watermark: float = 0.8  # quota_eviction_high_rate
    low_watermark: float = 0.6  # quota_eviction_low_rate
    scan_page: int = 2  # quota_eviction_scan_page
    dry_run: bool = False  # quota_eviction_dry_run

    def __post_init__(self) -> None:
        if self.capacity_bytes <= 0:
            raise QuotaError(f"capacity_bytes {self.capacity_bytes}: the quota needs a positive size")
        if self.policy not in POLICIES:
            raise QuotaError(f"policy {self.policy!r}: one of {', '.join(POLICIES)}")
        if not 0 < self.high_watermark <= 1 or not 0 <= self.low_watermark <= 1:
            raise QuotaError(f"watermarks high {self.high_watermark}, low {self.low_watermark}: fractions of the quota")
        if self.scan_page < 1:
            raise QuotaError(f"scan_page {self.scan_page}: at least 1")


class Tracker(Protocol):
    def on_access(self, key: Hashable) -> None: ...
    def victims(self, limit: int) -> list[Hashable]: ...
    def remove(self, keys: Iterable[Hashable]) -> None: ...
    def __len__(self) -> int: ...
    def __contains__(self, key: object) -> bool: ...


class LruTracker:
    def __init__(self) -> None:
        self._order: OrderedDict[Hashable, None] = OrderedDict()  # least recent first

    def on_access(self, key: Hashable) -> None:
        self._order[key] = None
        self._order.move_to_end(key)

    def victims(self, limit: int) -> list[Hashable]:
        return [k for k, _ in zip(self._order, range(limit), strict=False)]

    def remove(self, keys: Iterable[Hashable]) -> None:
        for k in keys:
            self._order.pop(k, None)

    def __len__(self) -> int:
        return len(self._order)

    def __contains__(self, key: object) -> bool:
        return key in self._order


class LfuTracker:
    def __init__(self) -> None:
        self._count: dict[Hashable, int] = {}
        self._by_count: dict[int, OrderedDict[Hashable, None]] = {}  # count -> keys, first to reach it first

    def on_access(self, key: Hashable) -> None:
        n = self._count.get(key, 0)
        if n:
            self._drop(key, n)
        self._count[key] = n + 1
        self._by_count.setdefault(n + 1, OrderedDict())[key] = None

    def _drop(self, key: Hashable, n: int) -> None:
        keys = self._by_count[n]
        del keys[key]
        if not keys:
            del self._by_count[n]

    def victims(self, limit: int) -> list[Hashable]:
        out: list[Hashable] = []
        for n in sorted(self._by_count):
            for k in self._by_count[n]:
                if len(out) == limit:
                    return out
                out.append(k)
        return out

    def remove(self, keys: Iterable[Hashable]) -> None:
        for k in keys:
            n = self._count.pop(k, 0)
            if n:
                self._drop(k, n)

    def __len__(self) -> int:
        return len(self._count)

    def __contains__(self, key: object) -> bool:
        return key in self._count


def new_tracker(policy: str) -> Tracker:
    return LruTracker() if policy == "lru" else LfuTracker()


def bytes_to_free(used: int, cfg: QuotaConfig) -> int | None:
    """None below the high watermark; else the bytes to free to come down to the low one."""
    if used <= 0 or used / cfg.capacity_bytes < cfg.high_watermark:
        return None
    target = int(min(cfg.low_watermark, cfg.high_watermark, 1.0) * cfg.capacity_bytes)
    return max(used - target, 0)


@dataclass(frozen=True)
class Eviction:
    files: tuple[Hashable, ...]  # in eviction order
    bytes_freed: int


def evict(tracker: Tracker, sizes: Mapping[Hashable, int], target: int, cfg: QuotaConfig,
          remove: Callable[[Hashable], bool]) -> Eviction:
    """Curvine's loop: free `target` bytes page by page. `remove(key)` evicts one file (False: it
    failed; the tracker keeps it, and, as in Curvine, the page still counts against the target)."""
    evicted: list[Hashable] = []
    freed = 0
    while target > 0:
        page = tracker.victims(cfg.scan_page)
        if not page:
            break
        page_sizes = {k: max(sizes.get(k, 0), 0) for k in page}  # before `remove` forgets them
        page_bytes = sum(page_sizes.values())
        if page_bytes <= 0 or cfg.dry_run:
            break
        done = [k for k in page if remove(k)]
        tracker.remove(done)
        evicted += done
        freed += sum(page_sizes[k] for k in done)
        target -= page_bytes
    return Eviction(tuple(evicted), freed)


__all__ = ["POLICIES", "Eviction", "LfuTracker", "LruTracker", "QuotaConfig", "QuotaError", "Tracker",
           "bytes_to_free", "evict", "new_tracker"]
