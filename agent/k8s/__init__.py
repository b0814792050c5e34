"""Kubernetes actuation: apply tuned knobs to vLLM Deployments, LMCache / router / Curvine
ConfigMaps and the HyperPod InferenceEndpointConfig, safely (see docs/deploy.md).

Entry points:
- `build_actuator(api_client, settings)`: the `contracts.actuator.Actuator` for a cluster;
- `LeaseElector`: leader election over a coordination.k8s.io/v1 Lease;
- `ActuationCollector`: the prometheus collector of actuation metrics.
"""
from __future__ import annotations

from agent.k8s.actuator import KubernetesActuator
from agent.k8s.api import KubeApi, ObjectRef
from agent.k8s.leader import LeaseElector
from agent.k8s.metrics import ActuationCollector, ActuationMetrics
from agent.k8s.settings import ActuationConfigError, ActuationSettings, load_settings, settings_from_env
from agent.k8s.wiring import build_actuator

__all__ = [
    "ActuationCollector", "ActuationConfigError", "ActuationMetrics", "ActuationSettings", "KubeApi",
    "KubernetesActuator", "LeaseElector", "ObjectRef", "build_actuator", "load_settings", "settings_from_env",
]
