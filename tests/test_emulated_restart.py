"""Restart semantics of the emulated pods and the local actuator's rollout rules."""
from __future__ import annotations

import socket
import urllib.request
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from contracts.actuator import Actuator, PermanentActuationError
from contracts.knobs import DEFAULT_KNOBS, Knobs
from emulator.cluster.fleet import ClusterSpec, EmulatedCluster
from emulator.cluster.local_actuator import LocalActuator, restart_plan
from emulator.cluster.pod_metrics import RequestOutcome

OUTCOME = RequestOutcome(prompt_tokens=1024, gpu_hit_tokens=256, cpu_hit_tokens=0, l2_hit_tokens=512,
                         output_tokens=5, ttft_s=0.2)


class FakeClock:
    def __init__(self) -> None:
        self.now = 1_795_000_000.0

    def __call__(self) -> float:
        return self.now


def _scrape(url: str) -> dict[tuple[str, str], float]:
    with urllib.request.urlopen(url, timeout=5) as resp:
        text = resp.read().decode()
    out = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            out[(s.name, s.labels.get("engine", ""))] = s.value
    return out


def _refused(port: int) -> bool:
    with socket.socket() as sock:
        return sock.connect_ex(("127.0.0.1", port)) != 0


@pytest.fixture()
def cluster():
    clock = FakeClock()
    seen_down: list[bool] = []
    holder: dict[str, EmulatedCluster] = {}

    def sleep(_s: float) -> None:  # runs while the restarting pods are down
        c = holder["c"]
        seen_down.append(all(_refused(p.vllm_endpoint.port) for p in c.pods.values() if not p.vllm_endpoint.running))
        clock.now += 30.0

    c = EmulatedCluster(ClusterSpec(pods=2, restart_downtime_s=0.0), clock=clock, sleep=sleep)
    holder["c"] = c
    c.seen_down = seen_down  # type: ignore[attr-defined]
    c.start()
    yield c
    c.stop()


def test_restart_resets_counters_and_created_and_refuses_connections(cluster: EmulatedCluster) -> None:
    pod = cluster.pods["vllm-0"]
    port = pod.vllm_endpoint.port
    pod.metrics.record(OUTCOME)
    before = _scrape(pod.vllm_endpoint.url)
    assert before[("vllm:prefix_cache_hits_total", "0")] == 256
    cleared: list[str] = []
    cluster.on_restart(cleared.append)
    cluster.restart_pod("vllm-0")
    assert cleared == ["vllm-0"] and cluster.seen_down == [True]  # type: ignore[attr-defined]
    assert pod.vllm_endpoint.port == port  # same address after the restart
    after = _scrape(pod.vllm_endpoint.url)
    assert after[("vllm:prefix_cache_hits_total", "0")] == 0
    assert after[("vllm:prefix_cache_hits_created", "0")] > before[("vllm:prefix_cache_hits_created", "0")]
    assert after[("vllm:time_to_first_token_seconds_count", "0")] == 0
    # The other pod kept its process and its counters.
    assert cluster.pods["vllm-1"].restarts == 0


def test_actuator_satisfies_protocol_and_restarts_only_what_a_rollout_would(cluster: EmulatedCluster) -> None:
    seen: list[Knobs] = []
    act = LocalActuator(cluster, reconfigure=seen.append)
    assert isinstance(act, Actuator)
    router_only = DEFAULT_KNOBS.replace(router="prefixaware")
    res = act.apply(router_only)
    assert res.applied and res.restarted == () and res.changed == {"router": ("roundrobin", "prefixaware")}
    assert [p.restarts for p in cluster.pods.values()] == [0, 0]
    res = act.apply(router_only.replace(chunk_tokens=512))
    assert res.restarted == ("vllm-0", "vllm-1")
    assert [p.restarts for p in cluster.pods.values()] == [1, 1]
    assert cluster.seen_down == [True, True]  # rolling: one pod down at a time  # type: ignore[attr-defined]
    res = act.apply(act.current().replace(l2_eviction="s3fifo"))
    assert res.restarted == ("curvine-master",) and cluster.master_restarts == 1
    assert seen == [router_only, router_only.replace(chunk_tokens=512), act.current()]
    assert act.apply(act.current()).applied is False


def test_dry_run_proposes_but_changes_nothing(cluster: EmulatedCluster) -> None:
    act = LocalActuator(cluster)
    res = act.apply(DEFAULT_KNOBS.replace(cpu_gib=20.0), dry_run=True)
    assert res.dry_run and not res.applied and res.restarted == ("vllm-0", "vllm-1")
    assert act.current() == DEFAULT_KNOBS and all(p.restarts == 0 for p in cluster.pods.values())


def test_rollback_restores_last_good_exactly_and_persists(cluster: EmulatedCluster, tmp_path: Path) -> None:
    state = tmp_path / "last-good.yaml"
    act = LocalActuator(cluster, state_file=state)
    with pytest.raises(PermanentActuationError, match="no last good"):
        act.rollback()
    good = DEFAULT_KNOBS.replace(router="session", cpu_gib=10.0)
    act.apply(good)
    act.mark_good(good)
    act.apply(good.replace(chunk_tokens=64, router="kvaware"))
    res = act.rollback()
    assert act.current() == good and res.changed == {"chunk_tokens": (64, 256), "router": ("kvaware", "session")}
    assert LocalActuator(cluster, state_file=state).last_good() == good


def test_non_rolling_restart_takes_all_pods_down_together(cluster: EmulatedCluster) -> None:
    act = LocalActuator(cluster, rolling=False)
    act.apply(DEFAULT_KNOBS.replace(cpu_eviction="lfu"))
    assert cluster.seen_down == [True]  # type: ignore[attr-defined]
    assert [p.restarts for p in cluster.pods.values()] == [1, 1]


def test_restart_plan_classifies_every_knob() -> None:
    for key in DEFAULT_KNOBS.to_dict():
        restart_plan({key})  # raises for a knob without a rule
    assert restart_plan({"router"}) == (False, False)
    assert restart_plan({"chunk_tokens", "l2_low_watermark"}) == (True, True)
