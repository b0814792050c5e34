"""The actuator of real processes: applies `Knobs` to real vLLM CPU engines behind the real
vllm-router by restarting them (`contracts.actuator.Actuator`).

What each change restarts, on this deployment:

* `router` (the tuner speaks the twin's names; `emulator.engines.router.POLICY` maps them to
  vllm-router's `--policy`): the router reads its policy at start only, so a new router process
  starts on new ports beside the old one (`RouterProcess.replace`, a surge rollout: clients move
  to the new address once it is healthy, the old one stops after a grace period);
* the engines' KV cache size (`--kv-cache-memory-bytes`, the one cache knob the CPU backend
  has): a rolling restart, one engine at a time, each until `/health` answers again (25-30 s
  each on an idle machine), with a cold prefix cache. `Knobs` carries no field for it, so it is
  reached through `resize_engines(tokens)`, not through `apply`;
* everything else in `Knobs` (LMCache chunk size, CPU buffer and eviction, the L2 settings, the
  kv_aware credits) has no counterpart on the CPU engine (no LMCache, no offload, no L2 on this
  backend): `RefusedConfigError` before anything is touched, so the guardrails reject the
  candidate and tuning goes on.

The processes come in as objects with `restart(spec) -> seconds` and a `spec` (`RouterProcess`,
`EngineProcess`, or fakes in tests); the clock is injected. The last good configuration is kept
in memory.
"""
from __future__ import annotations

import dataclasses
import logging
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any, Protocol

from contracts.actuator import ApplyResult, PermanentActuationError, RefusedConfigError
from contracts.knobs import DEFAULT_KNOBS, Knobs
from emulator.engines.engine import EngineError
from emulator.engines.router import router_policy

log = logging.getLogger("tierpilot.process_actuator")

HOT_ROUTER_KNOBS = frozenset({"router"})
MIN_KV_TOKENS = 2048  # the cache must hold one max_model_len sequence


class Restartable(Protocol):
    spec: Any

    def restart(self, spec: Any = None, timeout: float = ...) -> float: ...


class Replaceable(Restartable, Protocol):
    def replace(self, spec: Any) -> float: ...


@dataclasses.dataclass(frozen=True)
class Restart:
    """One process restart the actuator did: what, when (clock), how long until healthy."""

    target: str
    at: float
    seconds: float
    reason: str


class ProcessActuator:
    """Implements `contracts.actuator.Actuator` over a router process and engine processes."""

    def __init__(self, router: Replaceable, engines: Sequence[Restartable], *, initial: Knobs = DEFAULT_KNOBS,
                 clock: Callable[[], float] = time.monotonic, dry_run: bool = False,
                 on_restart: Callable[[Restart], None] | None = None,
                 engine_names: Sequence[str] | None = None, router_port: Callable[[], int] | None = None) -> None:
        self.router, self.engines = router, list(engines)
        self.names = list(engine_names or [f"engine-{i}" for i in range(len(self.engines))])
        self._current = initial
        self._last_good: Knobs | None = None
        self.clock, self._dry_run, self._on_restart = clock, dry_run, on_restart
        self._router_port = router_port  # new ports for a surge rollout of the router (None: restart in place)
        self._lock = threading.Lock()
        self.history: list[ApplyResult] = []
        self.restarts: list[Restart] = []
        router_policy(initial.router)  # refuse an initial router the binary does not have

    # -- Actuator protocol ---------------------------------------------------------------------
    def current(self) -> Knobs:
        return self._current

    def last_good(self) -> Knobs | None:
        return self._last_good

    def mark_good(self, knobs: Knobs) -> None:
        self._last_good = knobs

    def apply(self, knobs: Knobs, *, dry_run: bool = False) -> ApplyResult:
        if not isinstance(knobs, Knobs):
            raise PermanentActuationError(f"apply expects a Knobs record, got {type(knobs).__name__}")
        with self._lock:
            return self._apply(knobs, dry_run=dry_run or self._dry_run, message="apply")

    def rollback(self) -> ApplyResult:
        with self._lock:
            if self._last_good is None:
                raise PermanentActuationError("rollback: no last good configuration has been marked")
            return self._apply(self._last_good, dry_run=self._dry_run, message="rollback")

    # -- the engines' KV cache -----------------------------------------------------------------
    def kv_cache_tokens(self) -> list[int]:
        return [int(e.spec.kv_cache_tokens) for e in self.engines]

    def resize_engines(self, kv_cache_tokens: int, *, dry_run: bool = False) -> ApplyResult:
        """Rolling restart of every engine whose KV cache does not hold `kv_cache_tokens` yet (the
        engine turns tokens into `--kv-cache-memory-bytes` at its dtype)."""
        if not isinstance(kv_cache_tokens, int) or kv_cache_tokens < MIN_KV_TOKENS:
            raise RefusedConfigError(f"kv_cache_tokens: must be an integer >= {MIN_KV_TOKENS} (one 2,048-token "
                                     f"sequence), got {kv_cache_tokens!r}")
        with self._lock:
            todo = [i for i, e in enumerate(self.engines) if e.spec.kv_cache_tokens != kv_cache_tokens]
            names = tuple(self.names[i] for i in todo)
            changed = {f"{self.names[i]}.kv_cache_tokens": (self.engines[i].spec.kv_cache_tokens, kv_cache_tokens)
                       for i in todo}
            if not todo or dry_run or self._dry_run:
                result = ApplyResult(self._current, applied=False, dry_run=dry_run or self._dry_run, changed=changed,
                                     restarted=names if (dry_run or self._dry_run) else (),
                                     message="resize: " + ("dry run, nothing applied" if todo else "no change"))
            else:
                for i in todo:
                    spec = dataclasses.replace(self.engines[i].spec, kv_cache_tokens=kv_cache_tokens)
                    self._restart(self.names[i], self.engines[i], spec, f"kv_cache_tokens -> {kv_cache_tokens}")
                result = ApplyResult(self._current, applied=True, changed=changed, restarted=names,
                                     message=f"resize: KV cache {kv_cache_tokens:,} tokens on {', '.join(names)}")
            self.history.append(result)
            return result

    # -- internals -----------------------------------------------------------------------------
    def plan(self, knobs: Knobs) -> tuple[str, ...]:
        """What applying `knobs` restarts; RefusedConfigError when the processes cannot express it."""
        changed = self._current.diff(knobs)
        refused = sorted(set(changed) - HOT_ROUTER_KNOBS)
        if refused:
            raise RefusedConfigError(
                f"the real CPU engines cannot express {', '.join(refused)} (no LMCache, no offload and no L2 "
                "on vLLM's CPU backend); only the router policy and the engines' KV cache size can change")
        if "router" in changed:
            try:
                router_policy(knobs.router)
            except EngineError as exc:
                raise RefusedConfigError(str(exc)) from None
            return ("router",)
        return ()

    def _apply(self, knobs: Knobs, *, dry_run: bool, message: str) -> ApplyResult:
        restarted = self.plan(knobs)
        changed = self._current.diff(knobs)
        if not changed or dry_run:
            result = ApplyResult(knobs, applied=False, dry_run=dry_run, changed=changed,
                                 restarted=restarted if dry_run else (),
                                 message=f"{message}: " + ("dry run, nothing applied" if dry_run else "no change"))
            self.history.append(result)
            return result
        if restarted:
            spec = dataclasses.replace(self.router.spec, policy=router_policy(knobs.router))
            if self._router_port is not None:
                spec = dataclasses.replace(spec, port=self._router_port(), metrics_port=self._router_port())
            self._restart("router", self.router, spec, f"policy -> {spec.policy}",
                          surge=self._router_port is not None)
        self._current = knobs
        text = ", ".join(f"{k} {a}->{b}" for k, (a, b) in changed.items())
        result = ApplyResult(knobs, applied=True, changed=changed, restarted=restarted, message=f"{message}: {text}")
        self.history.append(result)
        return result

    def _restart(self, name: str, proc: Any, spec: Any, reason: str, *, surge: bool = False) -> None:
        at = self.clock()
        log.info("restarting %s: %s", name, reason)
        try:
            seconds = proc.replace(spec) if surge else proc.restart(spec)
        except EngineError as exc:
            raise PermanentActuationError(f"{name}: {exc}") from None
        rec = Restart(name, at, seconds, reason)
        self.restarts.append(rec)
        if self._on_restart is not None:
            self._on_restart(rec)


__all__ = ["MIN_KV_TOKENS", "ProcessActuator", "Restart"]
