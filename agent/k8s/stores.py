"""Where a target kind keeps its settings, as pure read/plan functions over the live object.

Every store reads *tokens* (the setting's text as stored: an env value, a YAML/TOML/JSON value
token; `None` = absent) and plans a JSON Patch that writes new tokens with `test` guards on what
it read. The same plan serves apply (new tokens), rollback (the snapshot's tokens, restoring the
object exactly) and re-apply after an operator revert.
"""
from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from typing import Any

from agent.k8s import textconf
from agent.k8s.args_json import args_json_plan, args_json_read
from agent.k8s.args_store import ArgsError, args_plan, args_read
from agent.k8s.patches import (
    Patch,
    json_patch,
    op_add,
    op_remove,
    op_replace,
    op_test,
    pointer,
    resolve,
    resource_version_guard,
)


class StoreError(ValueError):
    """The live object does not have the shape the store needs (names the object and field)."""


Tokens = Mapping[str, "str | None"]


# -- token <-> component value ----------------------------------------------------------------

def _env_encode(value: Any) -> str:
    return repr(value) if isinstance(value, float) else str(value)


ENCODERS: dict[str, Callable[[Any], str]] = {
    "env": _env_encode,
    "args": _env_encode,
    "args-json": textconf.json_token,
    "yaml-lines": textconf.yaml_token,
    "toml-lines": textconf.toml_token,
    "json-pointer": textconf.json_token,
}
DECODERS: dict[str, Callable[[str], Any]] = {
    "env": lambda tok: tok,
    "args": lambda tok: tok,
    "args-json": textconf.json_value,
    "yaml-lines": textconf.yaml_value,
    "toml-lines": textconf.toml_value,
    "json-pointer": textconf.json_value,
}


def is_json_text(text: str) -> bool:
    return text.lstrip().startswith("{")


def encode(store: str, value: Any, *, text: str = "") -> str:
    if store == "router-config":
        return textconf.json_token(value) if is_json_text(text) else textconf.yaml_token(value)
    return ENCODERS[store](value)


def decode(store: str, token: str, *, text: str = "") -> Any:
    if store == "router-config":
        return textconf.json_value(token) if is_json_text(text) else textconf.yaml_value(token)
    return DECODERS[store](token)


# -- env (Deployment container env) ------------------------------------------------------------
# The actuator adds what the container's environment holds for the managed variables under this
# field ({variable: envsources.EnvValue}, envsources.resolve_env: envFrom, env, valueFrom with
# Kubernetes precedence). Without it only literal `env` values are read.
ENV_FIELD = "x-tierpilot-env"


def _container_index(obj: Mapping[str, Any], container: str | None, where: str) -> int:
    containers = resolve(obj, "/spec/template/spec/containers", [])
    names = [c.get("name") for c in containers]
    if container is None:
        if len(names) == 1:
            return 0
        raise StoreError(f"{where}: several containers ({', '.join(map(str, names))}); set `container`")
    if container not in names:
        raise StoreError(f"{where}: no container named {container!r}; containers: {', '.join(map(str, names))}")
    return names.index(container)


def env_read(obj: Mapping[str, Any], keys: list[str], *, container: str | None, where: str) -> dict[str, str | None]:
    ci = _container_index(obj, container, where)
    env = resolve(obj, f"/spec/template/spec/containers/{ci}/env", None) or []
    out: dict[str, str | None] = {k: None for k in keys}
    seen: dict[str, list[int]] = {}
    for j, entry in enumerate(env):
        if entry.get("name") in out:
            seen.setdefault(entry["name"], []).append(j)
    for name, at in seen.items():
        if len(at) > 1:  # the container gets the last one; editing another would change nothing
            raise StoreError(f"{where}: env {name} appears {len(at)} times (entries {', '.join(map(str, at))}); "
                             f"the container uses the last one: remove the duplicates, the agent will not edit "
                             f"an ambiguous env list")
    resolved = obj.get(ENV_FIELD)
    if resolved is None:
        for entry in env:
            if entry.get("name") in out:
                if "valueFrom" in entry:
                    raise StoreError(f"{where}: env {entry['name']} uses valueFrom; only literal values are managed")
                out[entry["name"]] = str(entry.get("value", ""))
        return out
    for name in out:
        found = resolved.get(name)
        if found is None:
            continue
        if found.value is None:
            verb = "comes from" if found.certain else "may come from"
            raise StoreError(f"{where}: {name} {verb} {found.origin} and the agent cannot know its value: {found.why}; "
                             f"set {name} as a literal value in the container's env")
        out[name] = found.value
    return out


def env_plan(obj: Mapping[str, Any], tokens: Tokens, *, container: str | None, where: str) -> list[dict[str, Any]]:
    ci = _container_index(obj, container, where)
    base = f"/spec/template/spec/containers/{ci}"
    ops: list[dict[str, Any]] = [op_test(f"{base}/name", resolve(obj, f"{base}/name"))]
    env = resolve(obj, f"{base}/env", None)
    current = env_read(obj, list(tokens), container=container, where=where)
    changes = {k: v for k, v in tokens.items() if current[k] != v}
    if not changes:
        return []
    if env is None:
        entries = [{"name": k, "value": v} for k, v in changes.items() if v is not None]
        return ops + resource_version_guard(obj) + ([op_add(f"{base}/env", entries)] if entries else [])
    index = {e.get("name"): j for j, e in enumerate(env)}
    removes: list[int] = []
    adds: list[dict[str, Any]] = []
    for key, tok in changes.items():
        if key in index:
            j = index[key]
            if "valueFrom" in env[j]:
                origin = getattr((obj.get(ENV_FIELD) or {}).get(key), "origin", "valueFrom")
                raise StoreError(f"{where}: cannot change {key}: it is set from {origin}; the agent edits literal "
                                 f"values only: change it there, or make {key} a literal env value")
            ops.append(op_test(f"{base}/env/{j}", env[j]))
            if tok is None:
                removes.append(j)
            else:
                ops.append(op_replace(f"{base}/env/{j}/value", tok))
        elif tok is None:  # only envFrom sets it: an env entry cannot unset it
            origin = getattr((obj.get(ENV_FIELD) or {}).get(key), "origin", "envFrom")
            raise StoreError(f"{where}: cannot unset {key}: {origin} sets it")
        else:
            adds.append({"name": key, "value": tok})
    ops += [op_remove(f"{base}/env/{j}") for j in sorted(removes, reverse=True)]
    if adds:
        ops += resource_version_guard(obj)  # absence cannot be tested: guard on the version read
        ops += [op_add(f"{base}/env/-", entry) for entry in adds]
    return ops


# -- a file in a ConfigMap key ----------------------------------------------------------------

_TEXT_GET: dict[str, Callable[[str, str], str | None]] = {
    "yaml-lines": textconf.yaml_get,
    "toml-lines": textconf.toml_get,
}
_TEXT_SET: dict[str, Callable[[str, Tokens], str]] = {
    "yaml-lines": textconf.yaml_set,
    "toml-lines": textconf.toml_set,
}


def _file_text(obj: Mapping[str, Any], key: str, where: str) -> str:
    data = obj.get("data") or {}
    if key not in data:
        raise StoreError(f"{where}: ConfigMap has no data key {key!r}; keys: {', '.join(sorted(data)) or '(none)'}")
    return str(data[key])


def text_get(store: str, text: str, key: str) -> str | None:
    if store == "router-config":
        return textconf.json_get(text, key) if is_json_text(text) else textconf.yaml_get(text, key)
    return _TEXT_GET[store](text, key)


def text_set(store: str, text: str, tokens: Tokens) -> str:
    if store == "router-config":
        return textconf.json_set(text, tokens) if is_json_text(text) else textconf.yaml_set(text, tokens)
    return _TEXT_SET[store](text, tokens)


def file_read(store: str, obj: Mapping[str, Any], keys: list[str], *, data_key: str, where: str
              ) -> dict[str, str | None]:
    text = _file_text(obj, data_key, where)
    try:
        return {k: text_get(store, text, k) for k in keys}
    except textconf.ConfigTextError as exc:
        raise StoreError(f"{where}: data key {data_key!r}: {exc}") from None


def file_plan(store: str, obj: Mapping[str, Any], tokens: Tokens, *, data_key: str, where: str
              ) -> list[dict[str, Any]]:
    text = _file_text(obj, data_key, where)
    try:
        new = text_set(store, text, tokens)
    except textconf.ConfigTextError as exc:
        raise StoreError(f"{where}: data key {data_key!r}: {exc}") from None
    if new == text:
        return []
    path = pointer("data", data_key)
    return [op_test(path, text), op_replace(path, new)]


# -- JSON pointers into the object (custom resources) ------------------------------------------

def pointer_read(obj: Mapping[str, Any], keys: list[str]) -> dict[str, str | None]:
    out: dict[str, str | None] = {}
    for ptr in keys:
        value = resolve(obj, ptr, None)
        out[ptr] = None if value is None else json.dumps(value)
    return out


def pointer_plan(obj: Mapping[str, Any], tokens: Tokens, *, where: str) -> list[dict[str, Any]]:
    ops: list[dict[str, Any]] = []
    guard = False
    for ptr, tok in tokens.items():
        old = resolve(obj, ptr, None)
        new = None if tok is None else json.loads(tok)
        if old == new:
            continue
        parent = ptr.rsplit("/", 1)[0]
        if resolve(obj, parent, None) is None:
            raise StoreError(f"{where}: {parent} is absent; the agent does not create it")
        if old is None:
            guard = True
            ops.append(op_add(ptr, new))
        else:
            ops.append(op_test(ptr, old))
            ops.append(op_remove(ptr) if new is None else op_replace(ptr, new))
    return (resource_version_guard(obj) if guard else []) + ops


# -- dispatch ---------------------------------------------------------------------------------

def read_tokens(store: str, obj: Mapping[str, Any], keys: list[str], *, container: str | None = None,
                data_key: str | None = None, where: str = "object") -> dict[str, str | None]:
    if store == "env":
        return env_read(obj, keys, container=container, where=where)
    if store in ("args", "args-json"):
        read = args_read if store == "args" else args_json_read
        try:
            return read(obj, _container_index(obj, container, where), keys, where)
        except ArgsError as exc:
            raise StoreError(str(exc)) from None
    if store == "json-pointer":
        return pointer_read(obj, keys)
    assert data_key is not None
    return file_read(store, obj, keys, data_key=data_key, where=where)


def plan_tokens(store: str, obj: Mapping[str, Any], tokens: Tokens, *, container: str | None = None,
                data_key: str | None = None, where: str = "object", reason: str = "") -> Patch:
    if store == "env":
        ops = env_plan(obj, tokens, container=container, where=where)
    elif store in ("args", "args-json"):
        plan = args_plan if store == "args" else args_json_plan
        try:
            ops = plan(obj, _container_index(obj, container, where), tokens, where)
        except ArgsError as exc:
            raise StoreError(str(exc)) from None
    elif store == "json-pointer":
        ops = pointer_plan(obj, tokens, where=where)
    else:
        assert data_key is not None
        ops = file_plan(store, obj, tokens, data_key=data_key, where=where)
    return json_patch(ops, reason)


def file_text(obj: Mapping[str, Any], data_key: str) -> str:
    return str((obj.get("data") or {}).get(data_key, ""))
