"""A pod's container spec turned into the command line and environment the kubelet would give it (pure).

What the kubelet does, and this follows (kubernetes.io: "Define a command and arguments",
"Define dependent environment variables", "Configure a Pod to use a ConfigMap"):

- the argv is `command` (else the image's ENTRYPOINT) followed by `args`; `$(VAR)` in either is
  replaced by the container's variable VAR when it is defined, `$$(VAR)` stays the literal
  `$(VAR)`, an undefined `$(VAR)` is kept as written;
- the environment is the image's, then every `envFrom` ConfigMap (with its `prefix`), then `env`
  in order (a later entry wins); `env` values expand `$(VAR)` of entries defined before them;
  `valueFrom` reads a ConfigMap key (`configMapKeyRef`, `optional`) or the pod itself (`fieldRef`:
  metadata.name, metadata.namespace, status.podIP, metadata.labels['k'], metadata.annotations['k']).
  Secrets are not served here: a `secretKeyRef` is refused in one line;
- volumes: a `configMap` volume is the ConfigMap's keys as files, a `hostPath` the host directory,
  an `emptyDir` a fresh directory of the pod. Processes here share the host's filesystem, so a
  container path under a `volumeMount`'s `mountPath` is rewritten to the host directory behind it,
  in the argv and the environment (what the mount namespace does for a real container);
- readiness: `readinessProbe.httpGet` (path, port by number or by the container port's name,
  host the pod IP).

Nothing else of the pod reaches the process: labels and annotations (unless a `fieldRef` asks for
them), or a variable the program does not read, change nothing in what it runs.
"""
from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


class PodSpecError(ValueError):
    """A container spec the kubelet here cannot run (one-line message)."""


@dataclass(frozen=True)
class Image:
    """What the container runtime knows of an image: its ENTRYPOINT and its environment."""

    entrypoint: tuple[str, ...]
    env: tuple[tuple[str, str], ...] = ()


@dataclass(frozen=True)
class PodCommand:
    """One container as it is started: argv, environment, readiness URL (None: ready when running)."""

    argv: tuple[str, ...]
    env: Mapping[str, str]
    ready_url: str | None = None
    mounts: Mapping[str, Path] = field(default_factory=dict)  # mountPath -> host directory

    @property
    def port(self) -> int:  # for the process shell's messages
        match = re.search(r":(\d+)", self.ready_url or "")
        return int(match.group(1)) if match else 0


VAR = re.compile(r"\$\$|\$\(([A-Za-z_][A-Za-z0-9_.-]*)\)")


def expand(text: str, env: Mapping[str, str]) -> str:
    """The kubelet's `$(VAR)` expansion of `text` against `env`."""
    def one(m: re.Match[str]) -> str:
        if m.group(0) == "$$":
            return "$"
        name = m.group(1)
        return env[name] if name in env else m.group(0)
    return VAR.sub(one, text)


def template_hash(template: Mapping[str, Any]) -> str:
    """A digest of a pod template (the Deployment controller's pod-template-hash plays this part)."""
    text = json.dumps(template, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()[:10]


@dataclass(frozen=True)
class PodInfo:
    """What the downward API may read of the pod."""

    name: str
    namespace: str
    ip: str
    labels: Mapping[str, str] = field(default_factory=dict)
    annotations: Mapping[str, str] = field(default_factory=dict)


FIELD = re.compile(r"metadata\.(labels|annotations)\['([^']+)'\]")


def field_value(path: str, pod: PodInfo) -> str:
    simple = {"metadata.name": pod.name, "metadata.namespace": pod.namespace, "status.podIP": pod.ip}
    if path in simple:
        return simple[path]
    match = FIELD.fullmatch(path)
    if match:
        source = pod.labels if match.group(1) == "labels" else pod.annotations
        return source.get(match.group(2), "")
    raise PodSpecError(f"fieldRef {path!r}: supported: {', '.join(simple)}, metadata.labels['k'], "
                       "metadata.annotations['k']")


def _configmap_key(ref: Mapping[str, Any], configmaps: Mapping[str, Mapping[str, str]]) -> str | None:
    data = configmaps.get(ref.get("name", ""))
    if data is None or ref.get("key") not in data:
        if ref.get("optional"):
            return None
        raise PodSpecError(f"configMapKeyRef {ref.get('name')}/{ref.get('key')}: no such ConfigMap key "
                           "(the kubelet would not start the container)")
    return data[ref["key"]]


def container_env(container: Mapping[str, Any], pod: PodInfo, configmaps: Mapping[str, Mapping[str, str]],
                  image: Image) -> dict[str, str]:
    """The container's environment as the kubelet composes it (see the module's text)."""
    env = dict(image.env)
    for source in container.get("envFrom") or []:
        if "secretRef" in source:
            raise PodSpecError("envFrom secretRef: Secrets are not served by this kubelet")
        ref = source.get("configMapRef") or {}
        data = configmaps.get(ref.get("name", ""))
        if data is None:
            if ref.get("optional"):
                continue
            raise PodSpecError(f"envFrom configMapRef {ref.get('name')!r}: no such ConfigMap")
        env.update({source.get("prefix", "") + k: v for k, v in data.items()})
    for entry in container.get("env") or []:
        name = entry["name"]
        if "value" in entry or "valueFrom" not in entry:
            env[name] = expand(str(entry.get("value", "")), env)
            continue
        src = entry["valueFrom"]
        if "fieldRef" in src:
            env[name] = field_value(src["fieldRef"]["fieldPath"], pod)
        elif "configMapKeyRef" in src:
            value = _configmap_key(src["configMapKeyRef"], configmaps)
            if value is not None:
                env[name] = value
        else:
            raise PodSpecError(f"env {name}: valueFrom {', '.join(src)} is not served by this kubelet")
    return env


def volume_dirs(pod_spec: Mapping[str, Any], pod_dir: Path) -> dict[str, Path]:
    """Each volume's host directory: configMap and emptyDir under `pod_dir`, hostPath its path."""
    out: dict[str, Path] = {}
    for vol in pod_spec.get("volumes") or []:
        if "hostPath" in vol:
            out[vol["name"]] = Path(vol["hostPath"]["path"])
        elif "configMap" in vol or "emptyDir" in vol:
            out[vol["name"]] = pod_dir / "volumes" / vol["name"]
        else:
            raise PodSpecError(f"volume {vol['name']}: only configMap, hostPath and emptyDir are served here")
    return out


def container_mounts(container: Mapping[str, Any], volumes: Mapping[str, Path]) -> dict[str, Path]:
    out: dict[str, Path] = {}
    for m in container.get("volumeMounts") or []:
        if m["name"] not in volumes:
            raise PodSpecError(f"volumeMount {m['name']!r}: no such volume in the pod")
        host = volumes[m["name"]]
        out[m["mountPath"].rstrip("/") or "/"] = host / m["subPath"] if m.get("subPath") else host
    return out


def translate(text: str, mounts: Mapping[str, Path]) -> str:
    """`text` with every container path under a mountPath rewritten to its host path."""
    for mount in sorted(mounts, key=len, reverse=True):
        text = re.sub(rf"(?<![\w./-]){re.escape(mount)}(?=/|$|[^\w.-])", str(mounts[mount]).replace("\\", r"\\"),
                      text)
    return text


def ready_url(container: Mapping[str, Any], pod_ip: str) -> str | None:
    probe = (container.get("readinessProbe") or {}).get("httpGet")
    if not probe:
        return None
    port = probe.get("port")
    if isinstance(port, str) and not port.isdigit():
        named = {p.get("name"): p["containerPort"] for p in container.get("ports") or []}
        if port not in named:
            raise PodSpecError(f"readinessProbe port {port!r}: no container port of that name")
        port = named[port]
    return f"http://{probe.get('host', pod_ip)}:{port}{probe.get('path', '/')}"


def pod_command(template: Mapping[str, Any], container_name: str | None, pod: PodInfo,
                configmaps: Mapping[str, Mapping[str, str]], images: Mapping[str, Image], pod_dir: Path) -> PodCommand:
    """How the kubelet would start the container `container_name` (None: the first) of `template`."""
    spec = template.get("spec") or {}
    containers = spec.get("containers") or []
    chosen = [c for c in containers if container_name is None or c.get("name") == container_name]
    if not chosen:
        raise PodSpecError(f"pod {pod.name}: no container {container_name!r}")
    c = chosen[0]
    image = images.get(c.get("image", ""))
    if image is None and not c.get("command"):
        raise PodSpecError(f"image {c.get('image')!r}: unknown to this kubelet and the container gives no command")
    image = image or Image(())
    env = container_env(c, pod, configmaps, image)
    mounts = container_mounts(c, volume_dirs(spec, pod_dir))
    head = [expand(a, env) for a in c["command"]] if c.get("command") else list(image.entrypoint)
    argv = tuple(translate(a, mounts) for a in head + [expand(str(a), env) for a in c.get("args") or []])
    env = {k: translate(v, mounts) for k, v in env.items()}
    return PodCommand(argv=argv, env=env, ready_url=ready_url(c, pod.ip), mounts=mounts)


__all__ = ["Image", "PodCommand", "PodInfo", "PodSpecError", "container_env", "expand", "pod_command",
           "template_hash", "translate", "volume_dirs"]
