"""Reconcile-proof patches: watch the objects we changed and re-apply reverted settings, bounded.

Operators (the HyperPod one, Helm upgrades, GitOps controllers) re-render their children and drop
manual patches. The guard watches every object the actuator changed; when an event shows an owned
setting back at another value, it asks the actuator to re-apply, at most `limit` times per
`window_s` per target. Past that it gives up on the target (an Event and a metric say so) rather
than fight the operator forever. Watch errors and disconnects back off; nothing escapes a thread.
"""
from __future__ import annotations

import collections
import logging
import threading
from collections.abc import Callable, Iterator
from typing import Any

from agent.k8s.api import ObjectRef
from agent.k8s.backoff import Backoff
from contracts.actuator import ActuationError, RetriableActuationError

log = logging.getLogger("tierpilot.k8s")

Watch = Callable[[ObjectRef, int], Iterator[tuple[str, dict[str, Any]]]]


class Budget:
    """At most `limit` events per sliding `window_s` (injected clock)."""

    def __init__(self, limit: int, window_s: float, clock: Callable[[], float]) -> None:
        self.limit, self.window_s, self._clock = limit, window_s, clock
        self._times: collections.deque[float] = collections.deque()

    def allow(self) -> bool:
        now = self._clock()
        while self._times and now - self._times[0] >= self.window_s:
            self._times.popleft()
        if len(self._times) >= self.limit:
            return False
        self._times.append(now)
        return True


class ReapplyGuard:
    def __init__(self, *, watch: Watch, check: Callable[[str, dict[str, Any]], list[str]],
                 reapply: Callable[[str, list[str]], None], give_up: Callable[[str, list[str]], None],
                 limit: int, window_s: float, watch_timeout_s: int, clock: Callable[[], float],
                 sleep: Callable[[float], None], backoff: Backoff | None = None) -> None:
        self._watch, self._check, self._reapply, self._give_up = watch, check, reapply, give_up
        self.limit, self.window_s, self.watch_timeout_s = limit, window_s, watch_timeout_s
        self._clock, self._sleep = clock, sleep
        self._backoff_proto = backoff or Backoff()
        self._lock = threading.Lock()
        self._tracked: dict[str, ObjectRef] = {}
        self._budgets: dict[str, Budget] = {}
        self._backoffs: dict[str, Backoff] = {}
        self._threads: dict[str, threading.Thread] = {}
        self._stop = threading.Event()
        self._started = False
        self.delays: list[float] = []  # back-off delays taken (for tests and logs)

    # -- what is guarded --
    def track(self, label: str, ref: ObjectRef) -> None:
        with self._lock:
            self._tracked[label] = ref
            self._budgets.setdefault(label, Budget(self.limit, self.window_s, self._clock))
            self._backoffs.setdefault(label, Backoff(self._backoff_proto.base_s, self._backoff_proto.max_s))
        if self._started and label not in self._threads:
            self._spawn(label)

    def untrack(self, label: str) -> None:
        with self._lock:
            self._tracked.pop(label, None)

    @property
    def tracked(self) -> dict[str, ObjectRef]:
        with self._lock:
            return dict(self._tracked)

    # -- one event --
    def handle(self, label: str, obj: dict[str, Any]) -> str:
        """React to one observed state of a guarded object: "ok", "reapplied", "gave_up", "failed"."""
        if label not in self.tracked:
            return "ok"
        try:
            drifted = self._check(label, obj)
        except ActuationError as exc:
            log.warning("guard %s: cannot read the watched object: %s", label, exc)
            return "failed"
        if not drifted:
            return "ok"
        if not self._budgets[label].allow():
            self.untrack(label)
            self._give_up(label, drifted)
            return "gave_up"
        try:
            self._reapply(label, drifted)
        except ActuationError as exc:
            log.warning("guard %s: re-apply of %s failed: %s", label, ", ".join(drifted), exc)
            return "failed"
        return "reapplied"

    # -- one watch stream --
    def watch_once(self, label: str) -> None:
        ref = self.tracked.get(label)
        if ref is None:
            return
        try:
            for _type, obj in self._watch(ref, self.watch_timeout_s):
                if _type in ("ADDED", "MODIFIED"):
                    self.handle(label, obj)
                if self._stop.is_set() or label not in self.tracked:
                    return
            self._backoffs[label].reset()
        except RetriableActuationError as exc:  # 5xx, or the watch disconnected
            delay = self._backoffs[label].next_delay()
            self.delays.append(delay)
            log.warning("guard %s: watch failed (%s); retrying in %.1fs", label, exc, delay)
            self._sleep(delay)
        except ActuationError as exc:  # 403/404: nothing to watch any more
            log.warning("guard %s: stop watching: %s", label, exc)
            self.untrack(label)

    # -- threads --
    def start(self) -> None:
        self._stop.clear()
        self._started = True
        for label in self.tracked:
            if label not in self._threads:
                self._spawn(label)

    def _spawn(self, label: str) -> None:
        def loop() -> None:
            while not self._stop.is_set() and label in self.tracked:
                try:
                    self.watch_once(label)
                except Exception:  # never let a watcher thread die silently
                    log.exception("guard %s: unexpected error", label)
                    self._sleep(self._backoffs[label].next_delay())
            self._threads.pop(label, None)

        t = threading.Thread(target=loop, name=f"tierpilot-guard-{label}", daemon=True)
        self._threads[label] = t
        t.start()

    def stop(self, timeout_s: float = 5.0) -> None:
        self._stop.set()
        self._started = False
        for t in list(self._threads.values()):
            if t is not threading.current_thread():
                t.join(timeout_s)
        self._threads.clear()
