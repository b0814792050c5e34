"""Where the tuner's planning workload comes from: a `WorkloadSource`.

`history(now, seconds)` is the recent workload as a `simulator.records.WORKLOAD_SCHEMA` frame
(arrival order, the requests in [now - seconds, now]); `kind` says what it is, and every plan
and /healthz carry it:

- `rebuilt`: the block stream the agent's KV-event subscriber saw, rebuilt request by request;
- `fitted`: the fallback when KV events are off (or before the block stream holds anything): a synthetic workload fitted to the scraped
  counters (arrival rate, prompt-length mix, overlap; agent/runtime/paying_runtime.py
  `FittedHistory`). It sees neither multi-turn growth nor document popularity.
"""
from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

import polars as pl

from agent.settings import AgentSettings

KIND_NOTES = {
    "rebuilt": "the block stream rebuilt from the KV events",
    "fitted": "fitted fallback: a synthetic workload fitted to the scraped counters (KV events off)",
}


class WorkloadSource(Protocol):
    kind: str

    def history(self, now: float, seconds: float) -> pl.DataFrame: ...


class PreferRebuilt:
    """The rebuilt workload once the recorder holds GPU stores, the fitted one until then (and
    whenever the block stream has nothing): `kind` says which one the next plan uses."""

    def __init__(self, rebuilt: Any, fitted: WorkloadSource) -> None:
        self.rebuilt, self.fitted = rebuilt, fitted

    @property
    def kind(self) -> str:
        return "rebuilt" if self.rebuilt.available() else self.fitted.kind

    def history(self, now: float, seconds: float) -> pl.DataFrame:
        return self.rebuilt(now, seconds) if self.rebuilt.available() else self.fitted.history(now, seconds)


def planning_workload(settings: AgentSettings, store: Any, overlap: Any, clock: Callable[[], float],
                      rebuilt: Any = None) -> tuple[WorkloadSource, Any]:
    """The planning workload over the agent's store: `rebuilt` (the block stream's
    `RebuiltHistory`, None when KV events are off) once it holds GPU stores, else the fitted
    workload. Returns it and the fitted one (the fallback, and what the twin cluster's observed GPU
    capacity and load term come from). `overlap`: where the KV-event reuse ratio is read (a
    sharded leader: the merged one)."""
    from agent.runtime.paying_runtime import FittedHistory

    ws = settings.tuner.warm_start
    fitted = FittedHistory(store, overlap, clock, window_s=settings.tuner.drift.window_s,
                           max_requests=ws.max_requests, max_block_refs=ws.max_block_refs, seed=ws.seed)
    return (fitted if rebuilt is None else PreferRebuilt(rebuilt, fitted)), fitted


def record_blocks(settings: AgentSettings, kv: Any, store: Any, clock: Callable[[], float]) -> Any:
    """A block recorder on the KV-event manager `kv` and the `RebuiltHistory` over it, from
    `kv_events.rebuild` (what the runtime's `_add_block_recorder` makes, for an in-process agent)."""
    from agent.kvevents.rebuild import BlockRecorder, RebuiltHistory, store_counts

    cfg = settings.kv_events
    recorder = BlockRecorder.from_settings(cfg.rebuild, group_idx=cfg.group_idx, clock=clock)
    kv.enable_block_recorder(recorder)
    return RebuiltHistory.from_settings(recorder, store_counts(store), clock, cfg.rebuild)


def describe(source: WorkloadSource) -> dict[str, str]:
    """What /healthz shows of the planning workload."""
    return {"kind": source.kind, "note": KIND_NOTES.get(source.kind, source.kind)}


__all__ = ["KIND_NOTES", "PreferRebuilt", "WorkloadSource", "describe", "planning_workload", "record_blocks"]
