"""Rollout assessment (pure) and the wait loop (injected clock and sleep).

A Deployment or StatefulSet is rolled out when the controller has observed the latest generation
and the updated and available replicas have caught up with the desired count (the same rules as
`kubectl rollout status`). An InferenceEndpointConfig is rolled out when the HyperPod operator has
observed the latest generation and reports `DeploymentComplete`.
"""
from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from typing import Any

from agent.k8s.patches import resolve


@dataclasses.dataclass(frozen=True)
class RolloutState:
    done: bool
    failed: bool
    message: str


def _generation_seen(obj: Mapping[str, Any]) -> bool:
    gen = resolve(obj, "/metadata/generation", 0) or 0
    seen = resolve(obj, "/status/observedGeneration", 0) or 0
    return seen >= gen


def assess_deployment(obj: Mapping[str, Any]) -> RolloutState:
    if not _generation_seen(obj):
        return RolloutState(False, False, "waiting for the controller to observe the new generation")
    for cond in resolve(obj, "/status/conditions", []) or []:
        if cond.get("type") == "Progressing" and cond.get("reason") == "ProgressDeadlineExceeded":
            return RolloutState(False, True, f"progress deadline exceeded: {cond.get('message', '')}")
    want = resolve(obj, "/spec/replicas", 1)
    want = 1 if want is None else want
    status = obj.get("status") or {}
    updated = status.get("updatedReplicas", 0) or 0
    total = status.get("replicas", 0) or 0
    available = status.get("availableReplicas", 0) or 0
    if updated < want:
        return RolloutState(False, False, f"{updated} of {want} replicas updated")
    if total > updated:
        return RolloutState(False, False, f"{total - updated} old replicas pending termination")
    if available < updated:
        return RolloutState(False, False, f"{available} of {updated} updated replicas available")
    return RolloutState(True, False, f"rolled out: {updated} replicas updated and available")


def assess_statefulset(obj: Mapping[str, Any]) -> RolloutState:
    if not _generation_seen(obj):
        return RolloutState(False, False, "waiting for the controller to observe the new generation")
    want = resolve(obj, "/spec/replicas", 1)
    want = 1 if want is None else want
    status = obj.get("status") or {}
    updated = status.get("updatedReplicas", 0) or 0
    ready = status.get("availableReplicas", status.get("readyReplicas", 0)) or 0
    if status.get("updateRevision") and status.get("currentRevision") != status.get("updateRevision") \
            and updated < want:
        return RolloutState(False, False, f"{updated} of {want} pods at the update revision")
    if updated < want:
        return RolloutState(False, False, f"{updated} of {want} pods updated")
    if ready < want:
        return RolloutState(False, False, f"{ready} of {want} pods available")
    return RolloutState(True, False, f"rolled out: {want} pods updated and available")


def assess_iec(obj: Mapping[str, Any]) -> RolloutState:
    if not _generation_seen(obj):
        return RolloutState(False, False, "waiting for the HyperPod operator to observe the new generation")
    state = resolve(obj, "/status/state", None)
    if state == "DeploymentComplete":
        return RolloutState(True, False, "operator reports DeploymentComplete")
    if state == "DeploymentFailed":
        msg = resolve(obj, "/status/deploymentStatus/message", "") or ""
        return RolloutState(False, True, f"operator reports DeploymentFailed: {msg}")
    return RolloutState(False, False, f"operator state {state or 'unknown'}")


ASSESSORS: dict[str, Callable[[Mapping[str, Any]], RolloutState]] = {
    "Deployment": assess_deployment,
    "StatefulSet": assess_statefulset,
    "InferenceEndpointConfig": assess_iec,
}


def wait_for_rollout(read: Callable[[], Mapping[str, Any]], assess: Callable[[Mapping[str, Any]], RolloutState],
                     *, timeout_s: float, poll_s: float, clock: Callable[[], float],
                     sleep: Callable[[float], None], on_progress: Callable[[str], None] | None = None
                     ) -> RolloutState:
    """Poll until done, failed or `timeout_s` elapsed (returns the last state, done=False)."""
    start = clock()
    last = ""
    while True:
        state = assess(read())
        if state.message != last and on_progress is not None:
            on_progress(state.message)
        last = state.message
        if state.done or state.failed:
            return state
        elapsed = clock() - start
        if elapsed >= timeout_s:
            return RolloutState(False, False, f"timed out after {elapsed:.0f}s: {state.message}")
        sleep(min(poll_s, max(timeout_s - elapsed, 0.0)))
