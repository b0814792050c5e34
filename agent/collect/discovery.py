"""Where the scrape targets come from: a static list, a YAML file, or Kubernetes pods.

Every source implements `TargetSource.targets() -> tuple[Target, ...]` (cheap, called each
cycle). The Kubernetes source lists pods per role by label selector and then follows a watch in a
background thread, so pod churn shows up without polling the API server every cycle. The API is
reached through the small `PodApi` wrapper, so tests can inject a fake or point the real client at
kmock.

Port and path: `prometheus.io/port`, `prometheus.io/path`, `prometheus.io/scheme` annotations,
else `tierpilot.io/<role>-port` / `-path` (a pod with two endpoints, e.g. vLLM plus an LMCache MP
sidecar), else the role's configured defaults. `prometheus.io/scrape: "false"` skips a pod.
Annotations are untrusted: the host is always the pod's IP, the scheme http or https, the port a
number in 1..65535, the path an absolute path; a pod with a bad one is skipped with a warning.
"""
from __future__ import annotations

import ipaddress
import json
import logging
import re
import threading
from collections.abc import Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, Protocol

import yaml
from pydantic import TypeAdapter, ValidationError
from yarl import URL

from agent.settings import DEFAULT_PORTS, KubernetesSettings, RoleDiscovery, StaticTarget
from contracts.redact import redact_text
from contracts.tier_model import Role, Target

log = logging.getLogger(__name__)


class TargetSource(Protocol):
    def targets(self) -> tuple[Target, ...]: ...


def _to_target(t: StaticTarget) -> Target:
    return Target(url=t.url, role=t.role, pod=t.pod, namespace=t.namespace, node=t.node)


class StaticTargets:
    """A fixed list (from settings, the CLI, or the demo)."""

    def __init__(self, targets: Iterable[Target | StaticTarget]):
        self._targets = tuple(_to_target(t) if isinstance(t, StaticTarget) else t for t in targets)

    def targets(self) -> tuple[Target, ...]:
        return self._targets


_TARGET_LIST = TypeAdapter(list[StaticTarget])


def parse_target_file(text: str, origin: str = "targets file") -> tuple[Target, ...]:
    """`targets: [{url, role, pod, namespace?, node?}, ...]` -> targets; ValueError names the key."""
    try:
        raw = yaml.safe_load(text) or {}
    except yaml.YAMLError as exc:
        raise ValueError(f"{origin}: not valid YAML: {exc}") from exc
    if not isinstance(raw, dict) or set(raw) - {"targets"}:
        raise ValueError(f"{origin}: expected a mapping with one key `targets`")
    try:
        items = _TARGET_LIST.validate_python(raw.get("targets") or [])
    except ValidationError as exc:
        first = exc.errors()[0]
        key = ".".join(str(p) for p in ("targets", *first["loc"]))
        raise ValueError(f"{origin}: key {key!r}: {first['msg']}") from exc
    return tuple(_to_target(t) for t in items)


class FileTargets:
    """Targets from a YAML file, re-read when its modification time changes. A bad edit keeps the
    previous list and records the error in `last_error` (the agent keeps running)."""

    def __init__(self, path: Path | str):
        self.path = Path(path)
        self._mtime: float | None = None
        self._targets: tuple[Target, ...] = ()
        self.last_error: str = ""
        self.targets()

    def targets(self) -> tuple[Target, ...]:
        try:
            mtime = self.path.stat().st_mtime
        except OSError as exc:
            self.last_error = f"{self.path}: {exc.strerror}"
            return self._targets
        if mtime != self._mtime:
            self._mtime = mtime
            try:
                self._targets = parse_target_file(self.path.read_text(), str(self.path))
                self.last_error = ""
            except (ValueError, OSError) as exc:
                self.last_error = redact_text(str(exc))
                log.error("keeping the previous targets: %s", self.last_error)
        return self._targets


class CombinedTargets:
    """Several sources; a URL listed twice is scraped once (first source wins)."""

    def __init__(self, sources: Sequence[TargetSource]):
        self.sources = tuple(sources)

    def targets(self) -> tuple[Target, ...]:
        seen: dict[str, Target] = {}
        for src in self.sources:
            for t in src.targets():
                seen.setdefault(t.url, t)
        return attach_node_clients(tuple(seen.values()))


def attach_node_clients(targets: tuple[Target, ...]) -> tuple[Target, ...]:
    """A per-node Curvine FUSE client whose pod runs no vLLM is credited to the only vLLM pod on
    its node (so its L2 reads can feed that pod's L1/L2 split). Ambiguous nodes are left alone."""
    vllm_pods = {t.pod for t in targets if t.role == "vllm"}
    by_node: dict[str, set[str]] = {}
    for t in targets:
        if t.role == "vllm" and t.node:
            by_node.setdefault(t.node, set()).add(t.pod)
    out = []
    for t in targets:
        if t.role == "curvine-fuse" and t.pod not in vllm_pods and len(by_node.get(t.node, ())) == 1:
            (owner,) = by_node[t.node]
            t = Target(url=t.url, role=t.role, pod=owner, namespace=t.namespace, node=t.node)
        out.append(t)
    return tuple(out)


# -- Kubernetes --------------------------------------------------------------------------------
def pod_target(pod: Mapping[str, Any], role: Role, cfg: RoleDiscovery) -> Target | None:
    """A pod (as a dict, the API's JSON shape) -> its scrape target for `role`, or None when it
    is not running, has no IP yet, or opts out with `prometheus.io/scrape: "false"`."""
    meta = pod.get("metadata") or {}
    status = pod.get("status") or {}
    spec = pod.get("spec") or {}
    ann = meta.get("annotations") or {}
    if meta.get("deletionTimestamp") or status.get("phase") != "Running":
        return None
    ip = status.get("podIP")
    if not ip:
        return None
    if str(ann.get("prometheus.io/scrape", "true")).lower() == "false":
        return None
    default_port, default_path = DEFAULT_PORTS[role]
    port = (ann.get(f"tierpilot.io/{role}-port") or (ann.get("prometheus.io/port") if role == "vllm" else None)
            or cfg.port or default_port)
    path = (ann.get(f"tierpilot.io/{role}-path") or (ann.get("prometheus.io/path") if role == "vllm" else None)
            or cfg.path or default_path)
    scheme = ann.get("prometheus.io/scheme") or cfg.scheme
    try:
        url = endpoint_url(str(ip), scheme, port, path)
    except ValueError as exc:
        log.warning("pod %s/%s not scraped: %s", meta.get("namespace", ""), meta.get("name", ""), exc)
        return None
    return Target(url=url, role=role, pod=meta.get("name", ""),
                  namespace=meta.get("namespace", ""), node=spec.get("nodeName") or "")


_PORT = re.compile(r"[0-9]{1,5}")
_PATH = re.compile(r"/[\x21-\x7e]{0,1023}")  # printable ASCII, no spaces or controls


def endpoint_url(ip: str, scheme: object, port: object, path: object) -> str:
    """The scrape URL of a pod from its IP and (untrusted) annotation values; ValueError names the
    annotation that is wrong. The host is always the pod's own IP: the scheme must be http or
    https, the port a number in 1..65535, the path must start with `/` and hold no `#`, `\\` or
    whitespace, so no annotation can move the request to another host."""
    try:
        addr = ipaddress.ip_address(ip)
    except ValueError:
        raise ValueError("status.podIP is not an IP address") from None
    if scheme not in ("http", "https"):
        raise ValueError("prometheus.io/scheme must be http or https")
    if isinstance(port, int) and not isinstance(port, bool):
        port = str(port)
    if not isinstance(port, str) or not _PORT.fullmatch(port) or not 1 <= int(port) <= 65535:
        raise ValueError("port annotation must be a number in 1..65535")
    if not isinstance(path, str) or not _PATH.fullmatch(path) or "#" in path or "\\" in path \
            or path.startswith("//"):
        raise ValueError("path annotation must start with a single / and hold no #, \\ or whitespace")
    host = f"[{addr}]" if addr.version == 6 else str(addr)
    url = f"{scheme}://{host}:{int(port)}{path}"
    parsed = URL(url)
    if parsed.host != str(addr).lower() or parsed.port != int(port) or parsed.user is not None:
        raise ValueError("annotations do not give a URL on the pod's own IP")
    return url


class PodApi(Protocol):
    """The two calls discovery needs; `KubernetesPodApi` implements them on the real client."""

    def list_pods(self, namespace: str | None, selector: str) -> tuple[list[dict], str]: ...

    def watch_pods(self, namespace: str | None, selector: str, resource_version: str,
                   timeout_s: int) -> Iterator[tuple[str, dict]]: ...


class KubernetesPodApi:
    """`PodApi` over the official `kubernetes` client (CoreV1Api + watch)."""

    def __init__(self, core_v1: Any):
        self.core = core_v1

    def _call(self, namespace: str | None):
        return (self.core.list_namespaced_pod, {"namespace": namespace}) if namespace else (
            self.core.list_pod_for_all_namespaces, {})

    def list_pods(self, namespace: str | None, selector: str) -> tuple[list[dict], str]:
        fn, kw = self._call(namespace)
        resp = fn(label_selector=selector, _preload_content=False, **kw)
        body = json.loads(resp.data)
        return list(body.get("items") or []), (body.get("metadata") or {}).get("resourceVersion") or ""

    def watch_pods(self, namespace: str | None, selector: str, resource_version: str,
                   timeout_s: int) -> Iterator[tuple[str, dict]]:
        from kubernetes import watch

        fn, kw = self._call(namespace)
        w = watch.Watch()
        # the server ends the watch after timeout_s; the client gives up on a silent one a bit later
        kwargs = dict(label_selector=selector, timeout_seconds=timeout_s,
                      _request_timeout=(10, timeout_s * 1.5), **kw)
        if resource_version:
            kwargs["resource_version"] = resource_version
        for event in w.stream(fn, **kwargs):
            obj = event.get("raw_object") or event.get("object")
            if hasattr(obj, "to_dict"):
                obj = self.core.api_client.sanitize_for_serialization(obj)
            yield event["type"], obj


def kubernetes_pod_api(in_cluster: bool | None = None) -> KubernetesPodApi:
    from kubernetes import client, config

    if in_cluster is None:
        try:
            config.load_incluster_config()
        except config.ConfigException:
            config.load_kube_config()
    elif in_cluster:
        config.load_incluster_config()
    else:
        config.load_kube_config()
    return KubernetesPodApi(client.CoreV1Api())


class KubernetesTargets:
    """Pods per role by label selector, kept current by a watch (one thread per role).

    `refresh()` lists once (synchronously); `start()` lists and then watches until `stop()`. A
    failed list or watch is retried after `retry_s`, keeping the last known targets."""

    def __init__(self, api: PodApi, settings: KubernetesSettings, retry_s: float = 2.0):
        self.api = api
        self.settings = settings
        self.retry_s = retry_s
        self._lock = threading.Lock()
        self._by_role: dict[str, dict[str, Target]] = {role: {} for role in settings.roles}
        self._versions: dict[str, str] = {}
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self.errors = 0

    def targets(self) -> tuple[Target, ...]:
        with self._lock:
            return tuple(t for role in self._by_role.values() for t in role.values())

    def refresh(self) -> None:
        for role, cfg in self.settings.roles.items():
            self._list(role, cfg)

    def _list(self, role: str, cfg: RoleDiscovery) -> None:
        pods, version = self.api.list_pods(self.settings.namespace, cfg.selector)
        current = {}
        for pod in pods:
            t = pod_target(pod, role, cfg)  # type: ignore[arg-type]
            if t is not None:
                current[_pod_key(pod)] = t
        with self._lock:
            self._by_role[role] = current
            self._versions[role] = version

    def apply_event(self, role: str, kind: str, pod: dict) -> None:
        """Fold one watch event into the target set (pure state change; used by the watch loop)."""
        cfg = self.settings.roles[role]  # type: ignore[index]
        key = _pod_key(pod)
        version = (pod.get("metadata") or {}).get("resourceVersion")
        with self._lock:
            if version:
                self._versions[role] = version
            labels = (pod.get("metadata") or {}).get("labels") or {}
            if kind == "DELETED" or not selector_matches(labels, cfg.selector):
                self._by_role[role].pop(key, None)
                return
            t = pod_target(pod, role, cfg)  # type: ignore[arg-type]
            if t is None:
                self._by_role[role].pop(key, None)
            else:
                self._by_role[role][key] = t

    def start(self) -> None:
        self._stop.clear()
        for role, cfg in self.settings.roles.items():
            th = threading.Thread(target=self._run, args=(role, cfg), name=f"discovery-{role}", daemon=True)
            th.start()
            self._threads.append(th)

    def stop(self, timeout: float = 5.0) -> None:
        self._stop.set()
        for th in self._threads:
            th.join(timeout)
        self._threads.clear()

    def _run(self, role: str, cfg: RoleDiscovery) -> None:
        listed = False
        while not self._stop.is_set():
            try:
                if not listed:
                    self._list(role, cfg)
                    listed = True
                for kind, pod in self.api.watch_pods(self.settings.namespace, cfg.selector,
                                                     self._versions.get(role, ""),
                                                     self.settings.watch_timeout_s):
                    if self._stop.is_set():
                        return
                    if kind == "ERROR":  # e.g. 410 Gone: the version expired; list again
                        listed = False
                        break
                    self.apply_event(role, kind, pod)
            except Exception as exc:  # noqa: BLE001 - the API may fail in any way; keep going
                self.errors += 1
                listed = False
                log.warning("pod discovery for role %s failed (%s); retrying", role, exc)
                self._stop.wait(self.retry_s)


def selector_matches(labels: Mapping[str, str], selector: str) -> bool:
    """Client-side check of equality-based selectors (`a=b`, `a==b`, `a!=b`, `a`, `!a`), a guard
    for watch streams that do not filter; set-based terms (`in`, `notin`) are left to the server."""
    for term in (t.strip() for t in selector.split(",")):
        if not term or " in " in term or " notin " in term or "(" in term:
            continue
        if "!=" in term:
            k, v = (x.strip() for x in term.split("!=", 1))
            if labels.get(k) == v:
                return False
        elif "=" in term:
            k, v = (x.strip() for x in term.replace("==", "=").split("=", 1))
            if labels.get(k) != v:
                return False
        elif term.startswith("!"):
            if term[1:].strip() in labels:
                return False
        elif term not in labels:
            return False
    return True


def _pod_key(pod: Mapping[str, Any]) -> str:
    meta = pod.get("metadata") or {}
    return f"{meta.get('namespace', '')}/{meta.get('name', '')}"
