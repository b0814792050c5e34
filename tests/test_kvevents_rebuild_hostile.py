"""One hostile engine among four cannot steer the rebuilt planning workload (issue 32, item 1).

Four twin pods serve a RAG workload; pod-3 also floods forged `BlockStored` chains (random hashes,
or a small pool of forged chains repeated to look like a hot working set, hung under the fleet's
real system prompt) and its counters claim a hundred times the requests. The workload rebuilt with
the attack must keep the honest fleet's working set and capacity curves, and name pod-3.
"""
from __future__ import annotations

import logging

import numpy as np
import pytest

from agent.kvevents.rebuild import BlockRecorder, PodRequests, RebuiltHistory
from agent.kvevents.rebuild.fill import cap_engines
from agent.kvevents.settings import RebuildSpec
from agent.kvevents.wire import Batch, Stored
from contracts.knobs import Knobs
from simulator.capacity import tier_curves
from simulator.cluster import ClusterSpec
from tests.test_kvevents_rebuild import _feed, served_counted

SPEC = RebuildSpec()
CLUSTER = {"gpu_tokens": 60_000, "cpu_tokens": 60_000, "l2_tokens": 0}


@pytest.fixture(scope="module")
def honest():
    return served_counted(CLUSTER)


def _flood(recorder: BlockRecorder, kind: str, root: int, seconds: float, seed: int = 5) -> int:
    """pod-3's forged stores: 20 chains of 64 blocks a second (a tenth of the rate cap)."""
    rng = np.random.default_rng(seed)
    pool = [rng.integers(1, 2**63, 64, dtype=np.uint64).tolist() for _ in range(40)]
    sent = 0
    for step in range(int(seconds * 20)):
        chain = rng.integers(1, 2**63, 64, dtype=np.uint64).tolist() if kind == "random" else pool[step % 40]
        parent = None if kind == "random" else root
        recorder.record("m", "pod-3", Batch(b"", 0, step / 20.0, 0, [Stored(chain, parent, 256, "GPU", None)], {}))
        sent += len(chain)
    return sent


def _window(events, counts, flood: str | None, *, honest_pod3: bool = True):
    clock = [0.0]
    recorder = BlockRecorder.from_settings(SPEC, clock=lambda: clock[0])
    _feed(recorder, [e for e in events if honest_pod3 or e.pod != "pod-3"])
    counts = dict(counts)
    if flood is not None:
        first = next(e for e in events if getattr(e, "parent_block_hash", 1) is None and e.medium == "GPU")
        _flood(recorder, flood, first.block_hashes[0], 150.0)
        c = counts["pod-3"]
        counts["pod-3"] = PodRequests(c.requests * 100, c.prompt_tokens * 100, c.gpu_hit_tokens)
    elif not honest_pod3:
        del counts["pod-3"]
    history = RebuiltHistory.from_settings(recorder, lambda since, until: counts, lambda: 200.0, SPEC)
    return history.window(200.0, 201.0), history(200.0, 201.0)


def _working_set(w) -> np.ndarray:
    """(distinct blocks, blocks referenced by two requests or more) of a rebuilt window."""
    _, n = np.unique(w.requests.flat, return_counts=True)
    return np.array([len(n), int((n >= 2).sum())])


def _curves(frame):
    """The stream's reuse as one cache sees it (one pod: no routing, which one extra request would
    reshuffle), GPU and CPU."""
    return tier_curves(frame, ClusterSpec(pods=1, **CLUSTER), Knobs(router="roundrobin", chunk_tokens=256))


@pytest.mark.parametrize("flood", ["random", "hot"])
def test_a_forged_flood_from_one_engine_changes_nothing_material(honest, flood, caplog) -> None:
    """pod-3 only floods: the rebuilt workload is the three honest pods'."""
    events, _sent, counts = honest
    base, base_frame = _window(events, counts, None, honest_pod3=False)
    with caplog.at_level(logging.WARNING, logger="agent.kvevents.rebuild.history"):
        hit, hit_frame = _window(events, counts, flood, honest_pod3=False)
    assert base.outliers == {} and set(hit.outliers) == {"pod-3"}
    assert any("pod-3" in r.getMessage() for r in caplog.records)
    assert abs(hit.requests.requests - base.requests.requests) <= 0.05 * base.requests.requests
    assert (np.abs(_working_set(hit) - _working_set(base)) <= 0.05 * _working_set(base)).all()
    cb, ch = _curves(base_frame), _curves(hit_frame)
    for tier in ("gpu", "cpu"):
        grid = np.linspace(0.0, max(cb[tier].max_useful_gib, 0.1), 21)
        gap = max(abs(cb[tier].hit_ratio(g) - ch[tier].hit_ratio(g)) for g in grid)
        assert gap <= 0.02, (tier, gap)


@pytest.mark.parametrize("flood", ["random", "hot"])
def test_a_serving_engine_that_also_floods_counts_at_most_as_an_honest_one(honest, flood) -> None:
    """pod-3 serves its share and floods: the working set lies between the three honest pods' and
    the four's (its corroborated requests count, its forgeries do not)."""
    events, _sent, counts = honest
    three, _ = _window(events, counts, None, honest_pod3=False)
    four, _ = _window(events, counts, None)
    hit, _ = _window(events, counts, flood)
    assert set(hit.outliers) == {"pod-3"} and hit.counter_outliers == {"pod-3"}
    low, high, got = _working_set(three), _working_set(four), _working_set(hit)
    assert (got >= 0.95 * low).all() and (got <= 1.05 * high).all(), (low, got, high)
    assert 0.95 * three.requests.requests <= hit.requests.requests <= 1.05 * four.requests.requests


def test_the_rate_cap_drops_and_counts_what_an_engine_sends_beyond_it() -> None:
    clock = [0.0]
    recorder = BlockRecorder(retain_s=3600.0, max_refs=10**7, engine_refs_per_s=1000.0, clock=lambda: clock[0])
    rng = np.random.default_rng(1)
    for step in range(100):  # 10 s of 100 blocks every 0.1 s = 1,000 refs/s on pod-0, 10x that on pod-1
        clock[0] = step / 10.0
        recorder.record("m", "pod-0", Batch(b"", 0, clock[0], 0, [Stored(rng.integers(1, 2**63, 100).tolist(), None,
                                                                         16, "GPU", None)], {}))
        recorder.record("m", "pod-1", Batch(b"", 0, clock[0], 0, [Stored(rng.integers(1, 2**63, 1000).tolist(), None,
                                                                         16, "GPU", None)], {}))
    stats = recorder.engine_stats("m")
    assert stats["pod-0"].capped_refs == 0 and stats["pod-0"].stored_refs == 10_000
    # the bucket holds 10 s: 10,000 refs at first, then 1,000 a second
    assert 10_000 <= stats["pod-1"].stored_refs <= 21_000
    assert stats["pod-1"].capped_refs == 100_000 - stats["pod-1"].stored_refs


def test_an_honest_busy_engine_keeps_its_shared_traffic() -> None:
    """cap_engines keeps an outlier's requests rooted where others stored too, up to the median."""
    from agent.kvevents.rebuild.chains import Rebuilt

    # engines 0-2: 10 requests of 4 blocks under root 1; engine 3: 40 such requests + 40 private roots
    chains = [[1, 10 + i, 20 + i, 30 + i] for i in range(30)] + [[1, 40 + i, 50 + i, 60 + i] for i in range(40)] \
        + [[1000 + i, 2000 + i, 3000 + i, 4000 + i] for i in range(40)]
    eng = np.array([i // 10 for i in range(30)] + [3] * 80, dtype=np.int32)
    offsets = np.arange(0, 4 * len(chains) + 1, 4, dtype=np.int64)
    r = Rebuilt(np.arange(len(chains), dtype=float), eng, np.full(len(chains), 16, dtype=np.int32),
                np.full(len(chains), 4, dtype=np.int64), np.array(chains, dtype=np.uint64).ravel(), offsets,
                ("a", "b", "c", "d"))
    kept, outliers = cap_engines(r, 2.0)
    assert outliers == {"d": 320}
    mine = np.flatnonzero(kept.eng == 3)
    assert len(mine) == 10 and all(kept.chain(i)[0] == 1 for i in mine)  # the median's 40 blocks, shared roots
