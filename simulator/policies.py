"""Eviction policies over integer chunk hashes: LRU, FIFO, LFU, S3-FIFO and ARC.

Every policy has the same small interface, used by the twin's tiers:

- `key in p`, `len(p)`, `p.capacity` (in chunks; at least 1);
- `prefix_len(keys, start)`: how many of `keys[start:]` are resident, counting from `start` and
  stopping at the first miss (LMCache/vLLM prefix semantics);
- `touch_many(keys)`: record hits on resident keys;
- `insert_many(keys) -> evicted`: store keys in order (a resident key counts as a hit); each new
  key that does not fit evicts one victim first (LRU/FIFO batch the common all-new case with
  the same result); returns the evicted keys in eviction order;
- `insert_count(keys, fresh=0) -> count`: `insert_many` returning only how many keys were
  evicted; the caller may vouch that the last `fresh` keys are distinct, not resident and not
  among the batch's other keys (chunks seen for the first time): LRU/FIFO skip the membership
  scan for them and store a batch in bulk;
- `shrink_to(n) -> evicted`: evict until at most n keys remain (L2 watermarks);
- `keys_in_order()`: resident keys, next victim first (roughly, for LFU/S3-FIFO/ARC);
- `clear()`.

`Policy` lives in `simulator.policy_base`, S3-FIFO and ARC in `simulator.policies_scan`; all are
importable from here.

The hot paths use C-level iteration (`map`, `takewhile`, `dict.update`) so that the cost per
chunk stays close to one dict operation.
"""
from __future__ import annotations

from collections import OrderedDict, _count_elements, deque  # type: ignore[attr-defined]
from collections.abc import Iterable, Sequence
from itertools import islice

from simulator.policies_scan import ARC, S3FIFO
from simulator.policy_base import Policy

_consume = deque(maxlen=0).extend


class LRU(Policy):
    """Least recently used, as an OrderedDict with move_to_end / popitem(last=False) behaves.

    Resident keys are a set; recency is an append-only log of keys, oldest first from `_lo`. A
    hit appends the key again and leaves a stale entry behind (`_stale`: key -> stale entries of
    it still ahead in the log; they all precede its live entry, so the first entry met for a key
    with a stale count is a stale one). Eviction reads the log from `_lo`: a stretch holding no
    stale key leaves with one C-level set operation, so a key costs a set insert, a list append
    and a set discard, about half of an OrderedDict's node bookkeeping.
    """

    name = "lru"

    def __init__(self, capacity: int) -> None:
        super().__init__(capacity)
        self._resident: set[int] = set()
        self._log: list[int] = []
        self._lo = 0
        self._stale: dict[int, int] = {}

    def touch_many(self, keys: Iterable[int]) -> None:
        """Record hits on resident keys (the keys must be resident)."""
        if not isinstance(keys, list):
            keys = list(keys)
        if keys:
            self._log += keys
            _count_elements(self._stale, keys)

    def _advance_to(self, lo: int) -> None:
        """The log is read up to `lo`; the read prefix is dropped once it is over 4,096 entries and
        half the log, so trimming costs amortised O(1) per entry."""
        if lo > 4096 and lo > len(self._log) >> 1:
            del self._log[:lo]
            lo = 0
        self._lo = lo

    def _evict(self, over: int) -> list[int]:
        """Evict the `over` least recently used keys (over >= 1); returns them oldest first."""
        log, lo, stale = self._log, self._lo, self._stale
        victims = log[lo:lo + over]
        if stale and not stale.keys().isdisjoint(victims):
            victims = []
            append = victims.append
            while over:
                k = log[lo]
                lo += 1
                n = stale.get(k)
                if n is None:
                    append(k)
                    over -= 1
                elif n > 1:
                    stale[k] = n - 1
                else:
                    del stale[k]
        else:
            lo += over
        self._resident.difference_update(victims)
        self._advance_to(lo)
        return victims

    def _evict_one(self) -> int:
        log, stale = self._log, self._stale
        lo = self._lo
        while True:
            k = log[lo]
            lo += 1
            n = stale.get(k) if stale else None
            if n is None:
                break
            if n > 1:
                stale[k] = n - 1
            else:
                del stale[k]
        self._lo = lo
        self._resident.remove(k)
        return k

    def insert_many(self, keys: Sequence[int]) -> list[int]:
        s = self._resident
        if s.isdisjoint(keys):
            # a key repeated inside an all-new batch keeps its first position (like dict.update)
            size = len(s)
            s.update(keys)
            self._log += keys if len(s) - size == len(keys) else list(dict.fromkeys(keys))
            over = len(s) - self.capacity
            return self._evict(over) if over > 0 else []
        evicted: list[int] = []
        cap, log, stale = self.capacity, self._log, self._stale
        for k in keys:
            if k in s:
                log.append(k)
                stale[k] = stale.get(k, 0) + 1
            else:
                if len(s) >= cap:
                    evicted.append(self._evict_one())
                s.add(k)
                log.append(k)
        return evicted

    def insert_count(self, keys: Sequence[int], fresh: int = 0) -> int:
        s = self._resident
        m = len(keys)
        split = m - fresh
        if split:
            old = keys[:split] if fresh else keys
            if not s.isdisjoint(old):  # hits inside the batch: key by key, then the fresh rest in bulk
                n = len(self.insert_many(old))
                return n + self.insert_count(keys[split:], fresh) if fresh else n
        # all new: the same result as one key at a time (oldest keys go first, then the batch's own)
        size = len(s)
        s.update(keys)
        if len(s) - size == m:
            self._log += keys
        else:  # a key repeated in the batch keeps its first position (like dict.update)
            self._log += dict.fromkeys(keys)
        over = len(s) - self.capacity
        if over <= 0:
            return 0
        self._drop(over)
        return over

    def _drop(self, over: int) -> None:
        """`_evict` without the victim list: a stretch of the log without stale keys goes in bulk."""
        log, lo, stale, s = self._log, self._lo, self._stale, self._resident
        w = log[lo:lo + over]
        # Few stale keys: a window leaves in bulk (a resident key's entries from `lo` on are its
        # stale ones, then its live one, so a key with n stale entries leaves iff it occurs more
        # than n times in the window), and the next `over - live` entries are read likewise.
        while stale and len(stale) * 8 < len(s) and not stale.keys().isdisjoint(w):
            counts: dict[int, int] = {}
            _count_elements(counts, filter(stale.__contains__, w))
            live = len(w)  # live entries in the window
            s.difference_update(w)
            for k, occ in counts.items():
                n = stale[k]
                if occ > n:
                    del stale[k]
                    live -= n
                else:
                    if occ == n:
                        del stale[k]
                    else:
                        stale[k] = n - occ
                    live -= occ
                    s.add(k)  # its live entry lies further on
            lo += len(w)
            over -= live
            w = log[lo:lo + over]
        if over and stale and not stale.keys().isdisjoint(w):  # many stale keys: one entry at a time
            gone: list[int] = []
            append, get = gone.append, stale.get
            while over:
                k = log[lo]
                lo += 1
                n = get(k)
                if n is None:
                    append(k)
                    over -= 1
                elif n > 1:
                    stale[k] = n - 1
                else:
                    del stale[k]
            s.difference_update(gone)
        elif over:
            s.difference_update(w)
            lo += over
        self._advance_to(lo)

    def shrink_to(self, n: int) -> list[int]:
        over = len(self._resident) - n
        return self._evict(over) if over > 0 else []

    def keys_in_order(self) -> list[int]:
        if not self._stale:
            return self._log[self._lo:]
        stale = dict(self._stale)
        out = []
        for k in islice(self._log, self._lo, None):
            n = stale.get(k)
            if n:
                stale[k] = n - 1
            else:
                out.append(k)
        return out

    def clear(self) -> None:
        self._resident.clear()
        self._log = []
        self._lo = 0
        self._stale.clear()


class FIFO(LRU):
    """First in, first out: hits do not change the order; re-inserting a resident key is a no-op."""

    name = "fifo"

    def touch_many(self, keys: Iterable[int]) -> None:
        return None

    def insert_many(self, keys: Sequence[int]) -> list[int]:
        s = self._resident
        if s.isdisjoint(keys):
            return super().insert_many(keys)
        evicted: list[int] = []
        log = self._log
        for k in keys:
            if k not in s:
                if len(s) >= self.capacity:
                    evicted.append(self._evict_one())
                s.add(k)
                log.append(k)
        return evicted


class LFU(Policy):
    """Least frequently used; ties go to the least recently used among the least frequent.

    A new key starts at frequency 1; each hit (or re-insert) adds 1. O(1) per operation with one
    insertion-ordered bucket per frequency.
    """

    name = "lfu"

    def __init__(self, capacity: int) -> None:
        super().__init__(capacity)
        self._resident: dict[int, int] = {}  # key -> frequency
        self._buckets: dict[int, OrderedDict[int, None]] = {}
        self._min = 0

    def _bump(self, key: int) -> None:
        f = self._resident[key]
        bucket = self._buckets[f]
        del bucket[key]
        if not bucket:
            del self._buckets[f]
            if self._min == f:
                self._min = f + 1
        self._resident[key] = f + 1
        self._buckets.setdefault(f + 1, OrderedDict())[key] = None

    def touch_many(self, keys: Iterable[int]) -> None:
        for k in keys:
            self._bump(k)

    def _evict_one(self) -> int:
        bucket = self._buckets[self._min]
        key, _ = bucket.popitem(last=False)
        if not bucket:
            del self._buckets[self._min]
            self._min = min(self._buckets) if self._buckets else 0
        del self._resident[key]
        return key

    def insert_many(self, keys: Sequence[int]) -> list[int]:
        evicted: list[int] = []
        for k in keys:
            if k in self._resident:
                self._bump(k)
                continue
            if len(self._resident) >= self.capacity:
                evicted.append(self._evict_one())
            self._resident[k] = 1
            self._buckets.setdefault(1, OrderedDict())[k] = None
            self._min = 1
        return evicted

    def shrink_to(self, n: int) -> list[int]:
        return [self._evict_one() for _ in range(max(len(self._resident) - n, 0))]

    def keys_in_order(self) -> list[int]:
        return [k for f in sorted(self._buckets) for k in self._buckets[f]]

    def clear(self) -> None:
        self._resident.clear()
        self._buckets.clear()
        self._min = 0


POLICIES: dict[str, type[Policy]] = {"lru": LRU, "fifo": FIFO, "lfu": LFU, "s3fifo": S3FIFO, "arc": ARC}


def make_policy(name: str, capacity: int) -> Policy:
    try:
        cls = POLICIES[name]
    except KeyError:
        raise ValueError(f"eviction policy: unknown {name!r}; valid choices: {', '.join(POLICIES)}") from None
    return cls(capacity)
