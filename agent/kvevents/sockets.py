"""The subscriber's ZMQ sockets, with the options every one needs: IPv6 on (an IPv6 pod address
connects to nothing without it, silently), a maximum message size (libzmq refuses a larger frame
before allocating it, and drops the connection), and no linger."""
from __future__ import annotations

import zmq


def open_sub(ctx: zmq.Context, endpoint: str, rcvhwm: int, max_bytes: int) -> tuple[zmq.Socket, zmq.Socket]:
    """A SUB connected to `endpoint`, subscribed to every topic (the manager checks the topic
    itself, so a wrong one is counted rather than filtered unseen), and a monitor socket that
    reports its DISCONNECTED events."""
    sub = ctx.socket(zmq.SUB)
    sub.setsockopt(zmq.RCVHWM, rcvhwm)
    sub.setsockopt(zmq.MAXMSGSIZE, max_bytes)
    sub.setsockopt(zmq.LINGER, 0)
    sub.setsockopt(zmq.IPV6, 1)
    sub.setsockopt(zmq.SUBSCRIBE, b"")
    sub.connect(endpoint)
    return sub, sub.get_monitor_socket(zmq.EVENT_DISCONNECTED)


def open_dealer(ctx: zmq.Context, endpoint: str, max_bytes: int) -> zmq.Socket:
    """A DEALER to a replay ROUTER (a REQ socket would only receive the first reply)."""
    dealer = ctx.socket(zmq.DEALER)
    dealer.setsockopt(zmq.LINGER, 0)
    dealer.setsockopt(zmq.IPV6, 1)
    dealer.setsockopt(zmq.MAXMSGSIZE, max_bytes)
    dealer.connect(endpoint)
    return dealer


def disconnected(monitor: zmq.Socket) -> bool:
    """Drain a monitor socket; True when it reported anything (it only reports disconnects)."""
    seen = False
    while True:
        try:
            monitor.recv_multipart(zmq.NOBLOCK)
            seen = True
        except zmq.Again:
            return seen
