"""The kubelet's container runtime: containers as real process groups (`ProcessRuntime`), behind
the `Runtime` protocol the kubelet drives (tests inject fakes)."""
from __future__ import annotations

import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol

from emulator.engines.child import ChildProcess, Launcher, http_status
from emulator.engines.podspec import PodCommand


class Runtime(Protocol):
    """Starts and stops containers (`ProcessRuntime`, or a fake in tests)."""

    def start(self, pod: str, cmd: PodCommand) -> Any: ...

    def wait_ready(self, handle: Any) -> float: ...

    def probe(self, handle: Any) -> bool: ...

    def running(self, handle: Any) -> bool: ...

    def stop(self, handle: Any) -> None: ...


class PodProcess(ChildProcess):
    kind = "pod"

    def __init__(self, name: str, cmd: PodCommand, scratch: Path, **kw: Any) -> None:
        super().__init__(scratch, f"{name}.log", **kw)
        self.name, self.spec = name, cmd

    def start(self) -> PodProcess:
        self._launch(self.spec.argv, self.spec.env)
        return self

    def _healthy(self) -> bool:
        return self.spec.ready_url is None or self.probe(self.spec.ready_url, 2.0) == 200


class ProcessRuntime:
    """Containers as real process groups (logs in `scratch/<pod>.log`)."""

    def __init__(self, scratch: Path, *, launcher: Launcher = subprocess.Popen,
                 probe: Callable[[str, float], int] = http_status, ready_timeout_s: float = 240.0) -> None:
        self.scratch, self.launcher, self.probe, self.ready_timeout_s = Path(scratch), launcher, probe, ready_timeout_s
        self.scratch.mkdir(parents=True, exist_ok=True)

    def start(self, pod: str, cmd: PodCommand) -> PodProcess:
        return PodProcess(pod, cmd, self.scratch, launcher=self.launcher, probe=self.probe).start()

    def wait_ready(self, handle: PodProcess) -> float:
        return handle.wait_healthy(self.ready_timeout_s)

    def probe(self, handle: PodProcess) -> bool:
        """One readiness probe: running, and its ready URL (if any) answers 200."""
        return self.running(handle) and handle._healthy()

    def running(self, handle: PodProcess) -> bool:
        return handle.proc is not None and handle.proc.poll() is None

    def stop(self, handle: PodProcess) -> None:
        handle.stop()
