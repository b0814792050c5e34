"""The planning workload rebuilt from the KV-event block stream (docs/kv-events.md, "Rebuilt workload").

Interface (what the tuner builder uses):

- `BlockRecorder.from_settings(settings.rebuild, group_idx=settings.group_idx, clock=...)`, enabled
  on the KV-event manager with `manager.enable_block_recorder(recorder)`: every engine's stored
  chains (hashes + parent), removals and clears, per model, in flat numpy columns, bounded in time
  (`retain_s`), in memory (`max_refs`: hash-space sampling of requests beyond it) and per engine
  (`engine_refs_per_s`).
- `RebuiltHistory.from_settings(recorder, store_counts(store), clock, settings.rebuild)`:
  `history(now, seconds) -> pl.DataFrame` in `simulator.records.WORKLOAD_SCHEMA`, the same contract
  as `agent.runtime.paying_runtime.FittedHistory`; `kind = "rebuilt"`; `available()` says whether
  any GPU store was recorded (else plan on the fitted workload, and say so).
- `merge.window_state(history, now, seconds)` / `encode_state` / `decode_state` / `MergedHistory`
  (merge.py): the mergeable form a sharded replica exports and the leader's history over all of
  them.

What the rebuilt workload cannot see (also in docs/kv-events.md):
- output lengths (every request gets `output_tokens`); sessions (`session_id` is null);
- the partial last block of each prompt (at most one block of tokens);
- the arrival time and prompt of a request that stored nothing (fully cached): counted from the
  counters, synthesised within the counter's scrape interval as a repeat of a prompt (or prefix)
  the same pod served (history.py, fill.py); which pod a replay routes it to is the router's choice;
- sharing finer than one engine block, or than 512 tokens when the block is smaller (layout.py);
- requests whose prefix entered the GPU from the shared L2 or the CPU tier look like any other
  request (their blocks are GPU stores); which tier served them is not in the GPU stream;
- under sampling, the counters are scaled by the sample rate (fully cached requests are
  synthesised at that rate).
"""
from agent.kvevents.rebuild.chains import Rebuilt, rebuild
from agent.kvevents.rebuild.collector import RebuildCollector
from agent.kvevents.rebuild.fill import PodRequests
from agent.kvevents.rebuild.history import RebuiltHistory, RebuiltWindow, store_counts
from agent.kvevents.rebuild.layout import to_frame
from agent.kvevents.rebuild.recorder import BlockRecorder

__all__ = ["BlockRecorder", "PodRequests", "RebuildCollector", "Rebuilt", "RebuiltHistory", "RebuiltWindow", "rebuild", "store_counts",
           "to_frame"]
