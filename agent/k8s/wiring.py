"""Builds the actuator and the leader elector from settings: the one place that makes clients."""
from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import yaml
from kubernetes import client as k8s
from kubernetes import config as k8s_config

from agent.k8s.actuator import KubernetesActuator
from agent.k8s.api import KubeApi
from agent.k8s.leader import LeaseElector
from agent.k8s.metrics import ActuationMetrics
from agent.k8s.settings import ActuationSettings


class KubeconfigError(ValueError):
    """No usable cluster credentials: one line naming the file and what is wrong with it."""


CLI_HINT = "pass --kubeconfig or set KUBECONFIG"


def load_api_client(kubeconfig: str | None = None, *, context: str | None = None,
                    hint: str = CLI_HINT) -> k8s.ApiClient:
    """`kubeconfig` if given; else in-cluster service-account credentials, or the default
    kubeconfig outside a cluster. `context`: that kubeconfig context instead of its
    current-context (a kubeconfig is then read even inside a cluster). Never touches the client's
    global default configuration. Raises KubeconfigError (one line) when none of them is usable;
    `hint` says how the caller's user gives credentials (a CLI option, a settings key)."""
    if kubeconfig or context:
        return _from_file(kubeconfig, context, hint)
    try:
        cfg = k8s.Configuration()
        k8s_config.load_incluster_config(client_configuration=cfg)
        return k8s.ApiClient(cfg)
    except k8s_config.ConfigException:
        return _from_file(None, hint=hint)


def _from_file(path: str | None, context: str | None = None, hint: str = CLI_HINT) -> k8s.ApiClient:
    where = path or os.environ.get("KUBECONFIG") or "~/.kube/config"
    if path is not None and not Path(path).expanduser().is_file():
        raise KubeconfigError(f"kubeconfig {path}: no such file ({hint})")
    if path is None and not any(Path(p).expanduser().is_file() for p in where.split(os.pathsep) if p):
        raise KubeconfigError(f"no Kubernetes credentials: not in a cluster, and no kubeconfig at {where} "
                              f"({hint})")
    try:
        return k8s_config.new_client_from_config(config_file=path, context=context)
    except (k8s_config.ConfigException, yaml.YAMLError, OSError, TypeError, AttributeError,
            KeyError, ValueError) as exc:
        first = " ".join(str(exc).split()) or type(exc).__name__
        raise KubeconfigError(f"kubeconfig {where}: {first[:300]}") from None


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
