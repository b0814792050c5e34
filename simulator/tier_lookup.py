"""The offload tiers' part of a prompt's lookup (pure): after the GPU prefix, alternate runs served
by the CPU tier and by the L2 pool, CPU first, up to the first chunk in neither. Shared by the
twin's step and the fast replay loop, which must agree chunk for chunk."""
from __future__ import annotations

from collections.abc import Callable
from itertools import islice, takewhile


def cpu_l2_runs(rest: list[int], in_cpu: Callable[[int], bool],
                in_l2: Callable[[int], bool]) -> tuple[list[int], list[int], int]:
    """The chunks of `rest` (the prompt after its GPU prefix) the CPU tier serves, those the L2
    pool serves, and how many of `rest` were found: each chunk from the CPU if it holds it, else
    from L2; the walk stops at the first chunk in neither."""
    m = len(rest)
    k = 0
    cpu_keys: list[int] = []
    l2_keys: list[int] = []
    while k < m:
        a = len(list(takewhile(in_cpu, islice(rest, k, None)))) if k else len(list(takewhile(in_cpu, rest)))
        if a:
            cpu_keys += rest[k:k + a]
            k += a
            if k >= m:
                break
        b = len(list(takewhile(in_l2, islice(rest, k, None))))
        if not b:
            break
        run = rest[k:k + b]
        if any(map(in_cpu, run)):  # the CPU serves the rest of this run
            run = run[:list(map(in_cpu, run)).index(True)]
        l2_keys += run
        k += len(run)
    return cpu_keys, l2_keys, k
