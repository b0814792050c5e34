"""Starting and stopping a process's agent: one-line start-up errors, and running until SIGTERM
or SIGINT with the previous signal handlers restored."""
from __future__ import annotations

import signal
import threading
from collections.abc import Callable


class AgentStartError(RuntimeError):
    """The agent could not start serving (its address is taken, or not allowed); one line."""


def start_error(exc: BaseException | None, host: str, port: int) -> AgentStartError:
    """What went wrong at start-up, as one line that says what to change."""
    import errno

    where = f"{host or '0.0.0.0'}:{port}"
    if isinstance(exc, OSError) and exc.errno == errno.EADDRINUSE:
        return AgentStartError(f"cannot listen on {where}: the address is already in use (another agent or "
                               f"program holds it); choose another with server.port or --port")
    if isinstance(exc, OSError) and exc.errno in (errno.EACCES, errno.EADDRNOTAVAIL):
        return AgentStartError(f"cannot listen on {where}: {exc.strerror}; check server.host and server.port")
    return AgentStartError(f"agent failed to start: {exc if exc is not None else 'timeout'}")


def run_until_signalled(start: Callable[[], None], stop: Callable[[], None],
                        alive: Callable[[], bool], poll_s: float = 0.5,
                        on_started: Callable[[], None] | None = None) -> None:
    """Run `start` (then `on_started`, once it serves), block until SIGTERM or SIGINT (or until
    `alive()` turns false, which is an error), then `stop` and restore the previous signal handlers."""
    done = threading.Event()
    previous = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT)}
    for s in previous:
        signal.signal(s, lambda *_: done.set())
    try:
        start()
        if on_started is not None:
            on_started()
        while not done.wait(poll_s):
            if not alive():
                raise RuntimeError("the agent event loop died")
    finally:
        stop()
        for s, h in previous.items():
            signal.signal(s, h)


__all__ = ["AgentStartError", "run_until_signalled", "start_error"]
