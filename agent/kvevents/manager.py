"""The KV-event subscriber manager: one SUB socket per engine stream (connect only, never bind),
sequence tracking, gap catch-up over a DEALER socket to the engine's replay ROUTER, restart
detection, and an event-time merge into `KvSignals`.

All sockets live in one I/O thread (`start()`/`stop()`), or in the caller's thread when it calls
`run_once()` itself. Read-outs (`snapshot`, `current_overlap`) and the prompt-token feed are
thread-safe.

Here: the lifecycle, the read-outs, the I/O loop, following the wanted endpoints and applying the
merged batches. A stream's state and sockets are in stream.py; the sequence tracking (gap ->
replay, drop -> restart) and the queue to the index in sequencer.py.
"""
from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Self

import zmq

from agent.kvevents.backlog import Backlog
from agent.kvevents.budget import plan_streams
from agent.kvevents.fleet import BlockSketches
from agent.kvevents.fleet_overlap import overlap_state
from agent.kvevents.merge import EventTimeMerger
from agent.kvevents.sequencer import StreamSequencer
from agent.kvevents.settings import EndpointSpec, KvEventsSettings
from agent.kvevents.signals import EngineId, KvSignals, KvSnapshot, OverlapReading
from agent.kvevents.sockets import disconnected
from agent.kvevents.stream import Stream, StreamSockets
from agent.kvevents.wire import Batch, PayloadError, decode_payload
from agent.kvevents.workload import PodCounters

if TYPE_CHECKING:
    from agent.kvevents.rebuild.recorder import BlockRecorder
    from agent.kvevents.store_curve import StoreStream

_APPLY_BUDGET_S = 0.05  # applying queued batches yields to the sockets after this long
_SNAPSHOT_WAIT_S = 0.01  # a read-out waits this long for the index, then serves the last snapshot
_SNAPSHOT_REFRESH_S = 1.0  # the I/O loop refreshes that last snapshot this often while busy
log = logging.getLogger(__name__)


class KvEventManager:
    """Subscribes to every configured engine stream and keeps the block-level signals current."""

    def __init__(self, settings: KvEventsSettings | None = None, *, clock: Callable[[], float] = time.time,
                 context: zmq.Context | None = None) -> None:
        self.settings = settings or KvEventsSettings()
        self.clock = clock
        self.signals = KvSignals(self.settings.limits.to_limits(), self.settings.group_idx,
                                 self.settings.overlap_window_s, clock)
        self._ctx = context or zmq.Context()
        self._own_ctx = context is None
        self._lock = threading.RLock()
        self._merger = EventTimeMerger(self.settings.reorder_hold_s, clock)
        self._streams: dict[EngineId, Stream] = {}
        self._sockets = StreamSockets(self._ctx, self.settings.max_message_bytes)
        self._wanted: tuple[EndpointSpec, ...] | None = tuple(self.settings.endpoints)
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()
        self._backlog = Backlog(self.settings.queue_bytes)
        self._sequencer = StreamSequencer(self.settings, clock, self.signals, self._lock, self._merger,
                                          self._backlog, self._sockets)
        self._behind = False  # batches ready but not applied yet (the apply budget ran out)
        self.skipped_models: tuple[str, ...] = ()
        self.applied_batches = 0
        self._last_snapshot = self.signals.snapshot()
        self._snapshot_at = time.monotonic()

    # -- lifecycle -------------------------------------------------------------------------
    def start(self) -> None:
        """Run the I/O loop in a daemon thread."""
        if self._thread is not None:
            return
        self._stop.clear()
        self._thread = threading.Thread(target=self._run, name="kv-events", daemon=True)
        self._thread.start()

    def stop(self, timeout: float = 5.0) -> None:
        if self._thread is not None:
            self._stop.set()
            self._thread.join(timeout)
            self._thread = None
        else:
            self._close_all()
        if self._own_ctx:
            self._ctx.term()
            self._own_ctx = False

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def _run(self) -> None:
        try:
            while not self._stop.is_set():
                self.run_once(100)
        finally:
            self._close_all()

    def set_endpoints(self, endpoints: Sequence[EndpointSpec]) -> None:
        """Replace the watched endpoints (discovery changed); applied by the I/O loop."""
        with self._lock:
            self._wanted = tuple(endpoints)

    # -- read-outs (any thread) ------------------------------------------------------------
    def snapshot(self) -> KvSnapshot:
        """The current signals; while the I/O loop holds the index for longer than a moment (a
        huge batch), the last snapshot taken (at most about a second old), so a render never
        waits for the index to catch up."""
        if not self._lock.acquire(timeout=_SNAPSHOT_WAIT_S):
            return self._last_snapshot
        try:
            return self._take_snapshot()
        finally:
            self._lock.release()

    def _take_snapshot(self) -> KvSnapshot:
        snap = self._last_snapshot = self.signals.snapshot()
        self._snapshot_at = time.monotonic()
        return snap

    def enable_store_curve(self, stream: StoreStream) -> None:
        """Keep the GPU stores for the CPU capacity curve (`agent.kvevents.store_curve`)."""
        with self._lock:
            self.signals.store_stream = stream

    def enable_block_recorder(self, recorder: BlockRecorder) -> None:
        """Record every engine's block stream for the rebuilt planning workload (rebuild/)."""
        with self._lock:
            self.signals.recorder = recorder

    def apply_local(self, engine: EngineId, batch: Batch) -> None:
        """Apply one decoded batch in the caller's thread, no sockets: an in-process fleet on a
        simulated clock (emulator/demo/sim_agent.py) feeds the same index, overlap and recorder."""
        with self._lock:
            self.signals.apply(engine, batch)
            self.applied_batches += 1

    def enable_block_sketches(self, sketches: BlockSketches) -> None:
        """Keep fleet-mergeable sketches of the stored blocks (sharded agents: fleet.py)."""
        with self._lock:
            self.signals.blocks = sketches

    def block_sketch_state(self, window_s: float | None = None) -> dict:
        """This replica's mergeable block sketches over the window ({} models when disabled) and its
        window readings per model (`overlap`), which the fleet overlap merges (fleet_overlap.py)."""
        with self._lock:
            blocks = self.signals.blocks
            state = blocks.state(window_s) if blocks is not None else {"window_s": window_s, "models": {}}
            readings = {m: self.signals.overlap(m, window_s) for m in self.signals.overlap_models()}
            state["overlap"] = overlap_state(readings, blocks)
            return state

    def current_overlap(self, model: str | None = None, window_s: float | None = None) -> OverlapReading | None:
        """The drift detector's signal: workload overlap over the window, or None without data."""
        with self._lock:
            return self.signals.overlap(model, window_s)

    def observe_prompt_tokens(self, pod: str, model: str, total: float, ts: float | None = None) -> None:
        """Feed one pod's scraped `vllm:prompt_tokens_total` (cumulative)."""
        with self._lock:
            self.signals.observe_prompt_tokens(pod, model, total, ts)

    def observe_counters(self, pod: str, model: str, counters: PodCounters, ts: float | None = None) -> None:
        """Feed one pod's scraped token counters: prompt tokens, local-compute tokens and external
        (LMCache) hit tokens, which correct the miss split for L2 hits and estimate the tails."""
        with self._lock:
            self.signals.observe_counters(pod, model, counters, ts)

    # -- the loop --------------------------------------------------------------------------
    def run_once(self, timeout_ms: int = 100) -> int:
        """Poll once, handle what arrived, release merged batches; returns batches applied."""
        self._reconcile()
        now = self.clock()
        deadlines = [r.deadline for r in (s.replay for s in self._streams.values()) if r is not None]
        if (d := self._merger.next_deadline()) is not None:
            deadlines.append(d)
        wait = 0 if self._behind else timeout_ms
        if deadlines:
            wait = max(0, min(wait, int((min(deadlines) - now) * 1000) + 1))
        events = self._sockets.poll(wait) if self._streams else {}
        if not self._streams:
            time.sleep(wait / 1000)
        for st in list(self._streams.values()):
            if st.sub is not None and st.sub in events:
                self._sequencer.drain_live(st)
            if st.monitor is not None and st.monitor in events:
                self._check_disconnect(st)
            if st.dealer is not None and st.dealer in events:
                self._sequencer.drain_replay(st)
        now = self.clock()
        for st in list(self._streams.values()):
            if st.replay is not None and now >= st.replay.deadline:
                self._sequencer.finish_replay(st, timed_out=True)
        return self._release()

    def drain(self, idle_ms: int = 200, max_s: float = 30.0) -> None:
        """Run the loop in this thread until nothing arrives for `idle_ms` and nothing is held
        (tests and one-shot tools; do not call while `start()` is running)."""
        end = time.monotonic() + max_s
        quiet_since = time.monotonic()
        while time.monotonic() < end:
            got = self.run_once(min(idle_ms, 50))
            busy = got or len(self._merger) or any(s.replay for s in self._streams.values())
            if busy:
                quiet_since = time.monotonic()
            elif (time.monotonic() - quiet_since) * 1000 >= idle_ms:
                return

    # -- streams ---------------------------------------------------------------------------
    def _reconcile(self) -> None:
        with self._lock:
            wanted, self._wanted = self._wanted, None
        if wanted is None:
            return
        plan = plan_streams(wanted, self.settings, {eid.model for eid in self._streams})
        if plan.skipped_models and plan.skipped_models != self.skipped_models:
            log.warning("kv-events: %d model(s) beyond limits.max_models=%d not indexed: %s",
                        len(plan.skipped_models), self.settings.limits.max_models, ", ".join(plan.skipped_models[:5]))
        self.skipped_models = plan.skipped_models
        self._sequencer.pending_cap = plan.pending_bytes
        self._backlog.share = plan.queue_bytes
        desired, hwm = plan.endpoints, plan.rcvhwm
        for eid in list(self._streams):
            st = self._streams[eid]
            if eid not in desired:
                self._close(st)
                del self._streams[eid]
                self._merger.forget(eid)
                self._backlog.forget(eid)
                with self._lock:
                    self.signals.forget(eid)
            elif desired[eid] != (st.endpoint, st.replay_endpoint, st.topic.decode()) or hwm[eid] != st.rcvhwm:
                self._close(st)  # moved (pod rescheduled): reopen, keep `last` to catch the restart
                st.endpoint, st.replay_endpoint, st.topic = desired[eid][0], desired[eid][1], desired[eid][2].encode()
                st.rcvhwm = hwm[eid]
                self._sockets.open_sub(st)
        for eid, (ep, rp, topic) in desired.items():
            if eid not in self._streams:
                st = self._streams[eid] = Stream(eid, ep, rp, topic.encode(), hwm[eid])
                with self._lock:
                    self.signals.stream(eid)
                self._sockets.open_sub(st)
        with self._lock:  # every engine's share of its pod's and the fleet's budgets
            for eid, (resident, history) in plan.caps.items():
                self.signals.set_caps(eid, resident, history)
            self.signals.keep_models(plan.models)
            self.signals.set_shadow_cap(plan.shadow_per_model)
            self._take_snapshot()  # read-outs see the new streams even while the index is busy

    def _close(self, st: Stream) -> None:
        if st.replay is not None:
            self._sequencer.finish_replay(st, timed_out=True)
        self._sockets.close_dealer(st)
        self._sockets.close_sub(st)

    def _check_disconnect(self, st: Stream) -> None:
        """The publisher dropped the connection. libzmq reconnects by itself after an ordinary
        close, but never after it refused a frame over ZMQ_MAXMSGSIZE, which would silence the
        pod for good: the SUB is reopened (its `last` kept, so the next batch shows the gap)."""
        assert st.monitor is not None
        if disconnected(st.monitor):
            with self._lock:
                self.signals.reconnected(st.engine)
            self._sockets.close_sub(st)
            self._sockets.open_sub(st)

    def _close_all(self) -> None:
        for st in self._streams.values():
            self._close(st)
        for stream, item in self._merger.pop_ready(flush=True):
            self._apply(stream, item)  # type: ignore[arg-type]

    # -- applying --------------------------------------------------------------------------
    def _release(self) -> int:
        """Apply the batches that are due, for at most `_APPLY_BUDGET_S` (then the sockets are
        read again, so libzmq's queue stays short while the index catches up)."""
        end = time.monotonic() + _APPLY_BUDGET_S
        n = 0
        ready: list = []
        while True:
            ready = self._merger.pop_ready(limit=8)
            for stream, item in ready:
                self._apply(stream, item)  # type: ignore[arg-type]
            n += len(ready)
            if not ready or time.monotonic() >= end:
                break
        self._behind = bool(ready)
        if n and time.monotonic() - self._snapshot_at >= _SNAPSHOT_REFRESH_S:
            with self._lock:
                self._take_snapshot()
        return n

    def _apply(self, engine: EngineId, item: tuple[str, object]) -> None:
        kind, value = item
        if kind == "batch":  # decoded outside the lock: read-outs do not wait for it
            topic, seq, payload = value  # type: ignore[misc]
            self._sequencer.done(engine, len(payload))
            try:
                batch = decode_payload(payload, topic, seq)
            except PayloadError:
                with self._lock:
                    self.signals.reject(engine, "malformed_payload")
                return
            with self._lock:
                self.signals.apply(engine, batch)
                self.applied_batches += 1
            return
        with self._lock:
            if kind == "restart":
                self.signals.restart(engine, value)  # type: ignore[arg-type]
            else:
                self.signals.resync(engine, value)  # type: ignore[arg-type]
