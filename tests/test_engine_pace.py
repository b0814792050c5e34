"""Pacing the real-engine demo: the speed measured in the warm-up scales the CPU profile, and the
stream's rate keeps each core busy the wanted share of the time on that profile (pure)."""
from __future__ import annotations

import pytest

from contracts.knobs import Knobs
from emulator.demo.engine_pace import Sample, mean_service_s, paced_rate, scaled_profile, speed_factor
from emulator.demo.engine_run import EngineDemoSettings, engine_workload, pace_stream, warm_up_prompts
from simulator.profile import get_profile

CPU = get_profile("cpu-tiny-llama")
KNOBS = Knobs(chunk_tokens=64, cpu_gib=0.0)


def _isolated(profile, n: int, cached: int = 0) -> float:
    return profile.latency.request_overhead_s + profile.latency.prefill_s(n - cached, cached)


def test_speed_factor_is_the_median_ratio_to_the_profile():
    slow = [Sample(3.0 * _isolated(CPU, n), n, 0) for n in (300, 700, 1100, 1500)]
    assert speed_factor(slow, CPU) == pytest.approx(3.0)
    mixed = [*slow, Sample(100.0, 500, 0)]  # one stall does not move the median
    assert speed_factor(mixed, CPU) == pytest.approx(3.0)
    with pytest.raises(ValueError, match="no usable warm-up request"):
        speed_factor([Sample(0.0, 100, 0)], CPU)


def test_scaled_profile_scales_every_service_term_and_is_named():
    p = scaled_profile(CPU, 2.5)
    assert _isolated(p, 1000) == pytest.approx(2.5 * _isolated(CPU, 1000))
    assert p.latency.decode_s_per_token == pytest.approx(2.5 * CPU.latency.decode_s_per_token)
    assert p.latency.overhead_busy_share == CPU.latency.overhead_busy_share
    assert "x2.50" in p.description
    with pytest.raises(ValueError, match="positive"):
        scaled_profile(CPU, 0.0)


def test_paced_rate_keeps_each_core_at_the_wanted_utilisation():
    def wl(rate: float):
        return engine_workload(120.0, 7, rate).frame

    fast_rate, fast_service = paced_rate(wl, CPU, engines=2, fleets=2, kv_tokens=6144, knobs=KNOBS, utilisation=0.5)
    slow = scaled_profile(CPU, 4.0)
    slow_rate, slow_service = paced_rate(wl, slow, engines=2, fleets=2, kv_tokens=6144, knobs=KNOBS, utilisation=0.5)
    assert slow_service == pytest.approx(4.0 * fast_service, rel=0.02)  # the same requests, 4x slower engines
    assert slow_rate == pytest.approx(fast_rate / 4.0, rel=0.02)
    # each core serves one engine of each of 2 fleets: 2 x (rate / 2 engines) x service = 0.5
    assert 2 * (slow_rate / 2) * slow_service == pytest.approx(0.5, rel=0.01)
    assert mean_service_s(wl(slow_rate), slow, pods=2, kv_tokens=6144, knobs=KNOBS) == pytest.approx(
        slow_service, rel=0.1)  # the structure barely moves with the rate
    with pytest.raises(ValueError, match="utilisation"):
        paced_rate(wl, CPU, engines=2, fleets=2, kv_tokens=6144, knobs=KNOBS, utilisation=1.5)


def test_pace_stream_uses_a_given_rate_or_paces_and_always_scales_the_twin():
    samples = [Sample(2.0 * _isolated(CPU, n), n, 0) for n in (400, 800, 1200)]
    given = pace_stream(EngineDemoSettings(rate_rps=3.0), samples, fleets=2)
    assert given.rate_rps == 3.0 and "given" in given.text
    paced = pace_stream(EngineDemoSettings(), samples, fleets=2)
    assert 0.2 <= paced.rate_rps <= 20 and "50% busy" in paced.text
    assert paced.profile.latency.prefill_s_per_token == pytest.approx(2.0 * CPU.latency.prefill_s_per_token)
    with pytest.raises(ValueError, match="utilisation"):
        EngineDemoSettings(utilisation=0.95)


def test_warm_up_prompts_span_300_to_1400_tokens_and_share_nothing():
    prompts = warm_up_prompts(24)
    assert sorted({len(p) for p in prompts}) == list(range(300, 1500, 100))
    firsts = {tuple(p[:8]) for p in prompts}
    assert len(firsts) == len(prompts)  # no two start with the same block: nothing cached across them
