"""Completing a rebuilt window from the counters (agent/kvevents/rebuild/fill.py, reuse.py): when
the fully cached requests arrived, what they repeat, and how far back a pod's reuses reach."""
from __future__ import annotations

import numpy as np
import polars as pl

from agent.kvevents.rebuild import BlockRecorder, RebuiltHistory
from agent.kvevents.rebuild.chains import Rebuilt
from agent.kvevents.rebuild.fill import PodRequests, arrival_times, synthesise, tilted_choice
from agent.kvevents.rebuild.history import request_intervals
from agent.kvevents.rebuild.merge import decode_state, encode_state, window_state
from agent.kvevents.rebuild.reuse import reuse_distances
from agent.kvevents.settings import RebuildSpec


def _rebuilt(chains: list[list[int]], own: list[int], ts: list[float], pods: list[int],
             engines: tuple[str, ...] = ("pod-0", "pod-1")) -> Rebuilt:
    lengths = np.array([len(c) for c in chains], dtype=np.int64)
    offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
    return Rebuilt(np.array(ts, dtype=np.float64), np.array(pods, dtype=np.int32), np.full(len(chains), 16, dtype=np.int32),
                   np.array(own, dtype=np.int64), np.array([h for c in chains for h in c], dtype=np.uint64), offsets, engines)


def test_fully_cached_arrivals_start_at_the_counters_first_sample_and_follow_its_intervals() -> None:
    """The counter was first sampled at 100 s; it counted 10 requests in (100, 130] of which 2 were
    rebuilt, and 2 in (130, 160] of which 2 were rebuilt: the 8 missing arrive in (100, 130]."""
    rng = np.random.default_rng(0)
    stored = np.array([110.0, 120.0, 140.0, 150.0])
    c = PodRequests(12.0, intervals=((100.0, 130.0, 10.0), (130.0, 160.0, 2.0)))
    ts = arrival_times(c, stored, 8, 0.0, 200.0, rng)
    assert len(ts) == 8 and (np.diff(ts) >= 0).all() and ts.min() >= 100.0 and ts.max() <= 130.0
    # deficits in proportion: 9 counted beyond 1 rebuilt, 3 beyond 1 -> 6 and 2 of 8
    c = PodRequests(14.0, intervals=((100.0, 130.0, 10.0), (130.0, 160.0, 4.0)))
    ts = arrival_times(c, np.array([110.0, 150.0]), 12, 0.0, 200.0, rng)
    assert int((ts <= 130.0).sum()) == 9 and int((ts > 130.0).sum()) == 3 and ts.min() >= 100.0
    # intervals reaching before the window are cut at its start; without intervals, the window
    ts = arrival_times(PodRequests(5.0, intervals=((-30.0, 20.0, 5.0),)), np.zeros(0), 5, 0.0, 200.0, rng)
    assert ts.min() >= 0.0 and ts.max() <= 20.0
    ts = arrival_times(PodRequests(5.0), np.zeros(0), 5, 50.0, 100.0, rng)
    assert ts.min() >= 50.0 and ts.max() <= 100.0


def test_synthesised_requests_never_arrive_before_the_counters_first_sample() -> None:
    r = _rebuilt([[1, 2, 3], [1, 2, 4], [1, 5]], [3, 1, 1], [40.0, 50.0, 60.0], [0, 0, 0])
    counts = {"pod-0": PodRequests(9.0, intervals=((30.0, 60.0, 9.0),))}
    extra, made, _ = synthesise(r, counts, -1000.0, 100.0, share=8.0, seed=1)
    assert made == {"pod-0": 6} and extra.requests == 6
    assert extra.ts.min() >= 30.0 and extra.ts.max() <= 60.0
    for i in range(extra.requests):  # each repeats a prefix of a rebuilt request of the pod
        chain = extra.chain(i).tolist()
        assert any(r.chain(j).tolist()[:len(chain)] == chain for j in range(r.requests))


def test_request_intervals_are_each_scrapes_increase() -> None:
    frame = pl.DataFrame({
        "ts": [30.0, 60.0, 60.0, 90.0, 60.0], "pod": ["a", "a", "a", "a", "b"],
        "signal": ["requests", "requests", "requests", "requests", "prompt_tokens"],
        "le": [None] * 5, "delta": [None, 4.0, 1.0, 3.0, 100.0], "dt": [None, 30.0, 30.0, 30.0, 30.0],
    }, schema_overrides={"le": pl.Float64})
    # the first sample has no increase; two series of one pod at 60 s add up; since cuts a start
    assert request_intervals(frame, 40.0, 90.0) == {"a": ((40.0, 60.0, 5.0), (60.0, 90.0, 3.0))}
    assert request_intervals(frame, 0.0, 60.0) == {"a": ((30.0, 60.0, 5.0),)}


def test_reuse_distances_count_the_pods_requests_back_to_the_cached_prefix() -> None:
    # request 2 reuses [1, 2] last seen in request 1 (1 back); request 3 reuses [1, 2, 3] from request 0 (3 back)
    r = _rebuilt([[1, 2, 3], [1, 2, 9], [1, 2, 7], [1, 2, 3, 8], [6]], [3, 1, 1, 1, 1], [0, 1, 2, 3, 4], [0] * 5)
    cached, dist = reuse_distances(r, np.arange(5))
    assert cached.tolist() == [2, 2, 3] and dist.tolist() == [1, 1, 3]


def test_the_tilted_choice_keeps_the_mix_and_meets_the_mean() -> None:
    rng = np.random.default_rng(3)
    options = np.tile(np.array([2, 8, 10]), (20_000, 1))
    got = options[np.arange(len(options)), tilted_choice(options, 6.5, rng)]
    assert abs(got.mean() - 6.5) < 0.1 and all((got == v).mean() > 0.1 for v in (2, 8, 10))  # not all pulled to 8
    assert (options[np.arange(len(options)), tilted_choice(options, 1.0, rng)] == 2).all()  # below every option
    weight = np.tile(np.array([1.0, 1.0, 8.0]), (20_000, 1))
    picked = tilted_choice(options, None, rng, weight)
    assert abs((picked == 2).mean() - 0.8) < 0.02  # in proportion to the weights


def test_a_replicas_intervals_survive_the_merge_encoding() -> None:
    counts = {"pod-0": PodRequests(3.0, 100.0, 50.0, ((0.0, 30.0, 1.0), (30.0, 60.0, 2.0)))}
    recorder = BlockRecorder(retain_s=3600.0, max_refs=10**6, engine_refs_per_s=1e9, clock=lambda: 0.0)
    history = RebuiltHistory.from_settings(recorder, lambda since, until: counts, lambda: 60.0, RebuildSpec())
    _r, got, _level = decode_state(encode_state(window_state(history, 60.0, 60.0)))
    assert got == counts
