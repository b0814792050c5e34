"""The thin shell both real processes of the real-engine mode share (the vLLM engine, vllm-router):
launched through an injected launcher in a session of their own, logged to a file, probed over
HTTP on an injected clock, and stopped as a whole process group (SIGTERM, then SIGKILL)."""
from __future__ import annotations

import os
import signal
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import IO, Any, Self

Launcher = Callable[..., Any]  # subprocess.Popen's signature


class EngineError(RuntimeError):
    """An engine that could not be found, started, or made healthy (one-line message)."""


def http_status(url: str, timeout: float) -> int:
    """The HTTP status of a GET (0 when nothing answers)."""
    try:
        with urllib.request.urlopen(url, timeout=timeout) as resp:
            return resp.status
    except urllib.error.HTTPError as exc:
        return exc.code
    except OSError:
        return 0


class ChildProcess:
    """One child process group. Subclasses set `spec` (with a `port`), build the command (`start`)
    and say when the process answers (`_healthy`)."""

    spec: Any
    kind = "process"  # what the errors call it
    stop_timeout_s = 20.0  # SIGTERM, then this long, then SIGKILL
    healthy_timeout_s = 180.0  # how long a (re)start may take to answer
    poll_s = 0.5  # between health probes

    def __init__(self, scratch: Path, log_name: str, *, launcher: Launcher = subprocess.Popen,
                 clock: Callable[[], float] = time.monotonic, sleep: Callable[[float], None] = time.sleep,
                 probe: Callable[[str, float], int] = http_status, log: IO[bytes] | None = None) -> None:
        self.scratch = Path(scratch)
        self.launcher, self.clock, self.sleep, self.probe = launcher, clock, sleep, probe
        self.proc: Any = None
        self.log_path = self.scratch / log_name
        self._log = log
        self.starts = 0

    def _launch(self, argv: Sequence[str], env: Mapping[str, str] | None = None) -> None:
        log = self._log if self._log is not None else open(self.log_path, "ab")  # noqa: SIM115
        kw: dict[str, Any] = {"env": dict(env)} if env is not None else {}
        self.proc = self.launcher(list(argv), stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                  start_new_session=True, **kw)
        self.starts += 1

    def start(self) -> Self:
        raise NotImplementedError

    def _healthy(self) -> bool:
        raise NotImplementedError

    def wait_healthy(self, timeout: float | None = None) -> float:
        """Block until `_healthy()`; the seconds it took. EngineError if it dies or times out."""
        timeout = self.healthy_timeout_s if timeout is None else timeout
        t0 = self.clock()
        while True:
            if self.proc is None:
                raise EngineError(f"{self.kind} not started")
            code = self.proc.poll()
            if code is not None:
                raise EngineError(f"{self.kind} on port {self.spec.port} exited with {code} before it was healthy "
                                  f"(log: {self.log_path}: {self.log_tail()})")
            if self._healthy():
                return self.clock() - t0
            if self.clock() - t0 > timeout:
                raise EngineError(f"{self.kind} on port {self.spec.port} not healthy after {timeout:.0f} s "
                                  f"(log: {self.log_path})")
            self.sleep(self.poll_s)

    def log_tail(self, lines: int = 1) -> str:
        try:
            tail = self.log_path.read_text(errors="replace").strip().splitlines()[-lines:]
        except OSError:
            return ""
        return " | ".join(line.strip() for line in tail)

    def stop(self, timeout: float | None = None) -> None:
        """SIGTERM the process group, SIGKILL after `timeout`; safe to call twice."""
        timeout = self.stop_timeout_s if timeout is None else timeout
        proc, self.proc = self.proc, None
        if proc is None or proc.poll() is not None:
            return
        try:
            os.killpg(proc.pid, signal.SIGTERM)
        except ProcessLookupError:
            return
        try:
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            proc.wait(timeout=5)

    def restart(self, spec: Any = None, timeout: float | None = None) -> float:
        """Stop, optionally change the spec (e.g. an engine's KV cache size), start, wait; seconds to healthy."""
        self.stop()
        if spec is not None:
            self.spec = spec
        return self.start().wait_healthy(timeout)

    def __enter__(self) -> Self:
        return self if self.proc is not None else self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


__all__ = ["ChildProcess", "EngineError", "Launcher", "http_status"]
