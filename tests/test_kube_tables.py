"""`kubectl get` without -o against the emulated API: kmock answers the Table API as
kube-apiserver does (emulator/cluster/kube_tables.py), so the real kubectl prints its columns,
and every object carries the creationTimestamp its AGE is read from."""
from __future__ import annotations

import datetime as dt

import pytest

from emulator.cluster.kube_tables import age, wants_table
from tests.support.kube import NS, kubectl, serve

T0 = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)


@pytest.mark.parametrize(("seconds", "shown"), [
    (0, "0s"), (119, "119s"), (125, "2m5s"), (600, "10m"), (179 * 60, "179m"), (3 * 3600 + 60, "3h1m"),
    (5 * 3600, "5h"), (30 * 3600, "30h"), (3 * 86400 + 4 * 3600, "3d4h"), (3 * 86400, "3d"), (12 * 86400, "12d"),
    (800 * 86400, "2y70d"), (9 * 365 * 86400, "9y"),
])
def test_age_reads_as_kubectl_prints_it(seconds, shown):
    assert age("2026-01-01T00:00:00Z", T0 + dt.timedelta(seconds=seconds)) == shown


def test_age_without_a_timestamp_and_in_the_future():
    assert age(None, T0) == "<unknown>"
    assert age("2026-01-01T00:00:05Z", T0) == "<invalid>"
    assert age("2026-01-01T00:00:01Z", T0) == "0s"  # a second of clock skew reads as now


def test_only_a_table_accept_header_asks_for_a_table():
    assert wants_table("application/json;as=Table;v=v1;g=meta.k8s.io,application/json;as=Table;v=v1beta1;"
                       "g=meta.k8s.io,application/json")
    assert not wants_table("application/json")
    assert not wants_table("")


@pytest.fixture
def kube(shared_dir):
    yield from serve(shared_dir)


def _pod(name: str, *, ready: bool, restarts: int, waiting: str | None, ip: str) -> dict:
    state = {"waiting": {"reason": waiting}} if waiting else {"running": {}}
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": NS, "labels": {"app": "vllm"}},
            "spec": {"containers": [{"name": "vllm", "image": "vllm-cpu"}]},
            "status": {"phase": "Running", "podIP": ip, "containerStatuses": [
                {"name": "vllm", "ready": ready, "restartCount": restarts, "state": state}]}}


def _rows(out: str) -> list[list[str]]:
    return [line.split() for line in out.strip().splitlines()]


def test_kubectl_get_prints_the_columns_of_kube_apiserver(kube):
    kube.emu.wall = lambda: T0.timestamp()
    kube.put(_pod("vllm-0", ready=True, restarts=0, waiting=None, ip="127.0.0.10"))
    kube.put(_pod("vllm-1", ready=False, restarts=2, waiting="CrashLoopBackOff", ip="127.0.0.11"))
    kube.put({"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "vllm", "namespace": NS},
              "spec": {"replicas": 2, "selector": {"matchLabels": {"app": "vllm"}}, "template": {}},
              "status": {"readyReplicas": 1, "updatedReplicas": 2, "availableReplicas": 1}})
    kube.put({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "lmcache", "namespace": NS},
              "data": {"a.yaml": "x", "b.yaml": "y"}})
    kube.emu.wall = lambda: T0.timestamp() + 125
    assert _rows(kubectl(kube, "get", "pods")) == [
        ["NAME", "READY", "STATUS", "RESTARTS", "AGE"],
        ["vllm-0", "1/1", "Running", "0", "2m5s"],
        ["vllm-1", "0/1", "CrashLoopBackOff", "2", "2m5s"]]
    assert _rows(kubectl(kube, "get", "pods", "-o", "wide"))[0] == ["NAME", "READY", "STATUS", "RESTARTS", "AGE", "IP"]
    assert _rows(kubectl(kube, "get", "pods", "-o", "wide"))[2][-1] == "127.0.0.11"
    assert _rows(kubectl(kube, "get", "pod", "vllm-1")) == [
        ["NAME", "READY", "STATUS", "RESTARTS", "AGE"], ["vllm-1", "0/1", "CrashLoopBackOff", "2", "2m5s"]]
    assert _rows(kubectl(kube, "get", "deployments")) == [
        ["NAME", "READY", "UP-TO-DATE", "AVAILABLE", "AGE"], ["vllm", "1/2", "2", "1", "2m5s"]]
    assert _rows(kubectl(kube, "get", "configmaps")) == [["NAME", "DATA", "AGE"], ["lmcache", "2", "2m5s"]]
    assert _rows(kubectl(kube, "get", "pods", "-l", "app=other")) == []  # kubectl says so on stderr
    with pytest.raises(Exception, match="not found"):
        kubectl(kube, "get", "pod", "vllm-9")


def test_an_update_keeps_the_creation_timestamp(kube):
    kube.emu.wall = lambda: T0.timestamp()
    first = kube.put(_pod("vllm-0", ready=False, restarts=0, waiting=None, ip="127.0.0.10"))
    kube.emu.wall = lambda: T0.timestamp() + 60
    again = kube.put(_pod("vllm-0", ready=True, restarts=0, waiting=None, ip="127.0.0.10"))
    assert first["metadata"]["creationTimestamp"] == again["metadata"]["creationTimestamp"] == "2026-01-01T00:00:00Z"
