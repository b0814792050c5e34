"""The thin I/O shell over the `kubernetes` client: read, patch, watch, events, leases.

Everything is exchanged as plain JSON dicts (`_preload_content=False`), so Deployments, ConfigMaps
and custom resources go through one code path. Every API error becomes one of the actuator
contract's errors (`contracts/actuator.py`) through the pure `classify_api_error`:

| response                      | error                                                     |
|-------------------------------|-----------------------------------------------------------|
| 409, 422 from a failed `test` | `ConflictError` (re-read and retry within a bound)        |
| 404                           | `TargetGoneError` (stop tuning that target)               |
| 403                           | `PermanentActuationError` naming the RBAC verb + resource |
| 429, 5xx, connection errors   | `RetriableActuationError` (back off)                      |
| 400, 415, other 422           | `PermanentActuationError` (the server refused the object) |

Each method declares the RBAC verb and resource it needs (`@uses`); `agent/k8s/rbac.py` derives
the least-privilege Role from those declarations, and a test compares it with deploy/.
"""
from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

import urllib3
from kubernetes import client as k8s
from kubernetes import watch as k8s_watch
from kubernetes.client.exceptions import ApiException

from agent.k8s.patches import Patch
from contracts.actuator import (
    PermanentActuationError,
    RetriableActuationError,
    TargetGoneError,
)


@dataclasses.dataclass(frozen=True)
class ResourceInfo:
    group: str
    version: str
    plural: str

    @property
    def api_version(self) -> str:
        return f"{self.group}/{self.version}" if self.group else self.version


RESOURCES: dict[str, ResourceInfo] = {
    "Deployment": ResourceInfo("apps", "v1", "deployments"),
    "StatefulSet": ResourceInfo("apps", "v1", "statefulsets"),
    "ConfigMap": ResourceInfo("", "v1", "configmaps"),
    "Secret": ResourceInfo("", "v1", "secrets"),  # read only: envFrom key names, a named valueFrom key
    "InferenceEndpointConfig": ResourceInfo("inference.sagemaker.aws.amazon.com", "v1", "inferenceendpointconfigs"),
    "Lease": ResourceInfo("coordination.k8s.io", "v1", "leases"),
    "Event": ResourceInfo("", "v1", "events"),
    "Pod": ResourceInfo("", "v1", "pods"),
}


@dataclasses.dataclass(frozen=True, order=True)
class ObjectRef:
    kind: str
    namespace: str
    name: str

    def __str__(self) -> str:
        return f"{self.kind} {self.namespace}/{self.name}"

    @property
    def info(self) -> ResourceInfo:
        return RESOURCES[self.kind]


class _ReadTimeout(Exception):
    """An idle watch stream hit its client-side read timeout."""


class ConflictError(RetriableActuationError):
    """409, or a JSON Patch `test` failed (HTTP 422): the object changed since it was read."""


# -- RBAC declarations ------------------------------------------------------------------------

TARGETS = "targets"  # the configured target kinds and names (resourceNames in the Role)

F = TypeVar("F", bound=Callable[..., Any])


@dataclasses.dataclass(frozen=True)
class ApiCall:
    verb: str
    resource: str  # a RESOURCES kind, or TARGETS
    named: bool  # whether the request names the object (so the Role can list resourceNames)


def uses(verb: str, resource: str, *, named: bool = True) -> Callable[[F], F]:
    """Declare the RBAC verb and resource a KubeApi method needs (read by agent/k8s/rbac.py)."""

    def mark(fn: F) -> F:
        fn.__api_call__ = ApiCall(verb, resource, named)  # type: ignore[attr-defined]
        return fn

    return mark


# -- error classification (pure) --------------------------------------------------------------

def _status_message(body: Any) -> str:
    if isinstance(body, (bytes, bytearray)):
        body = body.decode("utf-8", "replace")
    if isinstance(body, str):
        try:
            body = json.loads(body)
        except ValueError:
            return body.strip()[:300]
    if isinstance(body, dict):
        return str(body.get("message") or body.get("reason") or "")[:300]
    return ""


def classify_api_error(status: int, body: Any, *, verb: str, ref: ObjectRef, delay_s: float = 1.0) -> Exception:
    """Map an API response status to the actuator's error types. Pure."""
    msg = _status_message(body)
    what = f"{verb} {ref.info.plural} {ref.namespace}/{ref.name}"
    if status == 409:
        return ConflictError(f"{what}: conflict (409): {msg}", delay_s=0.0)
    if status == 422 and ("test failed" in msg.lower() or "testing value" in msg.lower()):
        return ConflictError(f"{what}: a JSON Patch test failed, the object changed: {msg}", delay_s=0.0)
    if status == 404:
        return TargetGoneError(f"{what}: not found (404); stop tuning this target: {msg}")
    if status == 403:
        group = ref.info.group or '""'
        return PermanentActuationError(
            f"forbidden (403): the service account lacks RBAC verb '{verb}' on resource "
            f"'{ref.info.plural}' (apiGroup {group}) named '{ref.name}' in namespace '{ref.namespace}'; "
            f"add it to the Role (deploy/base/role.yaml). Server said: {msg}"
        )
    if status == 401:
        return PermanentActuationError(f"{what}: unauthorized (401): check the service account token: {msg}")
    if status == 429 or status >= 500 or status == 0:
        return RetriableActuationError(f"{what}: server error ({status}), backing off {delay_s:g}s: {msg}",
                                       delay_s=delay_s)
    return PermanentActuationError(f"{what}: refused by the server ({status}): {msg}")


# -- the client shell -------------------------------------------------------------------------

class KubeApi:
    """One thin wrapper over the injected `kubernetes.client.ApiClient`."""

    def __init__(self, api_client: k8s.ApiClient, *, field_manager: str = "tierpilot",
                 request_timeout: tuple[float, float] = (5.0, 30.0)) -> None:
        self.api_client = api_client
        self.core = k8s.CoreV1Api(api_client)
        self.apps = k8s.AppsV1Api(api_client)
        self.custom = k8s.CustomObjectsApi(api_client)
        self.coordination = k8s.CoordinationV1Api(api_client)
        self.field_manager = field_manager
        self.request_timeout = request_timeout

    # -- helpers --
    def _call(self, verb: str, ref: ObjectRef, fn: Callable[[], Any], delay_s: float = 1.0) -> Any:
        try:
            return fn()
        except ApiException as exc:
            raise classify_api_error(exc.status or 0, exc.body or exc.reason, verb=verb, ref=ref,
                                     delay_s=delay_s) from None
        except urllib3.exceptions.ReadTimeoutError as exc:
            if verb == "watch":
                raise _ReadTimeout(str(exc)) from None
            raise RetriableActuationError(f"{verb} {ref}: API server timed out: {exc}", delay_s=delay_s) from None
        except (urllib3.exceptions.HTTPError, OSError) as exc:
            raise RetriableActuationError(f"{verb} {ref}: API server unreachable: {exc}", delay_s=delay_s) from None

    @staticmethod
    def _json(resp: Any) -> dict[str, Any]:
        try:
            return json.loads(resp.data)
        finally:
            resp.release_conn()

    # -- targets --
    @uses("get", TARGETS)
    def read(self, ref: ObjectRef) -> dict[str, Any]:
        kw = {"_preload_content": False, "_request_timeout": self.request_timeout}
        calls: dict[str, Callable[[], Any]] = {
            "Deployment": lambda: self.apps.read_namespaced_deployment(ref.name, ref.namespace, **kw),
            "StatefulSet": lambda: self.apps.read_namespaced_stateful_set(ref.name, ref.namespace, **kw),
            "ConfigMap": lambda: self.core.read_namespaced_config_map(ref.name, ref.namespace, **kw),
            "Secret": lambda: self.core.read_namespaced_secret(ref.name, ref.namespace, **kw),
        }
        fn = calls.get(ref.kind) or (lambda: self.custom.get_namespaced_custom_object(
            ref.info.group, ref.info.version, ref.namespace, ref.info.plural, ref.name, **kw))
        return self._json(self._call("get", ref, fn))

    @uses("patch", TARGETS)
    def patch(self, ref: ObjectRef, patch: Patch, *, dry_run: bool = False, delay_s: float = 1.0) -> dict[str, Any]:
        """The one function that sends a patch. Server-side dry-run when `dry_run`."""
        kw: dict[str, Any] = {
            "_preload_content": False, "_request_timeout": self.request_timeout, "_content_type": patch.content_type,
            "field_manager": self.field_manager, "dry_run": "All" if dry_run else None,
        }
        body = patch.body
        calls: dict[str, Callable[[], Any]] = {
            "Deployment": lambda: self.apps.patch_namespaced_deployment(ref.name, ref.namespace, body, **kw),
            "StatefulSet": lambda: self.apps.patch_namespaced_stateful_set(ref.name, ref.namespace, body, **kw),
            "ConfigMap": lambda: self.core.patch_namespaced_config_map(ref.name, ref.namespace, body, **kw),
        }
        fn = calls.get(ref.kind) or (lambda: self.custom.patch_namespaced_custom_object(
            ref.info.group, ref.info.version, ref.namespace, ref.info.plural, ref.name, body, **kw))
        return self._json(self._call("patch", ref, fn, delay_s=delay_s))

    @uses("watch", TARGETS)
    def watch(self, ref: ObjectRef, *, timeout_s: int, read_timeout_s: float | None = None
              ) -> Iterator[tuple[str, dict[str, Any]]]:
        """Events (type, object) for one object, by a metadata.name field selector (so the Role can
        restrict watch to resourceNames). Ends after `timeout_s`; errors raise the contract's types."""
        w = k8s_watch.Watch()
        kw: dict[str, Any] = {"field_selector": f"metadata.name={ref.name}", "timeout_seconds": timeout_s,
                                  "_request_timeout": (self.request_timeout[0],
                                                    read_timeout_s or timeout_s + min(5.0, 0.5 * timeout_s))}
        lists: dict[str, tuple[Callable[..., Any], tuple[Any, ...]]] = {
            "Deployment": (self.apps.list_namespaced_deployment, (ref.namespace,)),
            "StatefulSet": (self.apps.list_namespaced_stateful_set, (ref.namespace,)),
            "ConfigMap": (self.core.list_namespaced_config_map, (ref.namespace,)),
        }
        fn, args = lists.get(ref.kind) or (self.custom.list_namespaced_custom_object,
                                           (ref.info.group, ref.info.version, ref.namespace, ref.info.plural))
        # deserialize stays on: with deserialize=False the client (v37) raises KeyError on ERROR events.
        stream = self._call("watch", ref, lambda: w.stream(fn, *args, **kw))
        try:
            while True:
                try:
                    event = self._call("watch", ref, lambda: next(stream, None))
                except _ReadTimeout:
                    return  # an idle watch ran out its read timeout: a normal end

                if event is None:
                    return
                obj = event.get("raw_object") or {}
                if obj.get("metadata", {}).get("name") == ref.name:
                    yield event["type"], obj
        finally:
            w.stop()

    # -- pods, events, leases --
    @uses("list", "Pod", named=False)
    def list_pod_names(self, namespace: str, selector: str) -> list[str]:
        ref = ObjectRef("Pod", namespace, "*")
        resp = self._call("list", ref, lambda: self.core.list_namespaced_pod(
            namespace, label_selector=selector, _preload_content=False, _request_timeout=self.request_timeout))
        return sorted(p["metadata"]["name"] for p in self._json(resp).get("items", []))

    @uses("create", "Event", named=False)
    def create_event(self, namespace: str, body: dict[str, Any]) -> dict[str, Any]:
        ref = ObjectRef("Event", namespace, body.get("metadata", {}).get("generateName", "event"))
        return self._json(self._call("create", ref, lambda: self.core.create_namespaced_event(
            namespace, body, _preload_content=False, _request_timeout=self.request_timeout)))

    @uses("get", "Lease")
    def read_lease(self, namespace: str, name: str) -> dict[str, Any]:
        ref = ObjectRef("Lease", namespace, name)
        return self._json(self._call("get", ref, lambda: self.coordination.read_namespaced_lease(
            name, namespace, _preload_content=False, _request_timeout=self.request_timeout)))

    @uses("create", "Lease", named=False)
    def create_lease(self, namespace: str, body: dict[str, Any]) -> dict[str, Any]:
        ref = ObjectRef("Lease", namespace, body["metadata"]["name"])
        return self._json(self._call("create", ref, lambda: self.coordination.create_namespaced_lease(
            namespace, body, _preload_content=False, _request_timeout=self.request_timeout)))

    @uses("update", "Lease")
    def replace_lease(self, namespace: str, name: str, body: dict[str, Any]) -> dict[str, Any]:
        """PUT with metadata.resourceVersion: 409 when another candidate wrote first."""
        ref = ObjectRef("Lease", namespace, name)
        return self._json(self._call("update", ref, lambda: self.coordination.replace_namespaced_lease(
            name, namespace, body, _preload_content=False, _request_timeout=self.request_timeout)))
