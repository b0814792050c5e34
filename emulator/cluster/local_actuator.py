"""The demo's actuator: applies `Knobs` to the emulated cluster the way a rollout would.

Which change restarts what follows the real deployment (see docs/demo.md):

* LMCache settings (`chunk_tokens`, `cpu_gib`, `cpu_eviction`, `l2_min_prompt_tokens`) are read
  when the engine starts, so every vLLM pod restarts, one at a time when `rolling` (counters
  reset, private caches cold);
* Curvine eviction settings (`l2_eviction`, watermarks) are master config: the master restarts,
  the data on the pool stays;
* `router` is hot-reloaded from the router's dynamic config: nothing restarts;
* vllm-project/router's `kv_aware` flags (`router_temperature`, `kv_penalty_host`,
  `kv_penalty_external`) restart the router process only; the emulated router keeps no cache
  state, so no engine pod and no master restarts.

`apply` returns once the rollout has completed. The last good configuration is kept like the
Kubernetes actuator's annotation: in memory and, when `state_file` is given, in a YAML file.
"""
from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from pathlib import Path

import yaml

from contracts.actuator import ApplyResult, PermanentActuationError
from contracts.knobs import DEFAULT_KNOBS, ROUTER_KNOBS, KnobError, Knobs
from emulator.cluster.fleet import EmulatedCluster

log = logging.getLogger("tierpilot.local_actuator")

POD_RESTART_KNOBS = frozenset({"chunk_tokens", "cpu_gib", "cpu_eviction", "l2_min_prompt_tokens"})
MASTER_RESTART_KNOBS = frozenset({"l2_eviction", "l2_high_watermark", "l2_low_watermark"})
HOT_KNOBS = frozenset({"router"})
ROUTER_RESTART_KNOBS = ROUTER_KNOBS - HOT_KNOBS  # the router's knobs (contracts.knobs) restart no cache

ReconfigureHook = Callable[[Knobs], None]


def restart_plan(changed: set[str]) -> tuple[bool, bool]:
    """(pods restart, master restarts) for a set of changed knob names."""
    unknown = changed - POD_RESTART_KNOBS - MASTER_RESTART_KNOBS - HOT_KNOBS - ROUTER_RESTART_KNOBS
    if unknown:
        raise KnobError(f"no rollout rule for knob(s) {', '.join(sorted(unknown))}")
    return bool(changed & POD_RESTART_KNOBS), bool(changed & MASTER_RESTART_KNOBS)


class LocalActuator:
    """Implements `contracts.actuator.Actuator` against an `EmulatedCluster`."""

    def __init__(self, cluster: EmulatedCluster, *, initial: Knobs = DEFAULT_KNOBS,
                 reconfigure: ReconfigureHook | None = None, rolling: bool = True,
                 state_file: str | Path | None = None, dry_run: bool = False) -> None:
        self._cluster = cluster
        self._current = initial
        self._reconfigure = reconfigure
        self._rolling = rolling
        self._state_file = Path(state_file) if state_file else None
        self._dry_run = dry_run
        self._lock = threading.Lock()
        self._last_good: Knobs | None = self._load_last_good()
        self.history: list[ApplyResult] = []

    # -- Actuator protocol ---------------------------------------------------------------------------
    def current(self) -> Knobs:
        return self._current

    def apply(self, knobs: Knobs, *, dry_run: bool = False) -> ApplyResult:
        if not isinstance(knobs, Knobs):
            raise PermanentActuationError(f"apply expects a Knobs record, got {type(knobs).__name__}")
        with self._lock:
            return self._apply(knobs, dry_run=dry_run or self._dry_run, message="apply")

    def last_good(self) -> Knobs | None:
        return self._last_good

    def mark_good(self, knobs: Knobs) -> None:
        self._last_good = knobs
        if self._state_file is not None:
            self._state_file.parent.mkdir(parents=True, exist_ok=True)
            tmp = self._state_file.with_suffix(".tmp")
            tmp.write_text(yaml.safe_dump({"last_good": knobs.to_dict()}, sort_keys=False))
            tmp.replace(self._state_file)

    def rollback(self) -> ApplyResult:
        with self._lock:
            target = self._last_good
            if target is None:
                raise PermanentActuationError("rollback: no last good configuration has been marked")
            return self._apply(target, dry_run=self._dry_run, message="rollback")

    # -- internals -----------------------------------------------------------------------------------
    def _apply(self, knobs: Knobs, *, dry_run: bool, message: str) -> ApplyResult:
        changed = self._current.diff(knobs)
        pods_restart, master_restart = restart_plan(set(changed))
        restarted = (tuple(self._cluster.pods) if pods_restart else ()) + (
            ("curvine-master",) if master_restart else ())
        if not changed or dry_run:
            result = ApplyResult(knobs=knobs, applied=False, dry_run=dry_run, changed=changed,
                                 restarted=restarted if dry_run else (),
                                 message=f"{message}: " + ("dry run, nothing applied" if dry_run else "no change"))
            self.history.append(result)
            return result
        log.info("%s: %s; restarting %s", message, _fmt(changed), ", ".join(restarted) or "nothing")
        self._current = knobs
        if self._reconfigure is not None:
            self._reconfigure(knobs)
        if master_restart:
            self._cluster.restart_master()
        if pods_restart:
            if self._rolling:
                for name in self._cluster.pods:
                    self._cluster.restart_pod(name)
            else:
                self._cluster.restart_pods(tuple(self._cluster.pods))
        result = ApplyResult(knobs=knobs, applied=True, changed=changed, restarted=restarted,
                             message=f"{message}: {_fmt(changed)}")
        self.history.append(result)
        return result

    def _load_last_good(self) -> Knobs | None:
        if self._state_file is None or not self._state_file.exists():
            return None
        data = yaml.safe_load(self._state_file.read_text()) or {}
        if "last_good" not in data:
            return None
        return Knobs.from_mapping(data["last_good"], source=str(self._state_file))


def _fmt(changed: dict[str, tuple[object, object]]) -> str:
    return ", ".join(f"{k} {a}->{b}" for k, (a, b) in changed.items()) or "no change"
