"""Leader election over a coordination.k8s.io/v1 Lease on the emulator, with a fake clock."""
from __future__ import annotations

import pytest
from prometheus_client import CollectorRegistry

from agent.k8s.api import KubeApi
from agent.k8s.leader import LeaseElector
from agent.k8s.metrics import ActuationCollector, ActuationMetrics
from agent.k8s.settings import LeaseSettings
from contracts.actuator import RetriableActuationError
from contracts.knobs import Knobs
from tests.support.kube import NS, FakeTime, actuator_for, deployment, serve

LEASE = LeaseSettings(name="tierpilot-leader", duration_s=15, renew_deadline_s=10, retry_period_s=2)


@pytest.fixture
def kube(shared_dir):
    yield from serve(shared_dir)


def _elector(kube, identity, fake, metrics=None):
    return LeaseElector(KubeApi(kube.api_client()), NS, LEASE, identity, clock=fake.clock, now=fake.now,
                        metrics=metrics)


def test_standby_takes_over_when_the_leader_stops_renewing(kube):
    fake = FakeTime()
    metrics = ActuationMetrics()
    a, b = _elector(kube, "agent-a", fake, metrics), _elector(kube, "agent-b", fake, metrics)

    assert a.try_acquire_or_renew() is True
    assert b.try_acquire_or_renew() is False and b.holder == "agent-a"
    lease = kube.get("Lease", NS, "tierpilot-leader")
    assert lease["spec"]["holderIdentity"] == "agent-a" and lease["spec"]["leaseTransitions"] == 0

    for _ in range(3):  # a renews every retry period; b keeps seeing a fresh record
        fake.sleep(2)
        assert a.try_acquire_or_renew() and not b.try_acquire_or_renew()
    renew_a = kube.get("Lease", NS, "tierpilot-leader")["spec"]["renewTime"]

    fake.sleep(10)  # a stops renewing (hung, partitioned) ...
    assert not a.is_leader()  # ... and stops acting after renew_deadline_s, before anyone can take over
    assert not b.try_acquire_or_renew()  # 10 s since b observed the last change: not expired yet
    fake.sleep(6)
    assert b.try_acquire_or_renew() is True
    lease = kube.get("Lease", NS, "tierpilot-leader")
    assert lease["spec"]["holderIdentity"] == "agent-b" and lease["spec"]["leaseTransitions"] == 1
    assert lease["spec"]["renewTime"] > renew_a

    assert a.try_acquire_or_renew() is False and a.holder == "agent-b"  # a comes back as a standby

    registry = CollectorRegistry()
    registry.register(ActuationCollector(metrics))
    assert registry.get_sample_value("tierpilot_leader", {"identity": "agent-a"}) == 0
    assert registry.get_sample_value("tierpilot_leader", {"identity": "agent-b"}) == 1
    assert registry.get_sample_value("tierpilot_leader_acquired_total", {"identity": "agent-a"}) == 1


def test_after_a_takeover_the_other_standbys_restart_their_expiry_clock(kube):
    fake = FakeTime()
    a, b, c = (_elector(kube, n, fake) for n in ("agent-a", "agent-b", "agent-c"))
    assert a.try_acquire_or_renew()
    assert not b.try_acquire_or_renew() and not c.try_acquire_or_renew()
    fake.sleep(20)  # a is gone; b and c both consider the record expired
    assert b.try_acquire_or_renew()
    assert not c.try_acquire_or_renew()  # c sees b's new record: a fresh change, not expired
    assert c.holder == "agent-b"
    assert kube.get("Lease", NS, "tierpilot-leader")["spec"]["leaseTransitions"] == 1


def test_stale_write_gets_409_and_stays_standby(kube):
    fake = FakeTime()
    a, b = _elector(kube, "agent-a", fake), _elector(kube, "agent-b", fake)
    assert a.try_acquire_or_renew() and not b.try_acquire_or_renew()
    fake.sleep(20)
    api = KubeApi(kube.api_client())
    original = api.replace_lease

    def racing_replace(ns, name, body):  # a renews between b's read and b's write
        kube.edit("Lease", NS, "tierpilot-leader", lambda o: o["spec"].update(renewTime="2026-11-29T00:00:21.000000Z"))
        return original(ns, name, body)

    b.api.replace_lease = racing_replace
    assert b.try_acquire_or_renew() is False
    assert "409" in b.last_error
    assert kube.get("Lease", NS, "tierpilot-leader")["spec"]["holderIdentity"] == "agent-a"


def test_only_the_leader_actuates_and_release_hands_over(kube):
    kube.put(deployment("vllm", env=[]))
    fake = FakeTime()
    a, b = _elector(kube, "agent-a", fake), _elector(kube, "agent-b", fake)
    act_a = actuator_for(kube, [{"kind": "deployment-env", "name": "vllm"}], fake, is_leader=a.is_leader)
    act_b = actuator_for(kube, [{"kind": "deployment-env", "name": "vllm"}], fake, is_leader=b.is_leader)
    assert a.try_acquire_or_renew() and not b.try_acquire_or_renew()

    with pytest.raises(RetriableActuationError, match="standby"):
        act_b.apply(Knobs(chunk_tokens=512))
    assert kube.requests("PATCH") == []
    assert act_a.apply(Knobs(chunk_tokens=512)).applied

    a.release()  # graceful shutdown: the lease is freed without waiting out its duration
    assert kube.get("Lease", NS, "tierpilot-leader")["spec"]["holderIdentity"] == ""
    assert b.try_acquire_or_renew()
    with pytest.raises(RetriableActuationError, match="standby"):
        act_a.apply(Knobs(chunk_tokens=1024))
    assert act_b.apply(Knobs(chunk_tokens=1024)).applied
