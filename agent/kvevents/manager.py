"""The KV-event subscriber manager: one SUB socket per engine stream (connect only, never bind),
sequence tracking, gap catch-up over a DEALER socket to the engine's replay ROUTER, restart
detection, and an event-time merge into `KvSignals`.

All sockets live in one I/O thread (`start()`/`stop()`), or in the caller's thread when it calls
`run_once()` itself. Read-outs (`snapshot`, `current_overlap`) and the prompt-token feed are
thread-safe.

Per stream, for a message with sequence s after last seen L:
- s == L + 1: apply.
- s > L + 1: a gap of s - L - 1 messages; with a replay endpoint the missing range is requested
  (`[b"", L+1]` on a DEALER) while live messages queue; without, they are counted lost.
- s <= L: the engine restarted (its seq restarts at 0): its index is cleared, then s is applied
  (and 0..s-1 replayed from the new incarnation when possible).
"""
from __future__ import annotations

import dataclasses
import logging
import threading
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Self

import zmq

from agent.kvevents.backlog import Backlog, ShedChange
from agent.kvevents.budget import plan_streams
from agent.kvevents.fleet import BlockSketches
from agent.kvevents.fleet_overlap import overlap_state
from agent.kvevents.merge import EventTimeMerger
from agent.kvevents.replay import ReplayState
from agent.kvevents.settings import EndpointSpec, KvEventsSettings
from agent.kvevents.signals import EngineId, KvSignals, KvSnapshot, OverlapReading
from agent.kvevents.sockets import disconnected, open_dealer, open_sub
from agent.kvevents.wire import (
    END_SEQ_BYTES,
    Batch,
    FrameError,
    PayloadError,
    decode_payload,
    peek_ts,
    split_frames,
    split_replay,
)
from agent.kvevents.workload import PodCounters

if TYPE_CHECKING:
    from agent.kvevents.rebuild.recorder import BlockRecorder
    from agent.kvevents.store_curve import StoreStream

END_SEQ = END_SEQ_BYTES
_DRAIN = 256  # messages read from one socket before looking at the others
_APPLY_BUDGET_S = 0.05  # applying queued batches yields to the sockets after this long
_SNAPSHOT_WAIT_S = 0.01  # a read-out waits this long for the index, then serves the last snapshot
_SNAPSHOT_REFRESH_S = 1.0  # the I/O loop refreshes that last snapshot this often while busy
log = logging.getLogger(__name__)


@dataclasses.dataclass
class _Stream:
    engine: EngineId
    endpoint: str
    replay_endpoint: str | None
    topic: bytes
    rcvhwm: int = 1000
    sub: zmq.Socket | None = None
    monitor: zmq.Socket | None = None  # the SUB's DISCONNECTED events
    dealer: zmq.Socket | None = None
    last: int | None = None
    replay: ReplayState | None = None


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
        self._streams: dict[EngineId, _Stream] = {}
        self._poller = zmq.Poller()
        self._wanted: tuple[EndpointSpec, ...] | None = tuple(self.settings.endpoints)
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()
        self._pending_cap = self.settings.replay_pending_bytes
        self._backlog = Backlog(self.settings.queue_bytes)
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
        events = dict(self._poller.poll(wait)) if self._streams else {}
        if not self._streams:
            time.sleep(wait / 1000)
        for st in list(self._streams.values()):
            if st.sub is not None and st.sub in events:
                self._drain_live(st)
            if st.monitor is not None and st.monitor in events:
                self._check_disconnect(st)
            if st.dealer is not None and st.dealer in events:
                self._drain_replay(st)
        now = self.clock()
        for st in list(self._streams.values()):
            if st.replay is not None and now >= st.replay.deadline:
                self._finish_replay(st, timed_out=True)
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

    # -- sockets ---------------------------------------------------------------------------
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
        self._pending_cap = plan.pending_bytes
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
                self._open(st)
        for eid, (ep, rp, topic) in desired.items():
            if eid not in self._streams:
                st = self._streams[eid] = _Stream(eid, ep, rp, topic.encode(), hwm[eid])
                with self._lock:
                    self.signals.stream(eid)
                self._open(st)
        with self._lock:  # every engine's share of its pod's and the fleet's budgets
            for eid, (resident, history) in plan.caps.items():
                self.signals.set_caps(eid, resident, history)
            self.signals.keep_models(plan.models)
            self.signals.set_shadow_cap(plan.shadow_per_model)
            self._take_snapshot()  # read-outs see the new streams even while the index is busy

    def _open(self, st: _Stream) -> None:
        st.sub, st.monitor = open_sub(self._ctx, st.endpoint, st.rcvhwm, self.settings.max_message_bytes)
        self._poller.register(st.monitor, zmq.POLLIN)
        self._poller.register(st.sub, zmq.POLLIN)

    def _open_dealer(self, st: _Stream) -> zmq.Socket:
        assert st.replay_endpoint is not None
        dealer = st.dealer = open_dealer(self._ctx, st.replay_endpoint, self.settings.max_message_bytes)
        self._poller.register(dealer, zmq.POLLIN)
        return dealer

    def _close_dealer(self, st: _Stream) -> None:
        if st.dealer is not None:
            self._poller.unregister(st.dealer)
            st.dealer.close(linger=0)
            st.dealer = None

    def _close(self, st: _Stream) -> None:
        if st.replay is not None:
            self._finish_replay(st, timed_out=True)
        self._close_dealer(st)
        self._close_sub(st)

    def _close_sub(self, st: _Stream) -> None:
        if st.monitor is not None:
            self._poller.unregister(st.monitor)
            if st.sub is not None:
                st.sub.disable_monitor()
            st.monitor.close(linger=0)
            st.monitor = None
        if st.sub is not None:
            self._poller.unregister(st.sub)
            st.sub.close(linger=0)
            st.sub = None

    def _check_disconnect(self, st: _Stream) -> None:
        """The publisher dropped the connection. libzmq reconnects by itself after an ordinary
        close, but never after it refused a frame over ZMQ_MAXMSGSIZE, which would silence the
        pod for good: the SUB is reopened (its `last` kept, so the next batch shows the gap)."""
        assert st.monitor is not None
        if disconnected(st.monitor):
            with self._lock:
                self.signals.reconnected(st.engine)
            self._close_sub(st)
            self._open(st)

    def _close_all(self) -> None:
        for st in self._streams.values():
            self._close(st)
        for stream, item in self._merger.pop_ready(flush=True):
            self._apply(stream, item)  # type: ignore[arg-type]

    # -- live messages ---------------------------------------------------------------------
    def _drain_live(self, st: _Stream) -> None:
        assert st.sub is not None
        for _ in range(_DRAIN):
            try:
                frames = st.sub.recv_multipart(zmq.NOBLOCK)
            except zmq.Again:
                return
            try:
                topic, seq, payload = split_frames(frames)
            except FrameError:
                with self._lock:
                    self.signals.reject(st.engine, "malformed_frame")
                continue
            if not topic.startswith(st.topic):
                with self._lock:
                    self.signals.reject(st.engine, "wrong_topic")
                continue
            if st.replay is not None:
                if not st.replay.queue((topic, seq, payload), self._pending_cap):
                    self._finish_replay(st, timed_out=True)
                continue
            self._sequence(st, topic, seq, payload)

    def _sequence(self, st: _Stream, topic: bytes, seq: int, payload: bytes) -> None:
        last = st.last
        if last is None:
            st.last = seq
            if seq > 0 and self.settings.replay_on_join and st.replay_endpoint:
                self._start_replay(st, 0, topic, seq, payload, count_lost=False)
                return
        elif seq == last + 1:
            st.last = seq
        elif seq <= last:  # PUB/SUB never duplicates, so an equal seq is a restart as well
            try:  # the engine restarted between its last batch and this one: clear it at this ts
                ts = decode_payload(payload, topic, seq).ts
            except PayloadError:
                ts = float("-inf")  # the merger clamps it to the stream's last ts
            self._merger.push(st.engine, ts, ("restart", ts))
            st.last = seq
            if seq > self.settings.max_sequence_jump:
                self._broken_jump(st, topic, seq, payload, resync=False)
                return
            if seq > 0:
                self._gap(st, 0, topic, seq, payload)
                return
        elif seq - last - 1 > self.settings.max_sequence_jump:
            self._broken_jump(st, topic, seq, payload, resync=True)
            return
        else:
            self._gap(st, last + 1, topic, seq, payload)
            return
        self._decode_push(st, topic, seq, payload)

    def _broken_jump(self, st: _Stream, topic: bytes, seq: int, payload: bytes, resync: bool) -> None:
        """A jump no engine makes (vLLM adds 1 per batch from 0): counted once as
        `sequence_jump`, never as billions of missed messages; the index restarts from here."""
        with self._lock:
            self.signals.reject(st.engine, "sequence_jump")
        st.last = seq
        if resync:
            try:
                ts = decode_payload(payload, topic, seq).ts
            except PayloadError:
                ts = float("-inf")
            self._merger.push(st.engine, ts, ("resync", ts))
        self._decode_push(st, topic, seq, payload)

    def _gap(self, st: _Stream, start: int, topic: bytes, seq: int, payload: bytes) -> None:
        with self._lock:
            self.signals.gap(st.engine, seq - start)
        st.last = seq
        if st.replay_endpoint:
            self._start_replay(st, start, topic, seq, payload, count_lost=True)
        else:
            with self._lock:
                self.signals.replay_result(st.engine, 0, seq - start)
            self._decode_push(st, topic, seq, payload)

    def _decode_push(self, st: _Stream, topic: bytes, seq: int, payload: bytes) -> None:
        """Queue a batch for the index as its wire bytes (decoded when applied), or shed it when
        the engine's queue holds its share of `queue_bytes`; its sequence number counts as seen
        either way (a shed batch is counted as shed, not as a gap)."""
        admitted, change = self._backlog.admit(st.engine, len(payload))
        if change is not None:
            self._log_shed(change)
        if not admitted:
            with self._lock:
                self.signals.shed(st.engine, len(payload))
            return
        try:
            ts = peek_ts(payload)
        except PayloadError:
            self._done(st.engine, len(payload))
            with self._lock:
                self.signals.reject(st.engine, "malformed_payload")
            return
        self._merger.push(st.engine, ts, ("batch", (topic, seq, payload)))

    def _done(self, engine: EngineId, nbytes: int) -> None:
        change = self._backlog.done(engine, nbytes)
        if change is not None:
            self._log_shed(change)

    @staticmethod
    def _log_shed(change: ShedChange) -> None:
        eng = change.engine
        name = f"{eng.pod} ({eng.model}, dp {eng.dp_rank})" if isinstance(eng, EngineId) else str(eng)
        if change.started:
            log.warning("kv-events: %s: %.1f MiB of batches wait for the index (its share of "
                        "kv_events.queue_bytes); shedding new batches until it catches up",
                        name, change.share / 2**20)
        else:
            log.warning("kv-events: %s: the index caught up; %d batch(es) (%.1f MiB) were shed",
                        name, change.messages, change.nbytes / 2**20)

    # -- replay ----------------------------------------------------------------------------
    def _start_replay(self, st: _Stream, start: int, topic: bytes, seq: int, payload: bytes,
                      count_lost: bool) -> None:
        dealer = st.dealer or self._open_dealer(st)
        st.replay = ReplayState(start, seq, self.clock() + self.settings.replay_timeout_s, count_lost,
                                [(topic, seq, payload)])
        dealer.send_multipart((b"", start.to_bytes(8, "big")))

    def _drain_replay(self, st: _Stream) -> None:
        assert st.dealer is not None
        for _ in range(_DRAIN):
            try:
                frames = st.dealer.recv_multipart(zmq.NOBLOCK)
            except zmq.Again:
                return
            rep = st.replay
            if rep is None:
                continue  # a late answer to an abandoned request
            reply = split_replay(frames, st.topic)
            if reply is None:
                with self._lock:
                    self.signals.reject(st.engine, "malformed_replay")
                continue
            topic, seq_raw, payload = reply
            if seq_raw == END_SEQ and not payload:
                self._finish_replay(st, timed_out=False)
                return
            seq = int.from_bytes(seq_raw, "big")
            if rep.accept(seq):
                self._decode_push(st, topic, seq, payload)

    def _finish_replay(self, st: _Stream, timed_out: bool) -> None:
        rep, st.replay = st.replay, None
        if rep is None:
            return
        if timed_out:
            self._close_dealer(st)  # drop whatever answer is still in flight
        with self._lock:
            self.signals.replay_result(st.engine, *rep.outcome(timed_out))
        st.last = rep.stop - 1
        for topic, seq, payload in rep.pending:
            if st.replay is not None:  # a new gap inside the queued messages started a replay
                st.replay.pending.append((topic, seq, payload))
            else:
                self._sequence(st, topic, seq, payload)

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
            self._done(engine, len(payload))
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
