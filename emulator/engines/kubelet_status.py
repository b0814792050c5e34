"""What the kubelet and the Deployment controller report about the pods they run (pure).

- A container that exits is restarted (restartPolicy Always) after the kubelet's back-off: at
  once after its first crash, then 10 s, 20 s, 40 s, ... capped at five minutes; a container that
  ran ten minutes starts over at once. While it waits, the pod shows `CrashLoopBackOff`.
- A pod is Ready when its container answered its readiness probe since it last started.
- A Deployment's status counts its updated, ready and available replicas, and its conditions are
  the controller's: `Available` (at most one replica unavailable, the rolling update's
  `maxUnavailable`) and `Progressing`, which turns `ProgressDeadlineExceeded` when the rollout has
  made no progress for `spec.progressDeadlineSeconds` (600 s by default). That condition is what
  `kubectl rollout status` and the agent's rollout watch give up on.
"""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

BACKOFF_INITIAL_S = 10.0  # the back-off after the second crash in a row, doubled at each one after it
BACKOFF_MAX_S = 300.0
BACKOFF_RESET_S = 600.0  # a container that ran this long before it exited is restarted at once
PROGRESS_DEADLINE_S = 600.0  # spec.progressDeadlineSeconds' default
MAX_UNAVAILABLE = 1  # the rolling update this kubelet runs: maxSurge 0, maxUnavailable 1


def restart_delay(crashes: int) -> float:
    """Seconds between the `crashes`-th exit in a row and the restart that follows it."""
    if crashes <= 1:
        return 0.0
    return min(BACKOFF_INITIAL_S * 2.0 ** (crashes - 2), BACKOFF_MAX_S)


def pod_status(ip: str, container: str, image: str, *, ready: bool, restarts: int,
               waiting: str | None = None, message: str = "") -> dict[str, Any]:
    """A running pod's `status`: its IP, the Ready condition and its one container's status."""
    flag = "True" if ready else "False"
    state: dict[str, Any] = {"waiting": {"reason": waiting, "message": message}} if waiting else {"running": {}}
    return {"phase": "Running", "podIP": ip,
            "conditions": [{"type": "Ready", "status": flag}, {"type": "ContainersReady", "status": flag}],
            "containerStatuses": [{"name": container, "image": image, "imageID": "", "ready": ready,
                                   "restartCount": restarts, "started": waiting is None, "state": state}]}


@dataclass(frozen=True)
class ReplicaCounts:
    """A Deployment's pods: how many run at all, run the current template, and of those are ready."""

    total: int
    updated: int
    ready: int


def deployment_status(generation: int, replicas: int, counts: ReplicaCounts, replica_set: str, *,
                      deadline_exceeded: bool) -> dict[str, Any]:
    """The Deployment controller's `status` for `replicas` wanted and the pods in `counts`."""
    complete = counts.updated == replicas and counts.ready == replicas and counts.total == replicas
    if complete:
        progressing = ("True", "NewReplicaSetAvailable", f'ReplicaSet "{replica_set}" has successfully progressed.')
    elif deadline_exceeded:
        progressing = ("False", "ProgressDeadlineExceeded", f'ReplicaSet "{replica_set}" has timed out progressing.')
    else:
        progressing = ("True", "ReplicaSetUpdated", f'ReplicaSet "{replica_set}" is progressing.')
    available = counts.ready >= replicas - MAX_UNAVAILABLE
    return {
        "observedGeneration": generation, "replicas": counts.total, "updatedReplicas": counts.updated,
        "readyReplicas": counts.ready, "availableReplicas": counts.ready,
        "unavailableReplicas": max(replicas - counts.ready, 0),
        "conditions": [
            {"type": "Available", "status": "True" if available else "False",
             "reason": "MinimumReplicasAvailable" if available else "MinimumReplicasUnavailable",
             "message": "Deployment has minimum availability." if available
             else "Deployment does not have minimum availability."},
            {"type": "Progressing", "status": progressing[0], "reason": progressing[1], "message": progressing[2]},
        ],
    }


def same_status(current: Mapping[str, Any], want: Mapping[str, Any]) -> bool:
    """Whether `current` already says everything `want` does (nothing to write)."""
    return all(current.get(k) == v for k, v in want.items())
