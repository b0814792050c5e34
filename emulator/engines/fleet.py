"""Real engines behind the real router, started and stopped together (the real-engine demo's world).

`EngineFleet` starts N vLLM CPU engines (engine i pinned with VLLM_CPU_OMP_THREADS_BIND=i mod
cores, each with its own KV-event PUB and replay ports and topic), waits for all of them in
parallel, then starts vllm-router in front of them. `stop()` stops exactly what it started, router
first. Ports come from an injected `free_port`; the launcher, clock and sleep go to the processes.
"""
from __future__ import annotations

import os
import socket
import subprocess
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Self

from emulator.engines.engine import (
    DEFAULT_KV_TOKENS,
    EngineError,
    EngineProcess,
    EngineSpec,
    Launcher,
    tiny_model_dir,
)
from emulator.engines.router import RouterProcess, RouterSpec, router_policy


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def topic_of(name: str, model: str) -> str:
    return f"kv@{name}@{model}"


class EngineFleet:
    def __init__(self, scratch: Path, *, engines: int = 2, kv_cache_tokens: int = DEFAULT_KV_TOKENS, router: str = "roundrobin",
                 venv: Path | None = None, launcher: Launcher = subprocess.Popen,
                 clock: Callable[[], float] = time.monotonic, sleep: Callable[[float], None] = time.sleep,
                 port: Callable[[], int] = free_port, cores: int | None = None,
                 progress: Callable[[str], None] | None = None) -> None:
        self.scratch = Path(scratch)
        self.names = [f"engine-{i}" for i in range(engines)]
        cores = cores or os.cpu_count() or 1
        model = tiny_model_dir(venv)
        self.engines: list[EngineProcess] = []
        for i, name in enumerate(self.names):
            spec = EngineSpec(model=model, port=port(), kv_cache_tokens=kv_cache_tokens, kv_events_port=port(),
                              replay_port=port(), topic=topic_of(name, "tiny-llama"), cpu_bind=str(i % cores),
                              extra_args=("--enable-prompt-tokens-details",))
            self.engines.append(EngineProcess(spec, self.scratch / name, venv=venv, launcher=launcher, clock=clock,
                                              sleep=sleep))
        self.router = RouterProcess(RouterSpec(port=port(), metrics_port=port(),
                                               workers=tuple(e.base_url for e in self.engines),
                                               policy=router_policy(router)),
                                    self.scratch / "router", launcher=launcher, clock=clock, sleep=sleep)
        self.progress = progress or (lambda _msg: None)
        self.start_s: dict[str, float] = {}

    def start(self, timeout: float = 300.0) -> Self:
        try:
            for e in self.engines:
                e.start()
            with ThreadPoolExecutor(len(self.engines)) as pool:
                waits = {name: pool.submit(e.wait_healthy, timeout) for name, e in zip(self.names, self.engines,
                                                                                         strict=True)}
                for name, fut in waits.items():
                    self.start_s[name] = fut.result()
                    self.progress(f"{name} healthy after {self.start_s[name]:.0f} s")
            self.start_s["router"] = self.router.start().wait_healthy()
        except (EngineError, OSError):
            self.stop()
            raise
        return self

    def stop(self) -> None:
        for proc in [self.router, *self.engines]:
            try:
                proc.stop()
            except OSError:
                pass

    @property
    def url(self) -> str:
        return self.router.base_url

    def metrics_urls(self) -> Sequence[tuple[str, str]]:
        """(pod name, /metrics URL) of every engine."""
        return [(n, e.metrics_url) for n, e in zip(self.names, self.engines, strict=True)]

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


__all__ = ["EngineFleet", "free_port", "topic_of"]
