"""The agent on a simulated clock, in process: all the simulated-clock harness hands the tuner.

`SimAgent` holds the agent's own pieces on the cluster's clock, without sockets or threads:

- the window store, fed each `scrape(now, snapshots)` through the agent's normaliser
  (`agent.collect.jobs.ScrapeCycle.process_payload`, then `WindowStore.ingest`): one scrape cycle
  of what every emulated pod's vLLM `/metrics` serves (`TwinFleet.snapshots`), handed over as the
  samples prometheus_client would write (`python_client_samples`: the text itself is neither
  written nor parsed, which would cost more than the rest of a run; the parser has tests of its
  own against the same pages);
- the KV-event manager (index, overlap, block recorder), fed the fleet's block events
  (`contracts.events`, through `sink`) as decoded batches, one per pod and twin step
  (`KvEventManager.apply_local`), and the scraped token counters after each scrape, as the
  agent's `kv_counters` job does.

What the tuner gets from it is what `tierpilot run` gets from the real agent: `window_source`,
`drift_signals()`, `latency_points` and the planning `workload` (rebuilt from the block stream,
or fitted to the counters with `kv_events.enabled: false`), all over the agent's robust view of
the store (`agent.runtime.fleet_robust.planning_view`) and built by the agent's own code
(`agent.runtime.tuning.workload.planning_workload`, `agent.runtime.tuning_bridge`).
"""
from __future__ import annotations

from collections.abc import Callable

from agent.collect.jobs import ScrapeCycle
from agent.collect.mapping import builtin_mapping_paths, load_mappings
from agent.collect.normalise import resolve
from agent.collect.parse import Payload
from agent.collect.store import WindowStore
from agent.kvevents import EngineId, KvEventManager
from agent.kvevents.wire import Batch, Cleared, Removed, Stored
from agent.runtime.fleet_robust import planning_view
from agent.runtime.paying_runtime import latency_points
from agent.runtime.tuning.workload import WorkloadSource, planning_workload, record_blocks
from agent.runtime.tuning_bridge import StoreWindowSource, drift_signals, feed_kv_counters
from agent.settings import AgentSettings
from contracts import events as ce
from contracts.tier_model import Sample, Target
from emulator.cluster.exposition import Snapshot, python_client_samples

SCRAPES_PER_COUNTER_WINDOW = 2.5  # the kv_counters feed reads the pods scraped within 2.5 intervals


class SimAgent:
    """The agent's store and KV-event subscriber for `pods` serving `model`; `scrape_interval_s`:
    how often the harness calls `scrape`."""

    def __init__(self, settings: AgentSettings, *, model: str, clock: Callable[[], float],
                 scrape_interval_s: float) -> None:
        self.settings, self.model, self.clock = settings, model, clock
        self.store = WindowStore(settings.store.retention_s, settings.store.window_s, clock)
        self.mappings = load_mappings([*builtin_mapping_paths(), *settings.mappings])
        self.cycle = ScrapeCycle(settings, self.mappings, self.store, clock=clock, monotonic=clock)
        self._wanted = self.mappings.wanted.get("vllm") or frozenset()
        self.kv = (KvEventManager(settings.kv_events.manager_settings(), clock=clock)
                   if settings.kv_events.enabled else None)
        self.counter_window_s = scrape_interval_s * SCRAPES_PER_COUNTER_WINDOW
        self.workload: WorkloadSource
        rebuilt = record_blocks(settings, self.kv, self.store, clock) if self.kv is not None else None
        # the tuner's view of the store, as `tierpilot run` builds it: no single pod steers it
        self.planning_store = planning_view(settings, self.store)
        self.workload, self.fitted = planning_workload(settings, self.planning_store, self.kv, clock, rebuilt)
        self.window_source = StoreWindowSource(self.planning_store)
        self._targets: dict[str, Target] = {}
        self._step: tuple[float, str] | None = None
        self._pending: list[Stored | Removed | Cleared] = []
        self._seq: dict[str, int] = {}

    # -- the block stream ------------------------------------------------------------------------
    def sink(self, event: ce.BlockStored | ce.BlockRemoved | ce.AllBlocksCleared) -> None:
        """`contracts.events.EventSink`: one pod's events of one twin step form one batch."""
        if self.kv is None:
            return
        step = (event.ts, event.pod)
        if self._step is not None and step != self._step:
            self.flush()
        self._step = step
        if isinstance(event, ce.BlockStored):
            self._pending.append(Stored(list(event.block_hashes), event.parent_block_hash, event.block_size,
                                        event.medium.upper(), None))
        elif isinstance(event, ce.BlockRemoved):
            self._pending.append(Removed(list(event.block_hashes), event.medium.upper(), None))
        else:
            self._pending.append(Cleared())

    def flush(self) -> None:
        if self.kv is None or self._step is None or not self._pending:
            return
        ts, pod = self._step
        seq = self._seq.get(pod, 0)
        self._seq[pod] = seq + 1
        self.kv.apply_local(EngineId(pod, self.model), Batch(f"kv@{pod}@{self.model}".encode(), seq, ts, None,
                                                             self._pending, {}))
        self._pending = []
        self._step = None

    # -- the scrape --------------------------------------------------------------------------------
    def scrape(self, now: float, snapshots: dict[str, Snapshot]) -> None:
        """One scrape cycle of every pod at `now` (the block stream up to now applied first)."""
        self.flush()
        signals, restarted, read_at = [], set(), {}
        for pod, snap in snapshots.items():
            target = self._targets.setdefault(pod, Target(url=f"http://{pod}.sim/metrics", role="vllm", pod=pod))
            out = self.cycle.process_payload(target, self._payload(snap), 0.0)
            signals.extend(out.signals)
            if out.restarted:
                restarted.update((s.pod, s.source) for s in out.signals)
            read_at.update(((s.pod, s.source), now) for s in out.signals)
        self.store.ingest(resolve(signals, self.mappings), ts=now, restarted=restarted, read_at=read_at)
        if self.kv is not None:
            feed_kv_counters(self.store, self.kv, window_s=self.counter_window_s, ts=now)

    def _payload(self, snap: Snapshot) -> Payload:
        """The samples of the names the vLLM mappings read, as the parser would hand them over."""
        wanted = self._wanted
        by_name: dict[str, list[Sample]] = {}
        types: dict[str, str] = {}
        lines = 0
        for family, kind, samples in python_client_samples(snap):
            types[family] = kind
            lines += len(samples)
            for smp in samples:
                if smp.name in wanted:
                    by_name.setdefault(smp.name, []).append(Sample(smp.name, dict(smp.labels), smp.value))
        return Payload(by_name, types, lines)

    # -- what the tuner reads ------------------------------------------------------------------------
    def drift_signals(self) -> dict[str, float]:
        d = self.settings.tuner.drift
        return drift_signals(self.planning_store, self.kv, d.window_s, long_prompt_tokens=d.long_prompt_tokens)

    def latency_points(self, since: float, until: float) -> list[tuple[float, float, float]]:
        return latency_points(self.planning_store, since, until, self.settings.tuner.planner.calibration_step_s)


__all__ = ["SimAgent"]
