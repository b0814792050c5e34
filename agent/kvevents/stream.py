"""One engine's stream as the subscriber manager (manager.py) follows it: its endpoints, its
sockets, the last sequence number seen and the replay in flight; and the opening and closing of
those sockets on the I/O loop's poller (the options every socket needs are in sockets.py)."""
from __future__ import annotations

import dataclasses

import zmq

from agent.kvevents.replay import ReplayState
from agent.kvevents.signals import EngineId
from agent.kvevents.sockets import open_dealer, open_sub


@dataclasses.dataclass
class Stream:
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


class StreamSockets:
    """The streams' SUB, monitor and DEALER sockets, registered on one poller (the I/O thread's)."""

    def __init__(self, ctx: zmq.Context, max_message_bytes: int) -> None:
        self._ctx = ctx
        self._max_message_bytes = max_message_bytes
        self._poller = zmq.Poller()

    def poll(self, timeout_ms: int) -> dict[zmq.Socket, int]:
        return dict(self._poller.poll(timeout_ms))

    def open_sub(self, st: Stream) -> None:
        st.sub, st.monitor = open_sub(self._ctx, st.endpoint, st.rcvhwm, self._max_message_bytes)
        self._poller.register(st.monitor, zmq.POLLIN)
        self._poller.register(st.sub, zmq.POLLIN)

    def open_dealer(self, st: Stream) -> zmq.Socket:
        assert st.replay_endpoint is not None
        dealer = st.dealer = open_dealer(self._ctx, st.replay_endpoint, self._max_message_bytes)
        self._poller.register(dealer, zmq.POLLIN)
        return dealer

    def close_dealer(self, st: Stream) -> None:
        if st.dealer is not None:
            self._poller.unregister(st.dealer)
            st.dealer.close(linger=0)
            st.dealer = None

    def close_sub(self, st: Stream) -> None:
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
