"""Benchmark workloads where only the cache knobs pay (a restart each), and one where none does.

Each `Scenario` is a workload, the fleet it runs on (sized below saturation: TTFT p95 from
hundreds of ms to a few s) and the deployment (what the operator allows, the configuration the
fleet starts on, the objective's memory price). Every fleet already runs the best router
(`kvaware`), so a router switch buys nothing:

- `cpu_hot`: an hour of RAG over a large corpus whose hot set outgrows GPU KV plus the 5 GiB
  CPU buffer, a small shared L2 pool (64 GiB, far below the hot set), 64 GiB host headroom per
  pod, memory priced at 0: a bigger CPU buffer pays;
- `cpu_hot_nol2`: the same on a fleet without a shared L2 (LMCache CPU offload only);
- `chunk`: the same RAG on a fleet started with 1,024-token chunks: every prompt's partial last
  chunk is recomputed, and up to 1,023 tokens are lost per prompt; 512 or less pays;
- `l2_evict`: a hot set of documents read again and again, and a stream of one-off long
  documents (scans) that flush an LRU L2 pool; LFU, ARC or S3-FIFO keep the hot set;
- `short`: phases of 8 minutes alternating short chat prompts and cache-hungry RAG, on the
  `cpu_hot_nol2` fleet: a bigger buffer would pay in a steady RAG phase, but no phase lasts long
  enough to repay a rolling restart, so none must be made.
"""
from __future__ import annotations

import dataclasses

import polars as pl

from contracts.knobs import DEFAULT_KNOBS
from emulator.demo.deployment import Deployment, demo_deployment
from emulator.demo.workload import DemoWorkload
from simulator.cluster import ClusterSpec
from simulator.models import get_model
from simulator.records import WORKLOAD_SCHEMA
from simulator.synthetic import Phase, generate, preset_phases

SCAN_HASH_OFFSET = 1 << 41  # keeps the scan stream's block ids apart from the hot set's
RESTART_PAYS = ("cpu_hot", "cpu_hot_nol2", "chunk", "l2_evict")
SCENARIOS = (*RESTART_PAYS, "short")
PHASE_S = 3000.0  # 50 cluster-minutes per phase
SHORT_PHASE_S = 480.0


@dataclasses.dataclass(frozen=True)
class Scenario:
    workload: DemoWorkload
    cluster: ClusterSpec
    deployment: Deployment
    restart_pays: bool | None = None  # True: a restart must be applied; False: none may be; None: either


def _rag(duration_s: float, **kw: object) -> Phase:
    rag, _ = preset_phases("shift")
    base = {"rate_rps": 3.0, "rag_docs": 1500, "rag_doc_tokens": (1024, 4096), "rag_zipf_s": 0.8}
    base.update(kw)
    return dataclasses.replace(rag, duration_s=duration_s, **base)  # type: ignore[arg-type]


def _l2_tokens(gib: float, cluster: ClusterSpec) -> int:
    return get_model(cluster.model or cluster.hardware.model).tokens_for_gib(gib)


def _one_phase(frame: pl.DataFrame, label: str) -> DemoWorkload:
    span = float(frame["timestamp_ms"].max()) / 1000.0
    return DemoWorkload(frame, (0.0,), (label,), span)


def _deployment(pods: int, seed: int, start: object, *, l2: bool, l2_gib: float = 2048.0,
                memory_ms_per_gib: float | None = None) -> Deployment:
    """The demo's settings with 64 GiB host headroom per pod, a Curvine pool or none, and the
    scenario's memory price."""
    tuner: dict[str, object] = {"limits": {"node_memory_headroom_gib": 64.0, "l2_pool_gib": l2_gib,
                                           "l2_backend": "curvine" if l2 else "none"}}
    if memory_ms_per_gib is not None:
        tuner["memory_ms_per_gib"] = memory_ms_per_gib
    return demo_deployment(pods, seed, tuner=tuner, start=start)  # type: ignore[arg-type]


KVAWARE = DEFAULT_KNOBS.replace(router="kvaware")


def scenario(name: str, seed: int, *, phase_s: float = PHASE_S, short_phases: int = 6) -> Scenario:
    """The named scenario for `seed` (`phase_s`: the length of a restart scenario's phase;
    `short_phases`: how many 8-minute phases `short` alternates)."""
    pods = 4
    PHASE_S = phase_s
    if name in ("cpu_hot", "cpu_hot_nol2"):
        l2 = name == "cpu_hot"
        cluster = ClusterSpec(pods=pods)
        cluster = dataclasses.replace(cluster, l2_tokens=_l2_tokens(64.0, cluster) if l2 else 0)
        frame = generate((_rag(PHASE_S),), seed=seed)
        label = "RAG, hot set > GPU + 5 GiB" + ("" if l2 else ", no L2")
        return Scenario(_one_phase(frame, label), cluster,
                        _deployment(pods, seed, KVAWARE, l2=l2, l2_gib=64.0, memory_ms_per_gib=0.0), True)
    if name == "chunk":
        frame = generate((_rag(PHASE_S),), seed=seed)
        return Scenario(_one_phase(frame, "RAG on 1,024-token chunks"), ClusterSpec(pods=pods),
                        _deployment(pods, seed, KVAWARE.replace(chunk_tokens=1024), l2=True), True)
    if name == "l2_evict":
        cluster = ClusterSpec(pods=pods)
        cluster = dataclasses.replace(cluster, l2_tokens=_l2_tokens(192.0, cluster))
        hot = generate((_rag(PHASE_S, rate_rps=2.0, rag_docs=400, rag_doc_tokens=(2048, 4096), rag_zipf_s=0.6,
                             system_prompts=2),), seed=seed)
        scan = generate((_rag(PHASE_S, rate_rps=1.0, rag_docs=20000, rag_doc_tokens=(4096, 8192), rag_zipf_s=0.01,
                              system_prompts=1, system_pool=5, rag_corpus=5),), seed=seed + 1000)
        scan = scan.with_columns(pl.col("hash_ids").list.eval(pl.element() + SCAN_HASH_OFFSET))
        frame = pl.concat([hot.select(list(WORKLOAD_SCHEMA)), scan.select(list(WORKLOAD_SCHEMA))]).sort("timestamp_ms")
        dep = demo_deployment(pods, seed, tuner={"limits": {"l2_pool_gib": 192.0, "l2_backend": "twin",
                                                            "l2_threshold_max": 0}},
                              start=KVAWARE, offer={"watermarks": ((1.0, 1.0),)})
        return Scenario(_one_phase(frame, "hot documents + one-off scans"), cluster, dep, True)
    if name == "short":
        cluster = ClusterSpec(pods=pods, l2_tokens=0)
        (chat,) = preset_phases("short")
        phases = []
        for i in range(short_phases):
            if i % 2 == 0:
                phases.append(dataclasses.replace(chat, duration_s=SHORT_PHASE_S, rate_rps=6.0))
            else:
                phases.append(_rag(SHORT_PHASE_S))
        frame = generate(phases, seed=seed)
        starts = tuple(i * SHORT_PHASE_S for i in range(short_phases))
        labels = tuple(f"phase {i + 1}: {'short chat' if i % 2 == 0 else 'RAG'} (8 min)" for i in range(short_phases))
        return Scenario(DemoWorkload(frame, starts, labels, short_phases * SHORT_PHASE_S), cluster,
                        _deployment(pods, seed, KVAWARE, l2=False, memory_ms_per_gib=0.0), False)
    raise ValueError(f"scenario: unknown {name!r}; valid: {', '.join(SCENARIOS)}")


__all__ = ["RESTART_PAYS", "SCENARIOS", "Scenario", "scenario"]
