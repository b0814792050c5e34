"""Sharded direct scraping: rendezvous hashing (balanced, stable under churn, a pod's endpoints
together) and the leader's fleet view read from the shards directly, which equals an unsharded
agent's view of the same emulated cluster."""
from __future__ import annotations

import random
import urllib.request

import pytest

from agent.collect.discovery import StaticTargets
from agent.collect.fleetstore import FleetStore
from agent.collect.shard import ShardedTargets, owned, shard_index, shard_of
from agent.runtime.app import Agent
from agent.settings import SettingsError, load_settings
from contracts.tier_model import Target
from emulator.cluster.fleet import ClusterSpec, EmulatedCluster
from emulator.cluster.pod_metrics import RequestOutcome

PODS = [f"vllm-{i}" for i in range(2000)]


def test_rendezvous_is_balanced_and_stable_under_churn():
    for count in (2, 4):
        sizes = [0] * count
        for p in PODS:
            sizes[shard_of(p, count)] += 1
        assert all(abs(n - len(PODS) / count) < 0.1 * len(PODS) / count for n in sizes), sizes
    before = {p: shard_of(p, 4) for p in PODS}
    rng = random.Random(1)
    survivors = rng.sample(PODS, 1800)
    newcomers = [f"vllm-new-{i}" for i in range(300)]
    after = {p: shard_of(p, 4) for p in survivors + newcomers}
    assert all(after[p] == before[p] for p in survivors)  # churn never moves a pod
    moved = sum(shard_of(p, 5) != before[p] for p in PODS) / len(PODS)
    assert 0.13 < moved < 0.27  # one more replica moves about 1/5 of the pods, the minimum


def test_every_endpoint_of_a_pod_lands_on_one_shard_and_shards_partition_the_fleet():
    targets = [Target(f"http://10.0.{i // 200}.{i % 200}:{port}/metrics", role, f"vllm-{i}")  # type: ignore[arg-type]
               for i in range(300) for port, role in ((8000, "vllm"), (9003, "curvine-fuse"))]
    parts = [owned(targets, i, 3) for i in range(3)]
    assert sorted(t.url for p in parts for t in p) == sorted(t.url for t in targets)
    for part in parts:
        pods = {t.pod for t in part}
        assert len(part) == 2 * len(pods)
    src = ShardedTargets(StaticTargets(targets), 1, 3)
    assert src.targets() == parts[1]


def test_shard_index_from_the_statefulset_ordinal():
    assert shard_index(None, 4, {"POD_NAME": "tierpilot-3"}) == 3
    assert shard_index(None, 4, {"HOSTNAME": "agent"}) == 0
    assert shard_index(2, 4, {"POD_NAME": "tierpilot-3"}) == 2
    with pytest.raises(ValueError, match="outside 0..1"):
        shard_index(None, 2, {"POD_NAME": "tierpilot-5"})
    with pytest.raises(SettingsError, match="below count"):
        load_settings(env={}, shard={"count": 2, "index": 2})


class Clock:
    now = 1_800_000_000.0

    def __call__(self) -> float:
        return self.now


def _traffic(cluster: EmulatedCluster, rng: random.Random) -> None:
    for pod in cluster.pods.values():
        for _ in range(rng.randint(5, 30)):
            prompt = rng.randint(256, 8192)
            gpu = rng.randint(0, prompt // 2)
            pod.metrics.record(RequestOutcome(prompt, gpu, rng.randint(0, (prompt - gpu) // 2), 0, 32,
                                              ttft_s=rng.uniform(0.01, 2.0)))


def test_leader_fleet_view_from_the_shards_equals_the_unsharded_view():
    clock = Clock()
    with EmulatedCluster(ClusterSpec(pods=6, restart_downtime_s=0.0)) as cluster:
        targets = [Target(t["url"], t["role"], t["pod"]) for t in cluster.targets()]  # type: ignore[arg-type]

        def agent(**shard) -> Agent:
            s = load_settings(env={}, scrape={"interval_s": 3600}, server={"host": "127.0.0.1", "port": 0},
                              **({"shard": shard} if shard else {}))
            return Agent(s, StaticTargets(targets), clock=clock)

        whole = agent()
        shard0, shard1 = (agent(count=2, index=i, allow_unauthenticated=True) for i in (0, 1))
        shard1.start()
        try:
            rng = random.Random(5)
            for _ in range(3):
                for a in (whole, shard0, shard1):
                    a.scrape_now()
                _traffic(cluster, rng)
                clock.now += 15.0
            snaps = [a.scrape_now() for a in (whole, shard0, shard1)]
            p0, p1 = ({t.target.pod for t in s.targets} for s in snaps[1:])
            assert p0 and p1 and not p0 & p1 and p0 | p1 == {t.target.pod for t in snaps[0].targets}
            base = shard1.url.rsplit("/", 1)[0]
            fleet = FleetStore(shard0.store, [base])
            for model in (None, "meta-llama/Llama-3.1-8B-Instruct"):
                assert fleet.hit_ratios(model=model) == pytest.approx(whole.store.hit_ratios(model=model))
                assert fleet.ttft_quantiles(model=model) == pytest.approx(whole.store.ttft_quantiles(model=model))
                assert fleet.request_rate(model=model) == pytest.approx(whole.store.request_rate(model=model))
                mix, want = fleet.prompt_length_mix(model=model), whole.store.prompt_length_mix(model=model)
                assert len(mix) == len(want) > 3
                assert all(a == pytest.approx(b) for a, b in zip(mix, want, strict=True))
            assert shard0.store.hit_ratios() != pytest.approx(whole.store.hit_ratios())  # one shard is not the fleet
            with urllib.request.urlopen(base + "/window?window_s=x") as _:
                pytest.fail("a bad window_s must be a 400")
        except urllib.error.HTTPError as exc:
            assert exc.code == 400
        finally:
            shard1.stop()
        # a peer that is gone is left out of the read and counted, never invented
        assert fleet.request_rate() == pytest.approx(shard0.store.request_rate())
        assert fleet.peer_errors == {base: 1}


def test_sharded_runtime_follows_only_its_pods_kv_events_and_serves_its_sketch():
    from agent.runtime.assembly import build_runtime

    pods = [f"vllm-{i}" for i in range(8)]
    endpoints = [{"pod": p, "model": "m", "endpoint": f"tcp://127.0.0.1:{5600 + i}"} for i, p in enumerate(pods)]
    settings = load_settings(env={}, kv_events={"enabled": True, "discovery": False, "endpoints": endpoints},
                             shard={"count": 2, "index": 1, "peers": ["http://127.0.0.1:9/"], "allow_unauthenticated": True})
    rt = build_runtime(settings, targets=StaticTargets(()))
    followed = {s.pod for s in rt.kv._wanted}
    assert followed == {p for p in pods if shard_of(p, 2) == 1} and 0 < len(followed) < len(pods)
    assert rt.fleet_store is not rt.agent.store and isinstance(rt.fleet_store, FleetStore)
    body, ctype = rt.agent.routes["/kv/sketch"]({"window_s": "60"})
    assert ctype == "application/json" and b'"models":{}' in body
    with pytest.raises(ValueError, match="window_s"):
        rt.agent.routes["/kv/sketch"]({"window_s": "soon"})
    text = rt.agent.metrics_text()
    assert 'tierpilot_kv_fleet_shards{state="failed"} 1.0' in text  # the unreachable peer, left out
    # the drift detector's inputs are the fleet's: with the peer unreachable they are refused
    from agent.runtime.tuning_bridge import drift_signals
    from contracts.fleet import PartialFleetError

    assert rt.overlap_source is rt.fleet_overlap is not None
    with pytest.raises(PartialFleetError, match="shard http://127.0.0.1:9 left out"):
        drift_signals(rt.fleet_store, rt.overlap_source, 60.0)
    assert 'tierpilot_fleet_peer_fetch_failures_total{endpoint="/window",peer="http://127.0.0.1:9",reason="unreachable"}' \
        in rt.agent.metrics_text()


def test_one_peer_list_for_every_replica_leaves_out_the_replica_itself():
    from agent.collect.shard import other_peers

    peers = [f"http://tierpilot-{i}.tierpilot-peers.llm.svc:9400" for i in range(3)]
    assert other_peers(peers, "tierpilot-1") == (peers[0], peers[2])
    assert other_peers(peers, "tierpilot") == tuple(peers)  # a prefix of a name is not the name
    assert other_peers(["http://10.0.0.7:9400"], None) == ("http://10.0.0.7:9400",)
