"""Builds the actuator and the leader elector from settings: the one place that makes clients."""
from __future__ import annotations

from typing import Any

from kubernetes import client as k8s
from kubernetes import config as k8s_config

from agent.k8s.actuator import KubernetesActuator
from agent.k8s.api import KubeApi
from agent.k8s.leader import LeaseElector
from agent.k8s.metrics import ActuationMetrics
from agent.k8s.settings import ActuationSettings


def load_api_client(kubeconfig: str | None = None) -> k8s.ApiClient:
    """`kubeconfig` if given; else in-cluster service-account credentials, or the default
    kubeconfig outside a cluster. Never touches the client's global default configuration."""
    if kubeconfig:
        return k8s_config.new_client_from_config(config_file=kubeconfig)
    try:
        cfg = k8s.Configuration()
        k8s_config.load_incluster_config(client_configuration=cfg)
        return k8s.ApiClient(cfg)
    except k8s_config.ConfigException:
        return k8s_config.new_client_from_config()


def build_elector(api_client: k8s.ApiClient, settings: ActuationSettings, *,
                  metrics: ActuationMetrics | None = None, **kw: Any) -> LeaseElector | None:
    if not settings.lease.enabled:
        return None
    api = KubeApi(api_client, field_manager=settings.field_manager)
    return LeaseElector(api, settings.namespace, settings.lease, settings.identity, metrics=metrics, **kw)


def build_actuator(api_client: k8s.ApiClient, settings: ActuationSettings, *,
                   elector: LeaseElector | None = None, metrics: ActuationMetrics | None = None,
                   **kw: Any) -> KubernetesActuator:
    """The Kubernetes `Actuator`. With an elector, only the leader writes; `kw` passes clock,
    sleep, now, on_mark_good (store the last good record in the study) and load_last_good."""
    api = KubeApi(api_client, field_manager=settings.field_manager)
    return KubernetesActuator(api, settings, metrics=metrics,
                              is_leader=elector.is_leader if elector is not None else None, **kw)
