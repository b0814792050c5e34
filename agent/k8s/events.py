"""Kubernetes Events for apply, rollback and re-apply (core/v1 Event bodies, built as data)."""
from __future__ import annotations

import datetime
import logging
from collections.abc import Callable, Mapping
from typing import Any

from agent.k8s.api import ObjectRef
from contracts.actuator import ActuationError

log = logging.getLogger("tierpilot.k8s")

COMPONENT = "tierpilot"

REASONS = {
    "apply": ("TierpilotApplied", "Normal"),
    "dry_run": ("TierpilotDryRun", "Normal"),
    "rollback": ("TierpilotRolledBack", "Warning"),
    "reapply": ("TierpilotReapplied", "Warning"),
    "reapply_gave_up": ("TierpilotReapplyGaveUp", "Warning"),
    "failed": ("TierpilotApplyFailed", "Warning"),
}


def build_event(ref: ObjectRef, obj: Mapping[str, Any] | None, what: str, message: str, *,
                identity: str, now: datetime.datetime) -> dict[str, Any]:
    reason, typ = REASONS[what]
    meta = (obj or {}).get("metadata", {})
    stamp = now.astimezone(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    involved = {"apiVersion": ref.info.api_version, "kind": ref.kind, "namespace": ref.namespace, "name": ref.name}
    if meta.get("uid"):
        involved["uid"] = meta["uid"]
    if meta.get("resourceVersion"):
        involved["resourceVersion"] = meta["resourceVersion"]
    return {
        "apiVersion": "v1",
        "kind": "Event",
        "metadata": {"generateName": f"{ref.name}.tierpilot-", "namespace": ref.namespace},
        "involvedObject": involved,
        "reason": reason,
        "type": typ,
        "message": message[:1000],
        "action": what,
        "source": {"component": COMPONENT},
        "reportingComponent": COMPONENT,
        "reportingInstance": identity,
        "firstTimestamp": stamp,
        "lastTimestamp": stamp,
        "count": 1,
    }


class EventRecorder:
    """Creates Events; a failure to record is logged and counted, never raised."""

    def __init__(self, create: Callable[[str, dict[str, Any]], Any], *, identity: str,
                 now: Callable[[], datetime.datetime]) -> None:
        self._create = create
        self.identity = identity
        self._now = now
        self.failures = 0

    def record(self, ref: ObjectRef, obj: Mapping[str, Any] | None, what: str, message: str) -> None:
        body = build_event(ref, obj, what, message, identity=self.identity, now=self._now())
        try:
            self._create(ref.namespace, body)
        except ActuationError as exc:
            self.failures += 1
            log.warning("could not record event %s on %s: %s", body["reason"], ref, exc)
