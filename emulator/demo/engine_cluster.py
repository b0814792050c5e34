"""The real-engine demo's fleets as Kubernetes objects, and the agent configuration that tunes them (pure).

One fleet (`tuned` or `held`) in namespace `llm` is:

- a Deployment per engine, `vllm-<fleet>-<i>` (one replica: engine i is pinned to core i through
  its container's VLLM_CPU_OMP_THREADS_BIND, so the engines are distinct workloads): the vLLM CPU
  container with `--kv-transfer-config` holding the native tiering spec (CPU tier size, offload
  block_size, eviction policy; an fs tier on the fleet's shared L2 directory, a hostPath volume
  mounted at /mnt/l2 in every engine), and the pod annotations the agent discovers it by (its
  /metrics port, its KV-event and replay ports and topic, the model);
- the emulated Curvine master, `curvine-master-<fleet>`, keeping the shared directory under its
  quota, with its cluster TOML in the ConfigMap `curvine-config-<fleet>` (read at start);
- the router, `vllm-router-<fleet>` (vllm-project/router, round-robin over the engines' pod IPs:
  written once the engines' pods have them).

`agent_config` is the `tierpilot run` configuration of one fleet's agent: the demo settings file
(emulator/demo/engine_tuner.yaml) with the fleet's discovery (label selectors in the namespace), the
kubeconfig of the demo's API server, the actuation targets (the engines' Deployments,
`vllm-tiering-args`) and the agent's port. The held fleet's agent observes only (tuner off).
"""
from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import yaml

from contracts.knobs import Knobs
from emulator.engines.engine import EngineSpec, kv_bytes_per_token
from emulator.engines.images import CURVINE_MASTER_IMAGE, ROUTER_IMAGE, deployment, engine_container
from emulator.engines.tiering import TieringConfig

NAMESPACE = "llm"
MODEL = "tiny-llama"
L2_MOUNT = "/mnt/l2"
CURVINE_KEY = "curvine-cluster.toml"
GIB = 1 << 30
ROUTER_HEALTH_CHECK_S = 5  # seconds between the router's health checks of its workers


@dataclasses.dataclass(frozen=True)
class FleetPorts:
    """The ports one fleet's processes listen on (each engine its own, since vLLM binds its KV-event
    PUB and replay sockets on every address)."""

    engines: tuple[tuple[int, int, int], ...]  # (http, kv events, replay) per engine
    router: int
    router_metrics: int
    curvine: int


@dataclasses.dataclass(frozen=True)
class FleetDesign:
    """What one fleet runs: `knobs` gives the tiering (cpu_gib, chunk_tokens, cpu_eviction) and the
    Curvine quota's policy and watermarks; `l2_dir` is the shared fs tier (a host directory)."""

    name: str
    engines: int
    model: Path
    kv_cache_tokens: int
    dtype: str
    knobs: Knobs
    l2_dir: Path
    l2_quota_mib: int
    ports: FleetPorts
    cores: int = 2

    @property
    def app(self) -> str:
        return f"vllm-{self.name}"

    def engine_names(self) -> list[str]:
        return [f"{self.app}-{i}" for i in range(self.engines)]

    @property
    def router(self) -> str:
        return f"vllm-router-{self.name}"

    @property
    def curvine(self) -> str:
        return f"curvine-master-{self.name}"


def tiering_of(knobs: Knobs, l2_root: Path | str) -> TieringConfig:
    """The engine's native tiering for the tuner's knobs (cpu_gib in bytes, as vllm-tiering-args writes it)."""
    return TieringConfig(cpu_bytes=int(knobs.cpu_gib * GIB), chunk_tokens=knobs.chunk_tokens,
                         eviction_policy=knobs.cpu_eviction, fs_root=Path(l2_root))


def engine_spec(d: FleetDesign, i: int) -> EngineSpec:
    http, kv, replay = d.ports.engines[i]
    return EngineSpec(model=d.model, port=http, kv_cache_tokens=d.kv_cache_tokens, kv_events_port=kv,
                      replay_port=replay, topic=f"kv@{d.engine_names()[i]}@{MODEL}", cpu_bind=str(i % d.cores),
                      extra_args=("--enable-prompt-tokens-details",), dtype=d.dtype,
                      tiering=tiering_of(d.knobs, L2_MOUNT))


def engine_deployment(d: FleetDesign, i: int) -> dict[str, Any]:
    spec = engine_spec(d, i)
    container = engine_container(spec)
    container["volumeMounts"] = [{"name": "l2", "mountPath": L2_MOUNT}]
    name = d.engine_names()[i]
    obj = deployment(name, NAMESPACE, [container], labels={"app": d.app, "engine": name},
                     volumes=[{"name": "l2", "hostPath": {"path": str(d.l2_dir)}}])
    obj["spec"]["template"]["metadata"]["annotations"] = {
        "prometheus.io/port": str(spec.port), "tierpilot.io/model": MODEL,
        "tierpilot.io/kv-events-port": str(spec.kv_events_port),
        "tierpilot.io/kv-events-replay-port": str(spec.replay_port), "tierpilot.io/kv-events-topic": spec.topic}
    return obj


def curvine_toml(knobs: Knobs) -> str:
    return (f'[master]\nquota_eviction_policy = "{knobs.l2_eviction}"\n'
            f"quota_eviction_high_rate = {knobs.l2_high_watermark}\nquota_eviction_low_rate = {knobs.l2_low_watermark}\n")


def curvine_objects(d: FleetDesign) -> list[dict[str, Any]]:
    """The Curvine master's ConfigMap and Deployment (its /metrics on the pod IP)."""
    cm_name = f"curvine-config-{d.name}"
    cm = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": cm_name, "namespace": NAMESPACE},
          "data": {CURVINE_KEY: curvine_toml(d.knobs)}}
    container = {"name": "master", "image": CURVINE_MASTER_IMAGE,
                 "args": ["--root", L2_MOUNT, "--capacity-mib", str(d.l2_quota_mib), "--config",
                          f"/etc/curvine/{CURVINE_KEY}", "--host", "$(POD_IP)", "--port", str(d.ports.curvine)],
                 "env": [{"name": "POD_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}}],
                 "ports": [{"name": "web", "containerPort": d.ports.curvine}],
                 "volumeMounts": [{"name": "l2", "mountPath": L2_MOUNT}, {"name": "config", "mountPath": "/etc/curvine"}],
                 "readinessProbe": {"httpGet": {"path": "/metrics", "port": "web"}}}
    dep = deployment(d.curvine, NAMESPACE, [container],
                     volumes=[{"name": "l2", "hostPath": {"path": str(d.l2_dir)}},
                              {"name": "config", "configMap": {"name": cm_name}}])
    return [cm, dep]


def router_deployment(d: FleetDesign, workers: list[str]) -> dict[str, Any]:
    """vllm-router, round-robin over `workers` (the engines' URLs on their pod IPs). A health check
    every 5 s: the router takes a worker whose requests failed (an engine restarting) out of its
    rotation and back only at a health check, every 60 s by default, and answered 503 "no available
    workers" for a minute after a restarted engine was ready."""
    args = ["--host", "$(POD_IP)", "--port", str(d.ports.router), "--worker-urls", *workers,
            "--policy", "round_robin", "--prometheus-host", "$(POD_IP)", "--prometheus-port", str(d.ports.router_metrics),
            "--worker-startup-check-interval", "1", "--health-check-interval-secs", str(ROUTER_HEALTH_CHECK_S),
            "--log-level", "warning"]
    container = {"name": "router", "image": ROUTER_IMAGE, "args": args,
                 "env": [{"name": "POD_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}}],
                 "ports": [{"name": "http", "containerPort": d.ports.router}],
                 "readinessProbe": {"httpGet": {"path": "/health", "port": "http"}}}
    return deployment(d.router, NAMESPACE, [container])


def targets_file(d: FleetDesign) -> dict[str, Any]:
    """The actuator's targets: the CPU tier's knobs in every engine Deployment's --kv-transfer-config.
    A rollout of an engine takes its restart (25-60 s on this machine): the timeout leaves room."""
    return {"namespace": NAMESPACE, "rollout_poll_s": 1,
            "targets": [{"kind": "vllm-tiering-args", "name": n, "container": "vllm"} for n in d.engine_names()]}


def agent_config(d: FleetDesign, base: dict[str, Any], *, kubeconfig: Path, targets: Path, port: int,
                 tuning: bool, seed: int, storage: str) -> dict[str, Any]:
    """`tierpilot run`'s configuration for fleet `d`: `base` (the demo settings file) with the
    fleet's discovery, Kubernetes access and actuation; without `tuning` the agent observes only."""
    cfg = yaml.safe_load(yaml.safe_dump(base))  # a deep copy
    cfg["targets"] = {"kubernetes": {"enabled": True, "namespace": NAMESPACE, "roles": {
        "vllm": {"selector": f"app={d.app}"},
        "router": {"selector": f"app={d.router}", "port": d.ports.router_metrics},
        "curvine-master": {"selector": f"app={d.curvine}", "port": d.ports.curvine}}}}
    cfg["server"] = {"host": "127.0.0.1", "port": port}
    cfg.setdefault("tiers", {})["kv_bytes_per_token"] = kv_bytes_per_token(d.dtype)
    cfg["actuation"] = {"kubeconfig": str(kubeconfig), "targets_file": str(targets), "leader_election": False}
    tuner = cfg.setdefault("tuner", {})
    tuner["enabled"] = tuning
    tuner["storage"] = storage
    tuner["seed"] = seed
    tuner.setdefault("warm_start", {})["seed"] = seed
    tuner.setdefault("limits", {})["pods"] = d.engines
    return cfg


__all__ = [
    "NAMESPACE",
    "FleetDesign",
    "FleetPorts",
    "agent_config",
    "curvine_objects",
    "engine_deployment",
    "engine_spec",
    "router_deployment",
    "targets_file",
    "tiering_of",
]
