"""Server-side printing (the `meta.k8s.io/v1` Table API), as kube-apiserver answers `kubectl get`
without `-o`: kubectl asks for a Table (`Accept: application/json;as=Table;v=v1;g=meta.k8s.io`)
and prints its columns. Pure: objects in, a Table out.

The columns follow kube-apiserver's printers for the kinds the emulated cluster holds (pods:
NAME READY STATUS RESTARTS AGE, wide IP; deployments: NAME READY UP-TO-DATE AVAILABLE AGE;
statefulsets: NAME READY AGE; configmaps: NAME DATA AGE); any other kind gets NAME AGE, as for a
resource without printer columns.
"""
from __future__ import annotations

import datetime as dt
from collections.abc import Callable, Iterable, Mapping
from typing import Any

TABLE_MEDIA = "as=Table"
Obj = Mapping[str, Any]


def wants_table(accept: str) -> bool:
    """Whether an Accept header asks for a meta.k8s.io Table (kubectl's human-readable `get`)."""
    return any(TABLE_MEDIA in part and "g=meta.k8s.io" in part for part in accept.split(","))


def age(created: str | None, now: dt.datetime) -> str:
    """kubectl's AGE (apimachinery's HumanDuration): 90s, 2m5s, 45m, 5h12m, 30h, 3d4h, 12d, 2y40d."""
    if not created:
        return "<unknown>"
    try:
        then = dt.datetime.fromisoformat(created)
    except ValueError:
        return "<invalid>"
    s = int((now - then).total_seconds())
    if s < -1:
        return "<invalid>"
    if s < 120:
        return f"{max(s, 0)}s"
    m, h = s // 60, s // 3600
    if m < 10:
        return f"{m}m{s % 60}s" if s % 60 else f"{m}m"
    if m < 180:
        return f"{m}m"
    if h < 8:
        return f"{h}h{m % 60}m" if m % 60 else f"{h}h"
    if h < 48:
        return f"{h}h"
    d = h // 24
    if h < 24 * 8:
        return f"{d}d{h % 24}h" if h % 24 else f"{d}d"
    if h < 24 * 365 * 2:
        return f"{d}d"
    if h < 24 * 365 * 8:
        return f"{d // 365}y{d % 365}d" if d % 365 else f"{d // 365}y"
    return f"{d // 365}y"


def _pod_cells(o: Obj) -> list[Any]:
    status = o.get("status") or {}
    containers = (o.get("spec") or {}).get("containers") or []
    statuses = status.get("containerStatuses") or []
    ready = sum(1 for c in statuses if c.get("ready"))
    reason = status.get("reason") or status.get("phase") or "Pending"
    for c in statuses:  # a waiting or terminated container names the pod's state, as kubectl shows it
        state = c.get("state") or {}
        why = (state.get("waiting") or state.get("terminated") or {}).get("reason")
        if why:
            reason = why
    restarts = sum(int(c.get("restartCount", 0)) for c in statuses)
    return [f"{ready}/{len(containers) or len(statuses)}", reason, restarts, status.get("podIP") or "<none>"]


def _deployment_cells(o: Obj) -> list[Any]:
    spec, status = o.get("spec") or {}, o.get("status") or {}
    want = int(spec.get("replicas", 1))
    return [f"{int(status.get('readyReplicas', 0))}/{want}", int(status.get("updatedReplicas", 0)),
            int(status.get("availableReplicas", 0))]


def _statefulset_cells(o: Obj) -> list[Any]:
    want = int((o.get("spec") or {}).get("replicas", 1))
    return [f"{int((o.get('status') or {}).get('readyReplicas', 0))}/{want}"]


def _configmap_cells(o: Obj) -> list[Any]:
    return [len(o.get("data") or {}) + len(o.get("binaryData") or {})]


# plural -> (columns between NAME and AGE, then wide-only columns after AGE; the cells, in that order)
_COLUMNS: dict[str, tuple[tuple[tuple[str, str], ...], tuple[tuple[str, str], ...], Callable[[Obj], list[Any]]]] = {
    "pods": ((("Ready", "string"), ("Status", "string"), ("Restarts", "integer")), (("IP", "string"),), _pod_cells),
    "deployments": ((("Ready", "string"), ("Up-to-date", "integer"), ("Available", "integer")), (),
                    _deployment_cells),
    "statefulsets": ((("Ready", "string"),), (), _statefulset_cells),
    "configmaps": ((("Data", "integer"),), (), _configmap_cells),
}


def table(plural: str, objects: Iterable[Obj], resource_version: str, now: dt.datetime) -> dict[str, Any]:
    """The Table kube-apiserver prints for `objects` of one resource (a LIST, or one object's GET)."""
    middle, wide, cells = _COLUMNS.get(plural, ((), (), lambda o: []))
    names = [("Name", "string")] + list(middle) + [("Age", "date")] + list(wide)
    columns = [{"name": n, "type": t, "format": "name" if n == "Name" else "", "description": n,
                "priority": 1 if (n, t) in wide else 0} for n, t in names]
    rows = []
    for o in objects:
        meta = o.get("metadata") or {}
        extra = cells(o)
        rows.append({
            "cells": [meta.get("name", ""), *extra[:len(middle)], age(meta.get("creationTimestamp"), now),
                      *extra[len(middle):]],
            "object": {"kind": "PartialObjectMetadata", "apiVersion": "meta.k8s.io/v1", "metadata": dict(meta)},
        })
    return {"kind": "Table", "apiVersion": "meta.k8s.io/v1", "metadata": {"resourceVersion": resource_version},
            "columnDefinitions": columns, "rows": rows}


__all__ = ["age", "table", "wants_table"]
