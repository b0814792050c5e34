"""Sequence tracking of the engine streams for the subscriber manager (manager.py), in its I/O
thread: live and replayed messages read from a stream's sockets, gap -> replay, drop -> restart,
a jump no engine makes -> resync, and each batch in sequence queued for the index as its wire
bytes (bounded per engine by the backlog, ordered by the event-time merger).

Per stream, for a message with sequence s after last seen L:
- s == L + 1: apply.
- s > L + 1: a gap of s - L - 1 messages; with a replay endpoint the missing range is requested
  (`[b"", L+1]` on a DEALER) while live messages queue; without, they are counted lost.
- s <= L: the engine restarted (its seq restarts at 0): its index is cleared, then s is applied
  (and 0..s-1 replayed from the new incarnation when possible).
"""
from __future__ import annotations

import logging
import threading
from collections.abc import Callable

import zmq

from agent.kvevents.backlog import Backlog, ShedChange
from agent.kvevents.merge import EventTimeMerger
from agent.kvevents.replay import ReplayState
from agent.kvevents.settings import KvEventsSettings
from agent.kvevents.signals import EngineId, KvSignals
from agent.kvevents.stream import Stream, StreamSockets
from agent.kvevents.wire import (
    END_SEQ_BYTES,
    FrameError,
    PayloadError,
    decode_payload,
    peek_ts,
    split_frames,
    split_replay,
)

_DRAIN = 256  # messages read from one socket before looking at the others
log = logging.getLogger("agent.kvevents.manager")  # the manager's: its log lines keep their name


class StreamSequencer:
    """Puts each stream's messages in sequence (one per manager; `lock` guards `signals`)."""

    def __init__(self, settings: KvEventsSettings, clock: Callable[[], float], signals: KvSignals,
                 lock: threading.RLock, merger: EventTimeMerger, backlog: Backlog, sockets: StreamSockets) -> None:
        self.settings = settings
        self.clock = clock
        self.signals = signals
        self._lock = lock
        self._merger = merger
        self._backlog = backlog
        self._sockets = sockets
        self.pending_cap = settings.replay_pending_bytes  # live bytes queued behind one replay

    # -- live messages ---------------------------------------------------------------------
    def drain_live(self, st: Stream) -> None:
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
                if not st.replay.queue((topic, seq, payload), self.pending_cap):
                    self.finish_replay(st, timed_out=True)
                continue
            self._sequence(st, topic, seq, payload)

    def _sequence(self, st: Stream, topic: bytes, seq: int, payload: bytes) -> None:
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

    def _broken_jump(self, st: Stream, topic: bytes, seq: int, payload: bytes, resync: bool) -> None:
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

    def _gap(self, st: Stream, start: int, topic: bytes, seq: int, payload: bytes) -> None:
        with self._lock:
            self.signals.gap(st.engine, seq - start)
        st.last = seq
        if st.replay_endpoint:
            self._start_replay(st, start, topic, seq, payload, count_lost=True)
        else:
            with self._lock:
                self.signals.replay_result(st.engine, 0, seq - start)
            self._decode_push(st, topic, seq, payload)

    # -- the queue to the index ------------------------------------------------------------
    def _decode_push(self, st: Stream, topic: bytes, seq: int, payload: bytes) -> None:
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
            self.done(st.engine, len(payload))
            with self._lock:
                self.signals.reject(st.engine, "malformed_payload")
            return
        self._merger.push(st.engine, ts, ("batch", (topic, seq, payload)))

    def done(self, engine: EngineId, nbytes: int) -> None:
        """A queued batch of `engine` left the queue (applied, or dropped unapplied)."""
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
    def _start_replay(self, st: Stream, start: int, topic: bytes, seq: int, payload: bytes,
                      count_lost: bool) -> None:
        dealer = st.dealer or self._sockets.open_dealer(st)
        st.replay = ReplayState(start, seq, self.clock() + self.settings.replay_timeout_s, count_lost,
                                [(topic, seq, payload)])
        dealer.send_multipart((b"", start.to_bytes(8, "big")))

    def drain_replay(self, st: Stream) -> None:
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
            if seq_raw == END_SEQ_BYTES and not payload:
                self.finish_replay(st, timed_out=False)
                return
            seq = int.from_bytes(seq_raw, "big")
            if rep.accept(seq):
                self._decode_push(st, topic, seq, payload)

    def finish_replay(self, st: Stream, timed_out: bool) -> None:
        rep, st.replay = st.replay, None
        if rep is None:
            return
        if timed_out:
            self._sockets.close_dealer(st)  # drop whatever answer is still in flight
        with self._lock:
            self.signals.replay_result(st.engine, *rep.outcome(timed_out))
        st.last = rep.stop - 1
        for topic, seq, payload in rep.pending:
            if st.replay is not None:  # a new gap inside the queued messages started a replay
                st.replay.pending.append((topic, seq, payload))
            else:
                self._sequence(st, topic, seq, payload)
