"""The agent's process, set up once before it runs for weeks: the C allocator (allocator.py) and
Python's cyclic garbage collector.

A cycle over a large fleet makes and drops a few hundred thousand small containers (the decoded
answers' structs, the snapshot's per-pod dicts and tuples). At CPython's default threshold a
collection runs every 700 new containers: thousands of collections a cycle, each walking what
survived, and every tenth of those walking more. On the Prometheus source's 2,000-pod cycle (its
real answers replayed in one process) the collector took about 0.2 s of CPU a cycle, a tenth to a
quarter of the agent's work; a threshold of 50,000 leaves a dozen collections over six cycles.
`freeze_startup()`, once the runtime is assembled, moves the modules, settings and assembly into
the permanent generation, so no full collection walks them again. Neither changes what the agent
computes.
"""
from __future__ import annotations

import gc
from collections.abc import Mapping

from agent.runtime.allocator import pin_mmap_threshold

GC_THRESHOLDS = (50_000, 20, 20)  # new containers before a collection; young, then old, collections per older one


def configure_process(env: Mapping[str, str] | None = None) -> None:
    """Before the agent is built: the allocator's mmap threshold and the collector's thresholds."""
    pin_mmap_threshold(env=env)  # large transient arrays go back to the system when freed
    gc.set_threshold(*GC_THRESHOLDS)


def freeze_startup() -> None:
    """Once the agent is assembled: what exists now lives as long as the process."""
    gc.collect()
    gc.freeze()


__all__ = ["GC_THRESHOLDS", "configure_process", "freeze_startup"]
