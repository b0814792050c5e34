"""Validate dashboard JSON against grafana-foundation-sdk's models (Grafana's dashboard schema).

Two checks, both pure:
- **known fields**: the JSON is decoded into the SDK's typed models (panel options and field
  config by panel type, targets by data source type) and encoded again; any field the schema does
  not know is lost on the way and reported with its path. The Prometheus annotation fields
  Grafana reads but the SDK's `AnnotationQuery` does not model are the one allowed exception
  (`sdk.PROMETHEUS_ANNOTATION_EXTRAS`).
- **types**: every decoded attribute is checked against the model's type hints: enums and
  literals take only their values, numbers are numbers, strings strings, lists lists.

`problems(json)` returns one line per finding; an empty list is a valid dashboard.
"""
from __future__ import annotations

import enum
import json
import types
import typing
from collections.abc import Iterator
from functools import cache
from typing import Any

from grafana_foundation_sdk.cog.encoder import JSONEncoder
from grafana_foundation_sdk.cog.plugins import register_default_plugins
from grafana_foundation_sdk.models import dashboard as dm

from dashboards.sdk import PROMETHEUS_ANNOTATION_EXTRAS


@cache
def _plugins() -> None:
    register_default_plugins()


def _lost(original: Any, encoded: Any, path: str) -> Iterator[str]:
    if isinstance(original, dict):
        if not isinstance(encoded, dict):
            yield f"{path}: expected an object"
            return
        for key, value in original.items():
            if key not in encoded:
                if not (path.startswith("dashboard.annotations.list[") and key in PROMETHEUS_ANNOTATION_EXTRAS):
                    yield f"{path}.{key}: not in the schema"
                continue
            yield from _lost(value, encoded[key], f"{path}.{key}")
    elif isinstance(original, list) and isinstance(encoded, list):
        for i, (a, b) in enumerate(zip(original, encoded, strict=False)):
            yield from _lost(a, b, f"{path}[{i}]")


def _accepts(hint: Any, value: Any) -> bool:
    origin = typing.get_origin(hint)
    if hint is Any or hint is object:
        return True
    if origin is typing.Union or origin is types.UnionType:
        return any(_accepts(h, value) for h in typing.get_args(hint))
    if hint is type(None):
        return value is None
    if origin is typing.Literal:
        return value in typing.get_args(hint)
    if origin is list:
        (item,) = typing.get_args(hint) or (Any,)
        return isinstance(value, list) and all(_accepts(item, v) for v in value)
    if origin is dict:
        return isinstance(value, dict)
    if isinstance(hint, type) and issubclass(hint, enum.Enum):
        return value in {m.value for m in hint} or isinstance(value, hint)
    if hint is float:
        return isinstance(value, int | float) and not isinstance(value, bool)
    if hint is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if isinstance(hint, type) and isinstance(value, dict) and hasattr(hint, "from_json"):
        return True  # a model the SDK left undecoded (panel transformations): checked by _typed
    if isinstance(hint, type):
        return isinstance(value, hint)
    return True  # a forward reference or a variant the SDK resolves itself


def _typed(obj: Any, path: str, seen: set[int]) -> Iterator[str]:
    if id(obj) in seen or not hasattr(obj, "to_json"):
        return
    seen.add(id(obj))
    module = __import__(type(obj).__module__, fromlist=["_"])
    try:
        hints = typing.get_type_hints(type(obj), vars(module))
    except (NameError, TypeError):
        hints = {}
    for name, value in vars(obj).items():
        hint = hints.get(name)
        if hint is not None and not _accepts(hint, value):
            yield f"{path}.{name}: {value!r} is not a {hint}"
        children = enumerate(value) if isinstance(value, list) else [(None, value)]
        for i, child in children:
            where = f"{path}.{name}" + ("" if i is None else f"[{i}]")
            if isinstance(child, dict):
                model = _model_for(hint)
                if model is not None:
                    child = model.from_json(child)
            yield from _typed(child, where, seen)


def _model_for(hint: Any) -> Any:
    """The SDK model class a (possibly list or optional) hint names, if any."""
    if isinstance(hint, type) and hasattr(hint, "from_json"):
        return hint
    for h in typing.get_args(hint):
        inner = _model_for(h)
        if inner is not None:
            return inner
    return None


def problems(dashboard: dict[str, Any]) -> list[str]:
    """Every field the SDK's schema does not know and every value of the wrong type."""
    _plugins()
    model = dm.Dashboard.from_json(dashboard)
    encoded = json.loads(json.dumps(model, cls=JSONEncoder))
    found = list(_lost(dashboard, encoded, "dashboard"))
    found += list(_typed(model, "dashboard", set()))
    return found
