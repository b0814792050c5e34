"""The twin benchmarks' reference: a plain `OrderedDict` LRU over the same block lists."""
from __future__ import annotations

from collections import OrderedDict


def reference_lru(block_lists: list[list[int]], capacity: int) -> int:
    """Hits of one LRU of `capacity` blocks over every request's blocks, in order."""
    cache: OrderedDict[int, None] = OrderedDict()
    hits = 0
    for blocks in block_lists:
        for h in blocks:
            if h in cache:
                cache.move_to_end(h)
                hits += 1
            else:
                cache[h] = None
                if len(cache) > capacity:
                    cache.popitem(last=False)
    return hits
