"""Twin agreement: the twin drives emulated pods that publish vLLM 0.33 event streams over real ZMQ;
the agent's subscriber and index estimate the workload signals, which must match the twin's
ground truth (docs/twin.md, "Truth signals") within 2 percentage points of prompt tokens."""
from __future__ import annotations

import time

import pytest
import zmq

from agent.kvevents import KvEventManager, PodCounters
from agent.kvevents.settings import EndpointSpec, KvEventsSettings
from contracts.knobs import Knobs
from emulator.cluster.kv_publisher import TwinEventPublisher, open_pod_publishers
from simulator.cluster import ClusterSpec
from simulator.synthetic import synthetic
from simulator.twin import Twin

TOLERANCE = 0.02
LOCAL_COMPUTE = 'vllm:prompt_tokens_by_source_total{source="local_compute"}'


def _counters(twin: Twin, pod: str) -> PodCounters:
    c = twin.pod_counters(pod)
    return PodCounters(c["vllm:prompt_tokens_total"], c[LOCAL_COMPUTE],
                       c.get("vllm:external_prefix_cache_hits_total", 0.0))


@pytest.mark.parametrize(("preset", "router", "cluster", "encoding"), [
    # shared L2 + CPU offload + small GPUs, round robin, one pod restarted mid-run
    ("sessions", "roundrobin", {"gpu_tokens": 30_000, "cpu_tokens": 30_000, "l2_tokens": 100_000}, "map"),
    # no shared L2: every capacity/routing miss is visible in the events; legacy encoding
    ("rag", "roundrobin", {"gpu_tokens": 60_000, "cpu_tokens": 60_000, "l2_tokens": 0}, "array"),
], ids=["sessions-l2-restart", "rag-no-l2-array"])
def test_live_estimates_match_the_twin_truth(preset: str, router: str, cluster: dict, encoding: str) -> None:
    ctx = zmq.Context()
    pods = [f"pod-{i}" for i in range(4)]
    publishers = open_pod_publishers(pods, encoding=encoding, context=ctx)  # type: ignore[arg-type]
    specs = tuple(EndpointSpec(pod=p, model="m", endpoint=pub.endpoint, replay_endpoint=pub.replay_endpoint)
                  for p, pub in publishers.items())
    # a long hold: the twin publishes much faster than real time, so pods' sockets race
    mgr = KvEventManager(KvEventsSettings(endpoints=specs, reorder_hold_s=1.0), context=ctx)
    try:
        mgr.start()
        for pub in publishers.values():  # every pod's subscription in before the first batch
            pub.wait_subscribed()
        sink = TwinEventPublisher(publishers, clock_offset=1_700_000_000.0)
        twin = Twin(ClusterSpec(pods=4, pod_names=tuple(pods), **cluster),
                    Knobs(router=router, chunk_tokens=256), event_sink=sink)
        for p in pods:  # first scrape: the baseline
            mgr.observe_counters(p, "m", _counters(twin, p), ts=0.0)
        rows = list(synthetic(preset, seed=3, duration_s=150).iter_rows(named=True))
        for i, row in enumerate(rows):
            ts = row["timestamp_ms"] / 1000.0
            if i % 50 == 0:  # the agent's periodic scrape
                for p in pods:
                    mgr.observe_counters(p, "m", _counters(twin, p), ts=ts)
            if i == len(rows) // 2 and preset == "sessions":
                # Tokens a pod served after its last scrape are lost with its counters when it
                # restarts (as for Prometheus' increase()); scrape it just before, so the truth and
                # the estimate cover the same tokens.
                mgr.observe_counters("pod-1", "m", _counters(twin, "pod-1"), ts=ts)
                twin.restart_pod("pod-1", ts)  # counters restart from zero, AllBlocksCleared
            twin.submit(row)
        sink.flush()
        deadline = time.monotonic() + 60
        total = sum(pub.published for pub in publishers.values())
        while mgr.applied_batches < total:
            assert time.monotonic() < deadline, f"applied {mgr.applied_batches} of {total} batches"
            time.sleep(0.05)
        mgr.stop()
        for p in pods:
            mgr.observe_counters(p, "m", _counters(twin, p), ts=200.0)  # after the last request
        got = mgr.current_overlap("m", window_s=1_000.0)  # the whole run
        truth = twin.miss_attribution()
    finally:
        mgr.stop()
        for pub in publishers.values():
            pub.close()
        ctx.term()
    assert got is not None
    snap = mgr.snapshot()
    assert all(e.stream.lost_messages == 0 for e in snap.engines)
    if preset == "sessions":
        assert [e.stream.events["AllBlocksCleared"] for e in snap.engines] == [0, 1, 0, 0]
    p = truth.prompt_tokens
    assert got.prompt_tokens == p
    assert got.ratio == pytest.approx(truth.overlap, abs=TOLERANCE)
    for cause in ("cold", "capacity", "routing", "tail"):
        assert got.share(cause) == pytest.approx(getattr(truth, f"{cause}_tokens") / p, abs=TOLERANCE), cause
    # the scenario is not trivial: every cause is present
    assert truth.capacity_tokens / p > 0.02 and truth.routing_tokens / p > 0.01
