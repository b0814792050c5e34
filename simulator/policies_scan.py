"""Scan-resistant eviction policies for the shared L2 pool: S3-FIFO and ARC (see `simulator.policies`)."""
from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable, Sequence

from simulator.policy_base import Policy


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
