"""The real vllm-project/router (the Rust `vllm-router` binary of PyPI `vllm-router`) as a child
process on 127.0.0.1, in front of real engines.

Like `engine.py`: the pure part builds the argv from a `RouterSpec`; `RouterProcess` starts it
through an injected launcher, waits for its `/health` and its Prometheus `/metrics` on an
injected clock, and stops exactly the process group it started. Its policy is read at start only,
so a policy change is a restart (about a second). `replace(spec)` does it the way a Deployment
rollout with surge does: the new router starts on new ports and becomes healthy while the old one
still serves, clients move to the new address (`base_url` changes), and the old one is stopped
after a grace period for the requests it still holds.

The tuner speaks the twin's router names (`contracts.knobs`); `POLICY` maps them to the router's
`--policy` values. The twin's `prefixaware` (the worker holding the longest cached prefix, under a
load cap) stands for the router's `cache_aware` (approximate radix tree of what it sent where,
with a load-balance override).
"""
from __future__ import annotations

import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Self

from emulator.engines.child import ChildProcess, EngineError, Launcher, http_status

POLICY = {"roundrobin": "round_robin", "prefixaware": "cache_aware", "cache_aware": "cache_aware",
          "kvaware": "kv_aware", "random": "random", "power_of_two": "power_of_two",
          "consistent_hash": "consistent_hash"}


def router_binary() -> str | None:
    """`vllm-router` next to this interpreter (the project venv), else on PATH."""
    return shutil.which("vllm-router", path=str(Path(sys.executable).parent)) or shutil.which("vllm-router")


@dataclass(frozen=True)
class RouterSpec:
    port: int
    metrics_port: int
    workers: tuple[str, ...]
    policy: str = "round_robin"  # the router's own spelling
    extra_args: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if self.policy not in set(POLICY.values()):
            raise EngineError(f"router policy {self.policy!r}: valid choices: {', '.join(sorted(set(POLICY.values())))}")
        if not self.workers:
            raise EngineError("router: needs at least one worker URL")


def router_policy(knob: str) -> str:
    """The router's `--policy` for a `Knobs.router` value (EngineError when it has none)."""
    try:
        return POLICY[knob]
    except KeyError:
        raise EngineError(f"router {knob!r}: vllm-router has no such policy; valid: {', '.join(POLICY)}") from None


def router_command(spec: RouterSpec, binary: str) -> list[str]:
    return [binary, "--host", "127.0.0.1", "--port", str(spec.port), "--worker-urls", *spec.workers,
            "--policy", spec.policy, "--prometheus-host", "127.0.0.1", "--prometheus-port", str(spec.metrics_port),
            "--worker-startup-check-interval", "1", "--log-level", "warning", *spec.extra_args]


def _url(spec: RouterSpec) -> str:
    return f"http://127.0.0.1:{spec.port}"


def _metrics_url(spec: RouterSpec) -> str:
    return f"http://127.0.0.1:{spec.metrics_port}/metrics"


class RouterProcess(ChildProcess):
    """One router process: start, wait for `/health` and `/metrics`, stop (its process group)."""

    kind = "router"
    stop_timeout_s = 10.0
    healthy_timeout_s = 60.0
    poll_s = 0.2

    def __init__(self, spec: RouterSpec, scratch: Path, *, binary: str | None = None,
                 launcher: Launcher = subprocess.Popen, clock: Callable[[], float] = time.monotonic,
                 sleep: Callable[[float], None] = time.sleep, probe: Callable[[str, float], int] = http_status,
                 log: IO[bytes] | None = None) -> None:
        super().__init__(scratch, f"router-{spec.port}.log", launcher=launcher, clock=clock, sleep=sleep,
                         probe=probe, log=log)
        self.spec = spec
        self.binary = binary or router_binary()
        self._serving: RouterSpec | None = None  # during a surge rollout: the old router, which still serves

    @property
    def base_url(self) -> str:
        """Where clients send: the router that serves (during a surge rollout, the old one until the new one is healthy)."""
        return _url(self._serving or self.spec)

    @property
    def metrics_url(self) -> str:
        return _metrics_url(self._serving or self.spec)

    def start(self) -> Self:
        if self.binary is None:
            raise EngineError("vllm-router is not installed (pip install vllm-router==0.1.17; `make setup` does)")
        if self.proc is not None and self.proc.poll() is None:
            raise EngineError(f"router on port {self.spec.port} is already running (pid {self.proc.pid})")
        self.scratch.mkdir(parents=True, exist_ok=True)
        self._launch(router_command(self.spec, self.binary))
        return self

    def _healthy(self) -> bool:  # the new process itself, not the one clients are sent to
        return (self.probe(f"{_url(self.spec)}/health", 2.0) == 200
                and self.probe(_metrics_url(self.spec), 2.0) == 200)

    def replace(self, spec: RouterSpec, *, grace_s: float = 3.0, timeout: float = 60.0) -> float:
        """Surge rollout: start `spec` (new ports) beside the running router, wait until it is
        healthy, switch `base_url` to it, stop the old one after `grace_s`. Seconds to healthy.
        If the new one fails, the old one keeps serving and EngineError is raised."""
        old = RouterProcess(self.spec, self.scratch, binary=self.binary, launcher=self.launcher, clock=self.clock,
                            sleep=self.sleep, probe=self.probe, log=self._log)
        old.proc, old.log_path = self.proc, self.log_path
        self._serving = old.spec  # clients stay on the old router until the new one answers
        self.proc, self.spec = None, spec
        self.log_path = self.scratch / f"router-{spec.port}.log"
        try:
            seconds = self.start().wait_healthy(timeout)
        except EngineError:
            self.stop()
            self.proc, self.spec, self.log_path = old.proc, old.spec, old.log_path
            raise
        finally:
            self._serving = None
        self.sleep(grace_s)
        old.stop()
        return seconds


def workers_of(urls: Sequence[str]) -> tuple[str, ...]:
    return tuple(u.rstrip("/") for u in urls)


__all__ = ["POLICY", "RouterProcess", "RouterSpec", "router_binary", "router_command", "router_policy", "workers_of"]
