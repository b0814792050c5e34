"""Kubernetes for tests: the product's faithful kmock API (emulator/cluster/kube_api.py, served by
emulator/cluster/kube_server.py) with the HyperPod CRD's schema, objects and fake time for the
actuator tests.
"""
from __future__ import annotations

import base64
import dataclasses
import functools
import os
import subprocess
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import jsonschema
import yaml

from emulator.cluster.kube_api import (  # noqa: F401 - the tests import them from here
    KIND_RESOURCES,
    WORKLOADS,
    FaithfulEmulator,
    Fault,
    KubectlPatchError,
    kubectl_patch_local,
    kubectl_path,
)
from emulator.cluster.kube_server import KubeServer


def crd_validator(crd_path: Path, version: str = "v1") -> jsonschema.protocols.Validator:
    crd = yaml.safe_load(crd_path.read_text())
    schema = next(v["schema"]["openAPIV3Schema"] for v in crd["spec"]["versions"] if v["name"] == version)
    cls = jsonschema.validators.validator_for(schema, default=jsonschema.Draft7Validator)
    return cls(schema)


@functools.lru_cache(maxsize=4)
def iec_validator(shared_dir: Path) -> jsonschema.protocols.Validator:
    """The v1 schema validator of the HyperPod CRD (parsed once per session: the file is 7,700 lines)."""
    return crd_validator(shared_dir / "reference" / "crds" / "inferenceendpointconfigs.crd.yaml")


def serve(shared_dir: Path) -> Iterator[KubeServer]:
    """Generator body for fixtures: a started server, stopped afterwards."""
    server = KubeServer(schemas={"inferenceendpointconfigs": iec_validator(shared_dir)}).start()
    try:
        yield server
    finally:
        server.stop()


# -- objects and time for actuator tests --------------------------------------------------------

NS = "llm"


def deployment(name: str, *, env: list[dict[str, Any]] | None = None, replicas: int = 2, kind: str = "Deployment",
               annotations: dict[str, str] | None = None, container: str = "vllm") -> dict[str, Any]:
    """A rolled-out workload (status caught up), like a healthy vLLM Deployment."""
    template: dict[str, Any] = {"metadata": {"labels": {"app": name}},
                                "spec": {"containers": [{"name": container, "image": "vllm/vllm-openai:v0.33.0"}]}}
    if env is not None:
        template["spec"]["containers"][0]["env"] = env
    if annotations:
        template["metadata"]["annotations"] = dict(annotations)
    return {"apiVersion": "apps/v1", "kind": kind,
            "metadata": {"name": name, "namespace": NS, "generation": 1},
            "spec": {"replicas": replicas, "selector": {"matchLabels": {"app": name}}, "template": template},
            "status": {"observedGeneration": 1, "replicas": replicas, "updatedReplicas": replicas,
                       "availableReplicas": replicas, "readyReplicas": replicas}}


def configmap(name: str, data: dict[str, str]) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name, "namespace": NS}, "data": dict(data)}


def secret(name: str, data: dict[str, str]) -> dict[str, Any]:
    """A Secret with `data` base64-encoded, as the API stores it."""
    return {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": name, "namespace": NS}, "type": "Opaque",
            "data": {k: base64.b64encode(v.encode()).decode() for k, v in data.items()}}


def kubectl(server: KubeServer, *args: str) -> str:
    """The real kubectl's stdout against `server` (namespace NS); a failure raises with its stderr."""
    with tempfile.TemporaryDirectory() as tmp:
        config = server.write_kubeconfig(Path(tmp) / "kubeconfig", namespace=NS)
        proc = subprocess.run([kubectl_path(), *args], capture_output=True, text=True, timeout=60, check=False,
                              env={**os.environ, "KUBECONFIG": str(config)})
    if proc.returncode != 0:
        raise KubectlPatchError(f"kubectl {' '.join(args)}: {proc.stderr.strip()}")
    return proc.stdout


def pod(name: str, app: str) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": NS, "labels": {"app": app}},
            "spec": {"containers": [{"name": "c", "image": "i"}]}}


def iec_sample(shared_dir: Path, which: str = "intelligent_routing") -> dict[str, Any]:
    """A reference sample InferenceEndpointConfig, rolled out, in namespace NS."""
    obj = yaml.safe_load((shared_dir / "reference" / "crds" / f"sample_llama31_8b_{which}.yaml").read_text())
    fills = {"tlsCertificateOutputS3Uri": "s3://tls-certs-bucket/certs", "bucketName": "model-bucket",
             "l2CacheLocalUrl": "redis://redis.llm.svc.cluster.local:6379"}

    def fill(node: Any) -> None:  # the samples carry <PLACEHOLDER_...> values the schema rejects
        if isinstance(node, dict):
            for k, v in node.items():
                if isinstance(v, str) and v.startswith("<PLACEHOLDER"):
                    node[k] = fills[k]
                else:
                    fill(v)
        elif isinstance(node, list):
            for v in node:
                fill(v)

    fill(obj)
    obj["metadata"]["namespace"] = NS
    obj["metadata"]["generation"] = 1
    obj["status"] = {"observedGeneration": 1, "state": "DeploymentComplete"}
    return obj


@dataclasses.dataclass
class FakeTime:
    """An injected monotonic clock and sleep: sleeping advances time; hooks run on each sleep."""

    t: float = 1000.0
    slept: list[float] = dataclasses.field(default_factory=list)
    on_sleep: list[Callable[[float], None]] = dataclasses.field(default_factory=list)

    def clock(self) -> float:
        return self.t

    def sleep(self, seconds: float) -> None:
        self.slept.append(seconds)
        self.t += seconds
        for hook in list(self.on_sleep):
            hook(self.t)

    def now(self) -> Any:
        import datetime

        return datetime.datetime(2026, 11, 29, tzinfo=datetime.UTC) + datetime.timedelta(seconds=self.t)


def actuator_for(server: KubeServer, targets: list[dict[str, Any]], fake: FakeTime, *,
                 is_leader: Callable[[], bool] | None = None, **overrides: Any) -> Any:
    """A KubernetesActuator on the emulator with fake time (rollouts polled every 1 s, 30 s timeout)."""
    from agent.k8s.actuator import KubernetesActuator
    from agent.k8s.api import KubeApi
    from agent.k8s.settings import settings_from_mapping

    settings = settings_from_mapping({"namespace": NS, "identity": "tierpilot-0", "targets": targets,
                                      "rollout_timeout_s": 30, "rollout_poll_s": 1, **overrides})
    return KubernetesActuator(KubeApi(server.api_client()), settings, clock=fake.clock, sleep=fake.sleep,
                              now=fake.now, on_progress=lambda msg: None, is_leader=is_leader)
