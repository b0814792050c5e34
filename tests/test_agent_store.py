"""Window store, Prometheus semantics of quantiles and increases, and the read API."""
from __future__ import annotations

import math

import pytest

from agent.collect.counter_math import counter_delta, counter_increase, histogram_quantile
from agent.collect.resets import CounterResetDetector
from agent.collect.store import WindowStore
from contracts.tier_model import NO_LE, Signal

INF = math.inf


def test_counter_resets_never_give_negative_increases():
    assert counter_delta(150, 20) == 20
    assert counter_increase([100, 150, 20, 50]) == 50 + 20 + 30
    assert counter_increase([5]) == 0


@pytest.mark.parametrize("q, buckets, expected", [
    (0.5, [(0.1, 0), (0.2, 10), (INF, 10)], 0.15),
    (0.99, [(0.1, 0), (0.2, 10), (INF, 20)], 0.2),      # rank in +Inf bucket: largest finite bound
    (0.5, [(1.0, 4), (INF, 4)], 0.5),                    # first bucket interpolates from 0
    (0.5, [(-1.0, 4), (INF, 4)], -1.0),                  # non-positive first bound: the bound itself
    (0.5, [(1.0, 0), (INF, 0)], math.nan),               # no observations
    (0.5, [(1.0, 4)], math.nan),                         # no +Inf bucket
    (0.5, [(1.0, 4), (2.0, 3), (INF, 8)], 1.0),          # non-monotonic buckets are fixed up first
    (-0.1, [(1.0, 4), (INF, 4)], -INF),
    (1.5, [(1.0, 4), (INF, 4)], INF),
])
def test_histogram_quantile_matches_prometheus(q, buckets, expected):
    got = histogram_quantile(q, buckets)
    if math.isnan(expected):
        assert math.isnan(got)
    else:
        assert got == pytest.approx(expected)


def sig(name, value, le=NO_LE, kind="counter", pod="p", model="m", source="vllm_v1"):
    return Signal(pod, model, name, le, value, kind, source)


def scrape(gpu_lookup, gpu_hit, prompt, requests, ttft):
    out = [sig("gpu_lookup_tokens", gpu_lookup), sig("gpu_hit_tokens", gpu_hit),
           sig("prompt_tokens", prompt), sig("requests", requests),
           sig("gpu_usage_ratio", 0.5, kind="gauge")]
    out += [sig("ttft_seconds", c, le) for le, c in ttft]
    out += [sig("prompt_length_tokens", c, le) for le, c in ((100, requests / 2), (1000, requests), (INF, requests))]
    return out


def test_single_scrape_uses_lifetime_totals_then_the_window_takes_over():
    clock = [1000.0]
    store = WindowStore(retention_s=900, window_s=300, clock=lambda: clock[0])
    store.ingest(scrape(1000, 250, 1000, 10, [(0.1, 5), (1.0, 10), (INF, 10)]))
    assert store.hit_ratios() == {"gpu": 0.25}
    assert store.prompt_token_rate() is None  # no rate from one scrape
    clock[0] = 1015.0
    store.ingest(scrape(1600, 700, 1600, 16, [(0.1, 5), (1.0, 16), (INF, 16)]))
    assert store.hit_ratios() == {"gpu": 450 / 600}
    assert store.cumulative_hit_ratios() == {"gpu": 450 / 600}
    assert store.prompt_token_rate() == 600 / 15
    assert store.request_rate() == 6 / 15
    assert store.ttft_bucket_deltas() == [(0.1, 0.0), (1.0, 6.0), (INF, 6.0)]
    assert store.ttft_quantiles() == pytest.approx({0.5: 0.1 + 0.9 * 3 / 6, 0.95: 0.1 + 0.9 * 5.7 / 6,
                                                   0.99: 0.1 + 0.9 * 5.94 / 6})
    assert store.prompt_length_mix() == [(0.0, 100, 0.5), (100, 1000, 0.5), (1000, INF, 0.0)]
    values, sources = store.values()
    assert values["gpu_usage_ratio"] == 0.5 and sources["gpu_lookup_tokens"] == "vllm_v1"


def test_counter_reset_in_the_window_is_counted_from_zero():
    clock = [0.0]
    store = WindowStore(clock=lambda: clock[0])
    for t, (lookup, hit) in enumerate([(1000, 500), (1200, 600), (100, 10), (300, 110)]):
        clock[0] = t * 15.0
        report = store.ingest([sig("gpu_lookup_tokens", lookup), sig("gpu_hit_tokens", hit)])
        assert report.resets == (("p",) if t == 2 else ())
    # increases: 200 + 100 + 200 lookups, 100 + 10 + 100 hits
    assert store.hit_ratios() == {"gpu": 210 / 500}


def test_retention_drops_old_frames_and_the_window_ignores_them():
    clock = [0.0]
    store = WindowStore(retention_s=60, window_s=30, clock=lambda: clock[0])
    for t in range(0, 100, 10):
        clock[0] = float(t)
        store.ingest([sig("prompt_tokens", 100.0 * t)])
    assert store.frame()["ts"].min() >= 90 - 60
    assert store.rows == 7
    assert store.prompt_token_rate() == pytest.approx(100.0)
    assert store.values(window_s=30)[0]["prompt_tokens"] == pytest.approx(3000.0)  # 3 deltas of 1000


def test_per_pod_selection_and_pod_sums():
    store = WindowStore(clock=lambda: 0.0)
    store.ingest([sig("gpu_lookup_tokens", 100, pod="a"), sig("gpu_hit_tokens", 50, pod="a"),
                  sig("gpu_lookup_tokens", 300, pod="b"), sig("gpu_hit_tokens", 30, pod="b")])
    assert store.hit_ratios(pod="a") == {"gpu": 0.5}
    assert store.hit_ratios(pod="b") == {"gpu": 0.1}
    assert store.hit_ratios() == {"gpu": 80 / 400}


def test_reset_detector_per_origin():
    det = CounterResetDetector()
    assert det.observe("t1", [sig("gpu_hit_tokens", 10)]) == 0
    assert det.observe("t2", [sig("gpu_hit_tokens", 1)]) == 0  # other target: no comparison
    assert det.observe("t1", [sig("gpu_hit_tokens", 3), sig("gpu_usage_ratio", 0.1, kind="gauge")]) == 1
    assert det.observe("t1", [sig("gpu_hit_tokens", 4)]) == 0


def test_reset_detector_tells_a_restart_from_one_odd_series():
    det = CounterResetDetector()
    series = [sig(f"s{i}", 100.0) for i in range(4)]
    det.observe("t", series)
    det.observe("t", [sig("s0", 1.0), *series[1:]])  # one series went down: not a new process
    assert not det.restarted("t")
    det.observe("t", [sig("s0", 1.0), sig("s1", 2.0), sig("s2", 150.0), sig("s3", 3.0)])
    assert det.restarted("t")  # most went down (s2, a quiet one, climbed past its old value)
    det.observe("t", [sig("s0", 2.0), sig("s1", 3.0), sig("s2", 151.0), sig("s3", 4.0)])
    assert not det.restarted("t")


def _frame(signals):
    import polars as pl

    return pl.DataFrame({"pod": [s.pod for s in signals], "model": [s.model for s in signals],
                         "signal": [s.name for s in signals],
                         "le": [None if s.le != s.le else s.le for s in signals],
                         "source": [s.source for s in signals], "kind": [s.kind for s in signals],
                         "value": [s.value for s in signals]},
                        schema={"pod": pl.String, "model": pl.String, "signal": pl.String, "le": pl.Float64,
                                "source": pl.String, "kind": pl.String, "value": pl.Float64})


def test_a_series_born_between_reads_counts_from_zero_and_a_new_target_does_not():
    clock = [0.0]
    store = WindowStore(clock=lambda: clock[0])
    store.ingest([sig("gpu_lookup_tokens", 1000), sig("gpu_hit_tokens", 500)])
    clock[0] = 15.0
    # the target read before now shows a new series (vLLM's host-cache source, first used), and a
    # target never read before appears (a FUSE daemon with a lifetime total of its own)
    store.ingest([sig("gpu_lookup_tokens", 1200), sig("gpu_hit_tokens", 600), sig("cached_host_tokens", 40),
                  sig("l2_read_bytes", 9e9, model="", source="curvine_fuse")])
    clock[0] = 30.0
    store.ingest([sig("gpu_lookup_tokens", 1300), sig("gpu_hit_tokens", 650), sig("cached_host_tokens", 70),
                  sig("l2_read_bytes", 9.5e9, model="", source="curvine_fuse")])
    window = store.window()
    inc = {r["signal"]: r["increase"] for r in window.iter_rows(named=True)}
    assert inc["cached_host_tokens"] == 70  # born at 15 s: 40 then 30, from zero
    assert inc["l2_read_bytes"] == 0.5e9  # new target: its lifetime before 15 s is not this window's
    assert inc["gpu_lookup_tokens"] == 300


def test_frame_ingest_equals_signal_ingest_and_counts_new_series_from_zero():
    reads = [[sig("gpu_lookup_tokens", 1000), sig("gpu_hit_tokens", 500), sig("gpu_usage_ratio", 0.5, kind="gauge")],
             [sig("gpu_lookup_tokens", 1200), sig("gpu_hit_tokens", 600), sig("gpu_usage_ratio", 0.7, kind="gauge"),
              sig("ttft_seconds", 3, 0.5), sig("ttft_seconds", 4, INF)],
             [sig("gpu_lookup_tokens", 100), sig("gpu_hit_tokens", 50), sig("gpu_usage_ratio", 0.1, kind="gauge"),
              sig("ttft_seconds", 5, 0.5), sig("ttft_seconds", 9, INF)]]  # a restart at the third read
    clock = [0.0]
    by_signal, by_frame = WindowStore(clock=lambda: clock[0]), WindowStore(clock=lambda: clock[0])
    for t, signals in enumerate(reads):
        clock[0] = t * 15.0
        a = by_signal.ingest(signals)
        b = by_frame.ingest_frame(_frame(signals))
        assert a.resets == b.resets == (("p",) if t == 2 else ())
    a, b = by_signal.window(), by_frame.window()
    assert a.sort(["signal", "le"]).equals(b.sort(["signal", "le"]))
    ttft = {r["le"]: r["increase"] for r in b.iter_rows(named=True) if r["signal"] == "ttft_seconds"}
    assert ttft == {0.5: 3 + 2, INF: 4 + 5}  # born at 15 s (after a read): from zero, then deltas
