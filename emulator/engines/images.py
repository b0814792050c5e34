"""The container images the project's kubelet (kubelet.py) can run here, and the vLLM container of a
Deployment written from an `EngineSpec` (pure).

An image is its ENTRYPOINT and its environment: `vllm-cpu` is the engine venv's vLLM CLI, offline,
with the repository on PYTHONPATH (the CPU worker of the tiering spec, as an image would carry it)
and caches in a scratch directory; `vllm-router` the router binary, `curvine-master` the emulated Curvine master
(emulator/cluster/curvine_master.py; `--config` reads Curvine's cluster TOML at start). `engine_container(spec)` is the
container a Deployment of that engine carries: the engine's own flags (engine.py's command line)
as `args`, listening on `$(POD_IP)`, its CPU tier's region named after `$(POD_NAME)`, the thread
binding as an env var, and a readiness probe on `/health`.

    Kubelet(apps, core, "llm", scratch, images(scratch), ProcessRuntime(scratch / "logs"))
"""
from __future__ import annotations

import os
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from emulator.engines.engine import REPO, EngineSpec, engine_command, engine_python
from emulator.engines.podspec import Image
from emulator.engines.router import router_binary

ENGINE_IMAGE = "vllm-cpu"
ROUTER_IMAGE = "vllm-router"
CURVINE_MASTER_IMAGE = "curvine-master"
DROPPED = ("VLLM_CPU_KVCACHE_SPACE", "PYTHONPATH")  # the first would override --kv-cache-memory-bytes


def engine_image(scratch: Path, venv: Path | None = None, base: Mapping[str, str] | None = None) -> Image:
    env = {k: v for k, v in (os.environ if base is None else base).items()
           if k not in DROPPED and not k.startswith("VIRTUAL_ENV")}
    env.update({"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "VLLM_NO_USAGE_STATS": "1", "DO_NOT_TRACK": "1",
                "VLLM_CACHE_ROOT": str(scratch / "vllm-cache"), "TORCHINDUCTOR_CACHE_DIR": str(scratch / "inductor"),
                "TMPDIR": str(scratch / "tmp"), "HF_HOME": str(scratch / "hf"),
                "VLLM_LOGGING_LEVEL": env.get("VLLM_LOGGING_LEVEL", "WARNING"),
                "PYTHONHASHSEED": env.get("PYTHONHASHSEED", "0"), "PYTHONPATH": str(REPO)})
    for sub in ("vllm-cache", "inductor", "tmp", "hf"):
        (scratch / sub).mkdir(parents=True, exist_ok=True)
    return Image((str(engine_python(venv)), "-m", "vllm.entrypoints.cli.main"), tuple(sorted(env.items())))


def images(scratch: Path, venv: Path | None = None) -> dict[str, Image]:
    """Every image this kubelet knows (the router's only where its binary is installed)."""
    out = {ENGINE_IMAGE: engine_image(scratch / "engine", venv)}
    out[CURVINE_MASTER_IMAGE] = Image((sys.executable, "-m", "emulator.cluster.curvine_master"),
                                      (("PATH", os.environ.get("PATH", "")), ("PYTHONPATH", str(REPO))))
    binary = router_binary()
    if binary:
        out[ROUTER_IMAGE] = Image((binary,), (("PATH", os.environ.get("PATH", "")),))
    return out


def engine_container(spec: EngineSpec, name: str = "vllm") -> dict[str, Any]:
    """The container of a Deployment running `spec` (its host and CPU-tier id from the pod)."""
    argv = engine_command(spec, Path("python"), "$(POD_NAME)" if spec.tiering is not None else None)
    args = argv[3:]  # after `python -m vllm.entrypoints.cli.main`: serve MODEL --host ...
    args[args.index("--host") + 1] = "$(POD_IP)"
    env: list[dict[str, Any]] = [{"name": "POD_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}},
                                 {"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}}]
    if spec.cpu_bind is not None:
        env.append({"name": "VLLM_CPU_OMP_THREADS_BIND", "value": spec.cpu_bind})
    env += [{"name": k, "value": v} for k, v in spec.extra_env]
    return {"name": name, "image": ENGINE_IMAGE, "args": args, "env": env,
            "ports": [{"name": "http", "containerPort": spec.port}],
            "readinessProbe": {"httpGet": {"path": "/health", "port": "http"}}}


def deployment(name: str, namespace: str, containers: list[dict[str, Any]], *, replicas: int = 1,
               labels: Mapping[str, str] | None = None, volumes: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    labels = dict(labels or {"app": name})
    spec: dict[str, Any] = {"containers": containers}
    if volumes:
        spec["volumes"] = volumes
    return {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": name, "namespace": namespace},
            "spec": {"replicas": replicas, "selector": {"matchLabels": labels},
                     "template": {"metadata": {"labels": labels}, "spec": spec}}}


__all__ = ["CURVINE_MASTER_IMAGE", "ENGINE_IMAGE", "ROUTER_IMAGE", "deployment", "engine_container", "engine_image", "images"]
