"""What a container's environment holds for the variables the agent manages, as the kubelet
composes it, and the reads that tell it.

The kubelet (pkg/kubelet/kubelet_pods.go, makeEnvironmentVariables) takes every `envFrom` source in
order (the `prefix` prepended to each key of a ConfigMap's or Secret's `data`; a later source
overrides an earlier one; an absent `optional` source gives nothing), then `env` in order (which
overrides `envFrom`; a later entry overrides an earlier one). A `valueFrom` entry reads one key of a
ConfigMap (`configMapKeyRef`) or Secret (`secretKeyRef`); an absent `optional` key leaves the
variable as it was; `fieldRef` and `resourceFieldRef` are filled at start from the pod.

`resolve_env` is pure over the sources the agent could read. It never guesses: a value it cannot
know (a source it may not read, an envFrom Secret's value, a `fieldRef`, a `$(VAR)` expansion) is
`EnvValue(value=None)` with the reason, and the caller refuses rather than report it. Of a Secret
the agent keeps the key names, and the value of a key only where a managed variable's
`secretKeyRef` names it.
"""
from __future__ import annotations

import base64
import binascii
import dataclasses
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from agent.k8s import stores
from agent.k8s.api import ObjectRef
from agent.k8s.patches import resolve
from contracts.actuator import ActuationError, TargetGoneError

SOURCE_REFS = {"configMapRef": "ConfigMap", "secretRef": "Secret"}
KEY_REFS = {"configMapKeyRef": "ConfigMap", "secretKeyRef": "Secret"}


@dataclasses.dataclass(frozen=True)
class Source:
    """A ConfigMap or Secret as far as the agent knows it."""

    kind: str
    namespace: str
    name: str
    keys: frozenset[str] | None = None  # the `data` key names; None: not known (see `problem`)
    values: Mapping[str, str] = dataclasses.field(default_factory=dict)  # the values it read
    missing: bool = False  # the API answered 404
    problem: str = ""  # why the keys are not known

    def __str__(self) -> str:
        return f"{self.kind} {self.namespace}/{self.name}"


@dataclasses.dataclass(frozen=True)
class EnvValue:
    """One variable of a container: its value where the agent knows it, and where it comes from."""

    value: str | None  # None: the agent does not know the value (`why`)
    origin: str  # "env", "ConfigMap llm/x (envFrom)", "Secret llm/s key k (valueFrom)", ...
    why: str = ""
    literal: bool = False  # a literal `env` value: the only kind of entry the agent edits
    certain: bool = True  # False: a source the agent could not read may set it (or may not)


Lookup = Callable[[str, str], Source]  # (kind, name) -> Source, in the container's namespace


def envfrom_refs(container: Mapping[str, Any]) -> list[tuple[str, str, str, bool]]:
    """(kind, name, prefix, optional) of each `envFrom` source of a container, in order."""
    out = []
    for entry in container.get("envFrom") or []:
        for field, kind in SOURCE_REFS.items():
            ref = entry.get(field)
            if isinstance(ref, Mapping) and ref.get("name"):
                out.append((kind, str(ref["name"]), str(entry.get("prefix") or ""), bool(ref.get("optional"))))
    return out


def key_refs(container: Mapping[str, Any], names: Iterable[str]) -> list[tuple[str, str, str]]:
    """(kind, name, key) of each `valueFrom` ConfigMap/Secret key a variable in `names` reads."""
    wanted, out = set(names), []
    for entry in container.get("env") or []:
        if entry.get("name") not in wanted:
            continue
        for field, kind in KEY_REFS.items():
            ref = (entry.get("valueFrom") or {}).get(field)
            if isinstance(ref, Mapping) and ref.get("name"):
                out.append((kind, str(ref["name"]), str(ref.get("key", ""))))
    return out


def resolve_env(container: Mapping[str, Any], namespace: str, lookup: Lookup,
                names: Iterable[str]) -> dict[str, EnvValue]:
    """The variables among `names` that the container's `envFrom` and `env` set (see the module)."""
    wanted = list(dict.fromkeys(names))
    out: dict[str, EnvValue] = {}
    for kind, name, prefix, optional in envfrom_refs(container):
        if not any(var.startswith(prefix) for var in wanted):
            continue  # it cannot set a managed variable: not read
        src = lookup(kind, name)
        if src.missing and optional:
            continue
        origin = f"{src} (envFrom)"
        for var in wanted:
            if not var.startswith(prefix):
                continue
            key = var[len(prefix):]
            if src.missing or src.keys is None:
                why = "it does not exist and is not optional" if src.missing else src.problem
                out[var] = EnvValue(None, origin, why, certain=False)
            elif key in src.keys:
                out[var] = (EnvValue(src.values[key], origin) if key in src.values else
                            EnvValue(None, origin, f"the agent reads only the key names of a {kind} in envFrom"))
    for entry in container.get("env") or []:
        var = entry.get("name")
        if var not in wanted:
            continue
        if "valueFrom" not in entry:
            value = str(entry.get("value", ""))
            out[var] = (EnvValue(None, "env", "its value uses $(VAR) expansion, which the agent does not evaluate",
                                 literal=True) if "$(" in value else EnvValue(value, "env", literal=True))
            continue
        found = _value_from(entry["valueFrom"], namespace, lookup)
        if found is not None:
            out[var] = found
    return out


def _value_from(src: Mapping[str, Any], namespace: str, lookup: Lookup) -> EnvValue | None:
    """A `valueFrom` entry's value; None where an optional source or key leaves the variable as it was."""
    for field, kind in KEY_REFS.items():
        ref = src.get(field)
        if not isinstance(ref, Mapping):
            continue
        name, key, optional = str(ref.get("name", "")), str(ref.get("key", "")), bool(ref.get("optional"))
        source = lookup(kind, name)
        origin = f"{source} key {key} (valueFrom)"
        if source.missing or (source.keys is not None and key not in source.keys):
            if optional:
                return None
            return EnvValue(None, origin, "it does not exist and is not optional (the container cannot start)")
        if source.keys is None:
            return EnvValue(None, origin, source.problem)
        return EnvValue(source.values[key], origin) if key in source.values else EnvValue(
            None, origin, f"the agent did not read that {kind} key")
    what = ", ".join(sorted(src)) or "(empty)"
    return EnvValue(None, f"env (valueFrom {what})", "the kubelet fills it in when the container starts")


# -- the reads ------------------------------------------------------------------------------

def read_source(read: Callable[[ObjectRef], dict[str, Any]], kind: str, namespace: str, name: str,
                secret_keys: Iterable[str] = ()) -> Source:
    """One source through `read` (the API's get): a ConfigMap's `data`; a Secret's key names and
    only the values of `secret_keys`. A source the API will not show is not known, with the reason."""
    try:
        obj = read(ObjectRef(kind, namespace, name))
    except TargetGoneError:
        return Source(kind, namespace, name, missing=True)
    except ActuationError as exc:
        why = "the agent may not read it (list it in the target's env_sources)" if "forbidden" in str(exc) else \
            f"it could not be read ({str(exc)[:160]})"
        return Source(kind, namespace, name, problem=why)
    data = obj.get("data") or {}
    if kind == "ConfigMap":
        return Source(kind, namespace, name, frozenset(data), {k: str(v) for k, v in data.items()})
    values: dict[str, str] = {}
    for key in secret_keys:
        if key in data:
            try:
                values[key] = base64.b64decode(str(data[key]), validate=True).decode("utf-8")
            except (binascii.Error, UnicodeDecodeError):
                continue  # not text: unknown, refused by the caller
    return Source(kind, namespace, name, frozenset(data), values)


def container_sources(read: Callable[[ObjectRef], dict[str, Any]], containers: Iterable[Mapping[str, Any]],
                      namespace: str, names: Iterable[str]) -> Lookup:
    """A lookup over every source the containers name for `names` (each read once, lazily)."""
    names = list(names)
    secret_keys: dict[str, set[str]] = {}
    for c in containers:
        for kind, name, key in key_refs(c, names):
            if kind == "Secret":
                secret_keys.setdefault(name, set()).add(key)
    cache: dict[tuple[str, str], Source] = {}

    def lookup(kind: str, name: str) -> Source:
        if (kind, name) not in cache:
            cache[(kind, name)] = read_source(read, kind, namespace, name, secret_keys.get(name, ()) if
                                              kind == "Secret" else ())
        return cache[(kind, name)]

    return lookup


def _containers(workload: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    return list(resolve(workload, "/spec/template/spec/containers", []) or [])


def with_env(read: Callable[[ObjectRef], dict[str, Any]], obj: dict[str, Any], container: str | None,
             names: list[str]) -> dict[str, Any]:
    """`obj` (a workload) with what its container's environment holds for `names`, under
    stores.ENV_FIELD, for the env store to read. Unchanged when the container is ambiguous (the
    store names the problem)."""
    chosen = [c for c in _containers(obj) if container in (None, c.get("name"))]
    if len(chosen) != 1:
        return obj
    ns = str(resolve(obj, "/metadata/namespace", "") or "")
    lookup = container_sources(read, chosen, ns, names)
    return {**obj, stores.ENV_FIELD: resolve_env(chosen[0], ns, lookup, names)}


def workload_env(read: Callable[[ObjectRef], dict[str, Any]], workload: Mapping[str, Any],
                 names: list[str]) -> dict[str, dict[str, EnvValue]]:
    """{container name: the variables among `names` it sets} for every container of a workload."""
    ns = str(resolve(workload, "/metadata/namespace", "") or "")
    containers = _containers(workload)
    lookup = container_sources(read, containers, ns, names)
    return {str(c.get("name")): resolve_env(c, ns, lookup, names) for c in containers}
