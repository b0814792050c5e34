"""Patches as data, and the pointer helpers that build them. Pure: no I/O.

A `Patch` is what one API call sends: a patch type and a body. JSON Patch (RFC 6902) is used where
concurrent edits matter, with `test` operations that make the server refuse the patch (HTTP 422)
when the object moved under us; the caller then re-reads and re-plans. Strategic merge is used
for the annotations of a pod template (a map, where it is the natural fit); JSON merge patch for
object annotations, because it works for custom resources too (they reject strategic merge).
"""
from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping, Sequence
from typing import Any, Literal

PatchType = Literal["json", "merge", "strategic"]

CONTENT_TYPES: dict[str, str] = {
    "json": "application/json-patch+json",
    "merge": "application/merge-patch+json",
    "strategic": "application/strategic-merge-patch+json",
}

LAST_GOOD_ANNOTATION = "tierpilot.io/last-good"
CONFIG_HASH_ANNOTATION = "tierpilot.io/config-hash"


@dataclasses.dataclass(frozen=True)
class Patch:
    """One patch request body. `body` is a list of operations for "json", a mapping otherwise."""

    type: PatchType
    body: Any
    reason: str = ""

    @property
    def content_type(self) -> str:
        return CONTENT_TYPES[self.type]

    def to_json(self) -> str:
        return json.dumps(self.body, sort_keys=True)

    @property
    def empty(self) -> bool:
        if self.type == "json":
            return not any(op["op"] != "test" for op in self.body)
        return not self.body


# -- JSON pointers (RFC 6901) -----------------------------------------------------------------

def escape(token: str) -> str:
    return token.replace("~", "~0").replace("/", "~1")


def unescape(token: str) -> str:
    return token.replace("~1", "/").replace("~0", "~")


def pointer(*tokens: str | int) -> str:
    return "".join("/" + escape(str(t)) for t in tokens)


def split_pointer(ptr: str) -> list[str]:
    if ptr == "":
        return []
    if not ptr.startswith("/"):
        raise ValueError(f"JSON pointer must start with '/': {ptr!r}")
    return [unescape(t) for t in ptr[1:].split("/")]


_MISSING = object()


def resolve(obj: Any, ptr: str, default: Any = _MISSING) -> Any:
    """The value at `ptr` in `obj`; `default` (or KeyError) when a step is missing."""
    cur = obj
    for tok in split_pointer(ptr):
        if isinstance(cur, Mapping) and tok in cur:
            cur = cur[tok]
        elif isinstance(cur, list) and tok.isdigit() and int(tok) < len(cur):
            cur = cur[int(tok)]
        else:
            if default is _MISSING:
                raise KeyError(ptr)
            return default
    return cur


def has(obj: Any, ptr: str) -> bool:
    return resolve(obj, ptr, _MISSING) is not _MISSING


# -- operation builders -----------------------------------------------------------------------

def op_test(path: str, value: Any) -> dict[str, Any]:
    return {"op": "test", "path": path, "value": value}


def op_replace(path: str, value: Any) -> dict[str, Any]:
    return {"op": "replace", "path": path, "value": value}


def op_add(path: str, value: Any) -> dict[str, Any]:
    return {"op": "add", "path": path, "value": value}


def op_remove(path: str) -> dict[str, Any]:
    return {"op": "remove", "path": path}


def resource_version_guard(obj: Mapping[str, Any]) -> list[dict[str, Any]]:
    """A `test` on metadata.resourceVersion: the patch applies only to exactly this version."""
    rv = obj.get("metadata", {}).get("resourceVersion")
    return [op_test("/metadata/resourceVersion", rv)] if rv is not None else []


def json_patch(ops: Sequence[Mapping[str, Any]], reason: str = "") -> Patch:
    """Tests first (so they see the object as read), then the mutating operations in order."""
    tests = [dict(o) for o in ops if o["op"] == "test"]
    rest = [dict(o) for o in ops if o["op"] != "test"]
    return Patch("json", tests + rest, reason)


def annotations_patch(annotations: Mapping[str, str | None], reason: str = "") -> Patch:
    """Merge patch of metadata.annotations; None removes a key. Works for every kind."""
    return Patch("merge", {"metadata": {"annotations": dict(annotations)}}, reason)


def template_annotations_patch(annotations: Mapping[str, str | None], reason: str = "") -> Patch:
    """Strategic merge of a workload's pod-template annotations (a change rolls the pods)."""
    body = {"spec": {"template": {"metadata": {"annotations": dict(annotations)}}}}
    return Patch("strategic", body, reason)
