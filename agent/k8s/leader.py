"""Leader election over a coordination.k8s.io/v1 Lease (the client-go algorithm, injectable clock).

- A candidate reads the Lease. If another identity holds it and the record has changed within the
  last `duration_s` (measured on *our* clock from when we observed it, so clock skew between
  nodes does not matter), it stays a standby.
- Otherwise it writes itself as holder with a PUT carrying the resourceVersion it read: if another
  candidate wrote first the server answers 409 and this one stays a standby.
- The leader renews every `retry_period_s`. If it has not renewed for `renew_deadline_s` (shorter
  than `duration_s`) it stops acting at once, before any standby can take the Lease over.
"""
from __future__ import annotations

import datetime
import logging
import threading
import time
from collections.abc import Callable
from typing import Any

from agent.k8s.api import KubeApi
from agent.k8s.metrics import ActuationMetrics
from agent.k8s.settings import LeaseSettings
from contracts.actuator import ActuationError, TargetGoneError

log = logging.getLogger("tierpilot.k8s")


def micro_time(t: datetime.datetime) -> str:
    return t.astimezone(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


class LeaseElector:
    def __init__(self, api: KubeApi, namespace: str, settings: LeaseSettings, identity: str, *,
                 clock: Callable[[], float] = time.monotonic,
                 now: Callable[[], datetime.datetime] = lambda: datetime.datetime.now(datetime.UTC),
                 metrics: ActuationMetrics | None = None) -> None:
        self.api, self.namespace, self.settings, self.identity = api, namespace, settings, identity
        self._clock, self._now, self._metrics = clock, now, metrics
        self._observed: dict[str, Any] | None = None
        self._observed_at = 0.0
        self._renewed_at: float | None = None
        self.last_error: str = ""
        self._publish()

    # -- state --
    def is_leader(self) -> bool:
        return self._renewed_at is not None and self._clock() - self._renewed_at < self.settings.renew_deadline_s

    @property
    def holder(self) -> str:
        return (self._observed or {}).get("holderIdentity") or ""

    def _publish(self) -> None:
        if self._metrics is not None:
            self._metrics.leader(self.identity, self.is_leader())

    # -- one round --
    def try_acquire_or_renew(self) -> bool:
        try:
            return self._round()
        except ActuationError as exc:
            self.last_error = str(exc)
            log.warning("lease %s/%s: %s", self.namespace, self.settings.name, exc)
            return self.is_leader()
        finally:
            self._publish()

    def _round(self) -> bool:
        now_t, now_c = self._now(), self._clock()
        try:
            lease = self.api.read_lease(self.namespace, self.settings.name)
        except TargetGoneError:
            body = {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
                    "metadata": {"name": self.settings.name, "namespace": self.namespace},
                    "spec": self._spec(now_t, acquire=True, transitions=0)}
            try:
                created = self.api.create_lease(self.namespace, body)
            except ActuationError as exc:  # another candidate created it first (409)
                self.last_error = str(exc)
                return False
            return self._won(created, now_c)
        spec = lease.get("spec") or {}
        if spec != self._observed:
            self._observed, self._observed_at = spec, now_c
        holder = spec.get("holderIdentity") or ""
        duration = float(spec.get("leaseDurationSeconds") or self.settings.duration_s)
        if holder and holder != self.identity and now_c - self._observed_at < duration:
            self._renewed_at = None  # someone else leads
            return False
        mine = holder == self.identity
        transitions = int(spec.get("leaseTransitions") or 0) + (0 if mine or not holder else 1)
        new_spec = self._spec(now_t, acquire=not mine, transitions=transitions)
        if mine:
            new_spec["acquireTime"] = spec.get("acquireTime", new_spec["acquireTime"])
        body = {**lease, "spec": new_spec}
        try:
            updated = self.api.replace_lease(self.namespace, self.settings.name, body)
        except ActuationError as exc:  # 409: another candidate wrote first
            self.last_error = str(exc)
            return self.is_leader() if mine else False
        if not mine:
            log.info("lease %s/%s: %s takes over from %r", self.namespace, self.settings.name, self.identity, holder)
        return self._won(updated, now_c)

    def _spec(self, now_t: datetime.datetime, *, acquire: bool, transitions: int) -> dict[str, Any]:
        stamp = micro_time(now_t)
        return {"holderIdentity": self.identity, "leaseDurationSeconds": round(self.settings.duration_s),
                "acquireTime": stamp, "renewTime": stamp, "leaseTransitions": transitions}

    def _won(self, lease: dict[str, Any], now_c: float) -> bool:
        self._observed, self._observed_at = lease.get("spec") or {}, now_c
        self._renewed_at = now_c
        return True

    # -- lifecycle --
    def release(self) -> None:
        """Give the Lease up on shutdown so a standby takes over without waiting out the duration."""
        if not self.is_leader():
            return
        try:
            lease = self.api.read_lease(self.namespace, self.settings.name)
            spec = dict(lease.get("spec") or {})
            if spec.get("holderIdentity") == self.identity:
                spec.update(holderIdentity="", leaseDurationSeconds=1, renewTime=micro_time(self._now()))
                self.api.replace_lease(self.namespace, self.settings.name, {**lease, "spec": spec})
        except ActuationError as exc:
            log.warning("lease release failed: %s", exc)
        self._renewed_at = None
        self._publish()

    def run(self, stop: threading.Event) -> None:
        """Renew or contend every retry period until `stop` is set; then release."""
        while not stop.is_set():
            self.try_acquire_or_renew()
            stop.wait(self.settings.retry_period_s)
        self.release()
