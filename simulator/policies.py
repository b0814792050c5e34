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

The hot paths use C-level iteration (`map`, `takewhile`, `dict.update`) so that the cost per
chunk stays close to one dict operation.
"""
from __future__ import annotations

from collections import OrderedDict, _count_elements, deque  # type: ignore[attr-defined]
from collections.abc import Iterable, Sequence
from itertools import islice, takewhile

_consume = deque(maxlen=0).extend


class Policy:
    name = "?"

    def __init__(self, capacity: int) -> None:
        if capacity < 1:
            raise ValueError(f"{self.name}: capacity must be >= 1 chunk, got {capacity}")
        self.capacity = capacity

    # -- subclasses provide _resident (a dict-like of resident keys) ------------------------------
    _resident: dict

    def __contains__(self, key: int) -> bool:
        return key in self._resident

    def __len__(self) -> int:
        return len(self._resident)

    def prefix_len(self, keys: Sequence[int], start: int = 0) -> int:
        it = islice(keys, start, None) if start else keys
        return len(list(takewhile(self._resident.__contains__, it)))

    def keys_in_order(self) -> list[int]:
        return list(self._resident)

    def insert_many(self, keys: Sequence[int]) -> list[int]:
        raise NotImplementedError

    def insert_count(self, keys: Sequence[int], fresh: int = 0) -> int:
        return len(self.insert_many(keys))


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
        if lo > 4096 and lo > len(log) >> 1:
            del log[:lo]
            lo = 0
        self._lo = lo
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
        if stale and not stale.keys().isdisjoint(w):
            live: list[int] = []
            append, get = live.append, stale.get
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
            s.difference_update(live)
        else:
            s.difference_update(w)
            lo += over
        if lo > 4096 and lo > len(log) >> 1:
            del log[:lo]
            lo = 0
        self._lo = lo

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


class S3FIFO(Policy):
    """S3-FIFO (Yang et al., SOSP'23): a small FIFO (10%) filters one-hit wonders, a main FIFO with
    2-bit frequencies keeps reused keys, and a ghost FIFO (keys only, as many as main) readmits
    recently evicted keys straight into main.

    A key leaving the small queue moves to main if it was hit at least once while resident
    (frequency reset to 0), otherwise it is evicted and remembered in the ghost. A key at the
    head of main with frequency f > 0 is reinserted at the tail with f - 1, otherwise evicted.
    """

    name = "s3fifo"

    def __init__(self, capacity: int) -> None:
        super().__init__(capacity)
        self._resident: dict[int, int] = {}  # key -> frequency 0..3
        self._small: OrderedDict[int, None] = OrderedDict()
        self._main: OrderedDict[int, None] = OrderedDict()
        self._ghost: OrderedDict[int, None] = OrderedDict()
        self._small_cap = max(1, capacity // 10)
        self._ghost_cap = max(1, capacity - self._small_cap)

    def touch_many(self, keys: Iterable[int]) -> None:
        r = self._resident
        for k in keys:
            f = r[k]
            if f < 3:
                r[k] = f + 1

    def _evict_one(self) -> int:
        r, small, main = self._resident, self._small, self._main
        while True:
            if small and (len(small) >= self._small_cap or not main):
                k, _ = small.popitem(last=False)
                if r[k] > 0:
                    r[k] = 0
                    main[k] = None
                    continue
                del r[k]
                self._ghost[k] = None
                if len(self._ghost) > self._ghost_cap:
                    self._ghost.popitem(last=False)
                return k
            k, _ = main.popitem(last=False)
            f = r[k]
            if f > 0:
                r[k] = f - 1
                main[k] = None
                continue
            del r[k]
            return k

    def insert_many(self, keys: Sequence[int]) -> list[int]:
        evicted: list[int] = []
        r = self._resident
        for k in keys:
            if k in r:
                if r[k] < 3:
                    r[k] += 1
                continue
            if len(r) >= self.capacity:
                evicted.append(self._evict_one())
            if k in self._ghost:
                del self._ghost[k]
                self._main[k] = None
            else:
                self._small[k] = None
            r[k] = 0
        return evicted

    def shrink_to(self, n: int) -> list[int]:
        return [self._evict_one() for _ in range(max(len(self._resident) - n, 0))]

    def keys_in_order(self) -> list[int]:
        return list(self._small) + list(self._main)

    def clear(self) -> None:
        for d in (self._resident, self._small, self._main, self._ghost):
            d.clear()


class ARC(Policy):
    """Adaptive Replacement Cache (Megiddo & Modha, FAST'03).

    T1 holds keys seen once recently, T2 keys seen at least twice; B1/B2 are their ghost lists.
    The target size p of T1 adapts on ghost hits: a hit in B1 grows p, a hit in B2 shrinks it.
    """

    name = "arc"

    def __init__(self, capacity: int) -> None:
        super().__init__(capacity)
        self._t1: OrderedDict[int, None] = OrderedDict()
        self._t2: OrderedDict[int, None] = OrderedDict()
        self._b1: OrderedDict[int, None] = OrderedDict()
        self._b2: OrderedDict[int, None] = OrderedDict()
        self._p = 0.0
        self._resident: dict[int, None] = {}  # union of T1 and T2

    def touch_many(self, keys: Iterable[int]) -> None:
        t1, t2 = self._t1, self._t2
        for k in keys:
            if k in t1:
                del t1[k]
            else:
                del t2[k]
            t2[k] = None

    def _replace(self, in_b2: bool) -> int:
        t1 = self._t1
        if t1 and (len(t1) > self._p or (in_b2 and len(t1) == self._p) or not self._t2):
            k, _ = t1.popitem(last=False)
            self._b1[k] = None
        else:
            k, _ = self._t2.popitem(last=False)
            self._b2[k] = None
        del self._resident[k]
        return k

    def insert_many(self, keys: Sequence[int]) -> list[int]:
        evicted: list[int] = []
        c = self.capacity
        t1, t2, b1, b2, res = self._t1, self._t2, self._b1, self._b2, self._resident
        for k in keys:
            if k in res:
                self.touch_many((k,))
                continue
            if k in b1:
                self._p = min(c, self._p + max(len(b2) / len(b1), 1.0))
                del b1[k]
                if len(res) >= c:
                    evicted.append(self._replace(False))
                t2[k] = None
            elif k in b2:
                self._p = max(0.0, self._p - max(len(b1) / len(b2), 1.0))
                del b2[k]
                if len(res) >= c:
                    evicted.append(self._replace(True))
                t2[k] = None
            else:
                l1 = len(t1) + len(b1)
                if l1 >= c:
                    if len(t1) < c:
                        b1.popitem(last=False)
                        if len(res) >= c:
                            evicted.append(self._replace(False))
                    else:
                        old, _ = t1.popitem(last=False)
                        del res[old]
                        evicted.append(old)
                else:
                    total = l1 + len(t2) + len(b2)
                    if total >= c:
                        if total >= 2 * c and b2:
                            b2.popitem(last=False)
                        if len(res) >= c:
                            evicted.append(self._replace(False))
                t1[k] = None
            res[k] = None
        return evicted

    def shrink_to(self, n: int) -> list[int]:
        return [self._replace(False) for _ in range(max(len(self._resident) - n, 0))]

    def keys_in_order(self) -> list[int]:
        return list(self._t1) + list(self._t2)

    def clear(self) -> None:
        for d in (self._t1, self._t2, self._b1, self._b2, self._resident):
            d.clear()
        self._p = 0.0


POLICIES: dict[str, type[Policy]] = {"lru": LRU, "fifo": FIFO, "lfu": LFU, "s3fifo": S3FIFO, "arc": ARC}


def make_policy(name: str, capacity: int) -> Policy:
    try:
        cls = POLICIES[name]
    except KeyError:
        raise ValueError(f"eviction policy: unknown {name!r}; valid choices: {', '.join(POLICIES)}") from None
    return cls(capacity)
