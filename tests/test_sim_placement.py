"""Replaying an observed placement: each request on the pod that served it.

- A replay given the pods a router chose reproduces that router's run exactly, on every path of the
  replay (compiled kernel, written-out loop, `Twin._process`), whatever router the knobs name.
- The capacity curves of a placed stream equal those of the run it was observed on.
- `observed_placement` reads the frame's column only when it fits; bad placements fail clearly.
- A workload rebuilt from KV events carries the engine that served each request, and its curves
  keep a fully cached request on the pod that held its prefix.
"""
from __future__ import annotations

import numpy as np
import polars as pl
import pytest

from contracts.knobs import Knobs
from simulator import fastloop, kernel
from simulator.capacity import tier_curves
from simulator.cluster import ClusterSpec
from simulator.records import PLACEMENT_COLUMN, observed_placement
from simulator.replay import replay
from simulator.workload import synthetic

CLUSTER = ClusterSpec(pods=3, gpu_tokens=24 * 512, cpu_tokens=16 * 512, l2_tokens=120 * 512)


def _frame() -> pl.DataFrame:
    return synthetic("shift", seed=7, duration_s=60, rate_rps=5.0)


def _rows(res):
    return res.requests.rows(), res.evictions, res.l2_counters, res.truth


@pytest.mark.parametrize("served_by", ["roundrobin", "session", "prefixaware"])
@pytest.mark.parametrize("path", ["kernel", "loop", "general"])
def test_a_placed_replay_reproduces_the_run_it_was_observed_on(served_by, path, monkeypatch):
    df = _frame()
    knobs = Knobs(chunk_tokens=256, router=served_by)
    observed = replay(df, CLUSTER, knobs)
    pods = observed.requests["pod_index"].to_numpy()
    assert len(set(pods.tolist())) == CLUSTER.pods
    calls = []
    real_kernel, real_loop = kernel.run, fastloop.run
    monkeypatch.setattr(kernel, "run", lambda *a, **kw: calls.append("kernel") or real_kernel(*a, **kw))
    monkeypatch.setattr(fastloop, "run", lambda *a, **kw: calls.append("loop") or real_loop(*a, **kw))
    if path != "kernel":
        monkeypatch.setattr(kernel, "supports", lambda twin: False)
    if path == "general":
        monkeypatch.setattr(fastloop, "supports", lambda twin: False)
    other = "kvaware" if served_by != "kvaware" else "roundrobin"  # the knobs' router is not asked
    placed = replay(df, CLUSTER, knobs.replace(router=other), placement=pods)
    assert calls == {"kernel": ["kernel"], "loop": ["loop"], "general": []}[path]
    assert _rows(placed) == _rows(observed)
    routed = replay(df, CLUSTER, knobs.replace(router=other))
    assert routed.requests["pod_index"].to_list() != pods.tolist()  # it would have routed otherwise


def test_the_curves_of_a_placed_stream_are_those_of_the_observed_run():
    df = _frame()
    knobs = Knobs(chunk_tokens=256, router="prefixaware")
    observed = replay(df, CLUSTER, knobs)
    pods = observed.requests["pod_index"].to_numpy()
    truth = tier_curves(df, CLUSTER, knobs, run=observed)
    placed = tier_curves(df, CLUSTER, knobs.replace(router="roundrobin"), placement=pods)
    routed = tier_curves(df, CLUSTER, knobs.replace(router="roundrobin"))
    grid = np.linspace(0.0, truth["gpu"].max_useful_gib, 21)
    for tier in ("gpu", "cpu", "l2"):
        assert [placed[tier].hit_ratio(g) for g in grid] == [truth[tier].hit_ratio(g) for g in grid], tier
    assert [routed["gpu"].hit_ratio(g) for g in grid] != [truth["gpu"].hit_ratio(g) for g in grid]


def test_observed_placement_is_read_only_when_it_fits():
    df = _frame()
    n = df.height
    assert observed_placement(df, 3) is None  # no column
    with_col = df.with_columns(pl.Series(PLACEMENT_COLUMN, np.arange(n) % 3, dtype=pl.Int32))
    assert observed_placement(with_col, 3).tolist() == (np.arange(n) % 3).tolist()
    assert observed_placement(with_col, 2) is None  # more pods served it than the cluster has
    nulls = with_col.with_columns(pl.when(pl.int_range(pl.len()) == 5).then(None)
                                  .otherwise(pl.col(PLACEMENT_COLUMN)).alias(PLACEMENT_COLUMN))
    assert observed_placement(nulls, 3) is None
    assert observed_placement(with_col.reverse(), 3) is None  # not in arrival order


def test_a_bad_placement_fails_with_a_clear_error():
    df = _frame()
    knobs = Knobs(chunk_tokens=256)
    with pytest.raises(ValueError, match="one per request"):
        replay(df, CLUSTER, knobs, placement=[0] * (df.height - 1))
    with pytest.raises(ValueError, match="outside the cluster's 3 pods"):
        replay(df, CLUSTER, knobs, placement=[3] * df.height)
    with pytest.raises(ValueError, match="arrival order"):
        tier_curves(df.reverse(), CLUSTER, knobs, placement=np.zeros(df.height, dtype=np.int64))
