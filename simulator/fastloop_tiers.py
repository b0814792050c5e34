"""The tier updates of the Python batch loop (`simulator.fastloop`), written out over LRU/FIFO state.

`LogTiers` holds a fleet's GPU and CPU tier per pod and its L2 pool (all `LRU` or `FIFO` from
`simulator.policies`: a set of resident keys, an append-only recency log, stale counts) and does,
for one request, what `Twin._process` does to them: hits move to the end of an LRU log, the chunks
the GPU missed are stored there, the L2 hits and the computed chunks in the CPU tier, the computed
chunks in the L2 pool (then its watermark shrink). The common cases are done inline on the
policy's own state (a bulk store of chunks none of which is resident; an eviction window without
stale entries; on the GPU also a window whose only stale entries are of one hot key, a prompt head
every request shares); the rare ones call the policy's methods (`insert_count`, `_drop`,
`shrink_to`), which work on the same state, so every tier ends as the policy itself leaves it.
"""
from __future__ import annotations

from collections import _count_elements  # type: ignore[attr-defined]
from typing import TYPE_CHECKING

from simulator.policies import LRU

if TYPE_CHECKING:
    from simulator.twin import Twin


class LogTiers:
    """A twin's LRU/FIFO tiers as the batch loop updates them, with the evictions to write back."""

    __slots__ = (
        "c_cap",
        "c_ev",
        "c_lru",
        "cpu_in",
        "cpu_on",
        "cpus",
        "g_cap",
        "g_ev",
        "gpu_in",
        "gpu_on",
        "gpus",
        "l2",
        "l2_evicted",
        "l2_high",
        "l2_in",
        "l2_low",
        "l2_on",
        "l2_runs",
        "l_cap",
        "l_lru",
    )

    def __init__(self, twin: Twin) -> None:
        pods = twin._pods
        self.gpus = gpus = [p.gpu for p in pods]
        self.cpus = cpus = [p.cpu for p in pods]
        self.l2 = l2 = twin._l2
        self.gpu_on = gpu_on = gpus[0] is not None
        self.cpu_on = cpu_on = cpus[0] is not None
        self.l2_on = l2_on = l2 is not None
        self.g_cap = gpus[0].capacity if gpu_on else 0
        self.c_cap = cpus[0].capacity if cpu_on else 0
        self.l_cap = l2.capacity if l2_on else 0
        self.c_lru = cpu_on and type(cpus[0]) is LRU
        self.l_lru = l2_on and type(l2) is LRU
        self.l2_high, self.l2_low = twin._l2_high, twin._l2_low
        # membership tests, for the lookups and the miss attribution
        self.gpu_in = [g._resident.__contains__ if g is not None else None for g in gpus]
        self.cpu_in = [p._resident.__contains__ if p is not None else None for p in cpus]
        self.l2_in = l2._resident.__contains__ if l2_on else None
        self.g_ev = [0] * len(pods)
        self.c_ev = [0] * len(pods)
        self.l2_evicted = self.l2_runs = 0

    def update(self, idx: int, chunks: list[int], g: int, fresh: int, cpu_keys: list[int], l2_keys: list[int],
               computed: list[int]) -> None:
        """Pod `idx` served `chunks`: `g` GPU hits, then `cpu_keys` and `l2_keys` found below, then
        `computed` (the last `fresh` of them new to the workload)."""
        if self.gpu_on:
            p = self.gpus[idx]
            if g:  # hits move to the log's end (as `LRU.touch_many`)
                keys = chunks[:g]
                p._log += keys
                _count_elements(p._stale, keys)
            if g < len(chunks):
                ev = _store(p, chunks[g:] if g else chunks, fresh, self.g_cap, True)
                if ev:
                    self.g_ev[idx] += ev
        if self.cpu_on:
            p = self.cpus[idx]
            if cpu_keys and self.c_lru:
                p._log += cpu_keys
                _count_elements(p._stale, cpu_keys)
            if computed or l2_keys:
                ev = _store(p, l2_keys + computed if l2_keys else computed, fresh, self.c_cap, False)
                if ev:
                    self.c_ev[idx] += ev
        if self.l2_on:
            l2 = self.l2
            if l2_keys and self.l_lru:
                l2._log += l2_keys
                _count_elements(l2._stale, l2_keys)
            if computed:
                ev = _store(l2, computed, fresh, self.l_cap, False)
                if len(l2._resident) > self.l2_high:
                    ev += len(l2.shrink_to(self.l2_low))
                if ev:
                    self.l2_evicted += ev
                    self.l2_runs += 1

    def write_back(self, twin: Twin) -> None:
        """Add the evictions counted here to the pods' and the L2 pool's totals."""
        for q, p in enumerate(twin._pods):
            p.totals.gpu_evicted_chunks += self.g_ev[q]
            p.totals.cpu_evicted_chunks += self.c_ev[q]
        twin._l2_totals.evicted_chunks += self.l2_evicted
        twin._l2_totals.eviction_runs += self.l2_runs


def _store(p: LRU, keys: list[int], fresh: int, cap: int, one_hot: bool) -> int:
    """Store `keys` (the last `fresh` of them new to the workload) in tier `p` of capacity `cap`, as
    `p.insert_count(keys, fresh)` does; returns how many keys it evicted. `one_hot`: drop a window
    whose stale entries are all of one key inline (the GPU's shared prompt head)."""
    s = p._resident
    m = len(keys)
    split = m - fresh
    if split and not s.isdisjoint(keys[:split] if fresh else keys):
        return p.insert_count(keys, fresh)
    size = len(s)
    s.update(keys)
    log = p._log
    if len(s) - size == m:
        log += keys
    else:
        log += dict.fromkeys(keys)
    ev = len(s) - cap
    if ev <= 0:
        return 0
    lo = p._lo
    st = p._stale
    w = log[lo:lo + ev]
    if st and not st.keys().isdisjoint(w):
        if not (one_hot and len(st) == 1 and _drop_one_hot(p, log, lo, ev, w)):
            p._drop(ev)
    else:
        s.difference_update(w)
        p._advance_to(lo + ev)
    return ev


def _drop_one_hot(p: LRU, log: list[int], lo: int, ev: int, w: list[int]) -> bool:
    """Evict the `ev` oldest keys of an LRU tier whose only stale key is one hot key with entries
    in the window `w` (= log[lo:lo + ev]), as `LRU._drop` would; False, with nothing done, when
    the key itself leaves (more of its entries in the window than it has stale ones)."""
    s, st = p._resident, p._stale
    ((k1, n1),) = st.items()
    occ = w.count(k1)
    if occ > n1:
        return False
    # only stale entries of it here: the window leaves, then `occ` more
    if occ == n1:
        del st[k1]
    else:
        st[k1] = n1 - occ
    s.difference_update(w)
    s.add(k1)
    lo += ev
    w = log[lo:lo + occ]
    if st and k1 in w:
        p._lo = lo
        p._drop(occ)
    else:
        s.difference_update(w)
        p._advance_to(lo + occ)
    return True
