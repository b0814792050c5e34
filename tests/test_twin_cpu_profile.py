"""The CPU engine's profile: the twin's attention term (both replay paths), the optional profile
key, the service-time fit, and the token-id prompts that carry a workload's sharing to the engine."""
from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from contracts.knobs import Knobs
from emulator.engines.prompts import PromptBuilder, prompts
from simulator.cluster import ClusterSpec
from simulator.profile import PROFILE_DIR, ProfileError, get_profile
from simulator.profile_fit import FitError, fit_service_latency, with_service_fit
from simulator.replay import replay
from simulator.twin import Twin
from tests.support.twin_helpers import frame, req

CPU = get_profile("cpu-tiny-llama")


def _profile(overhead=0.01, per_token=3e-5, attention=2e-8):
    lat = dataclasses.replace(CPU.latency, request_overhead_s=overhead, prefill_s_per_token=per_token,
                              attention_s_per_token2=attention)
    return dataclasses.replace(CPU, latency=lat)


def test_attention_term_is_paid_per_computed_token_times_its_context_in_both_replay_paths():
    prof = _profile()
    cluster = ClusterSpec(pods=1, gpu_tokens=6144, cpu_tokens=0, l2_tokens=0, profile=prof)
    knobs = Knobs(chunk_tokens=64, cpu_gib=0.0)
    reqs = [req(0, [1, 2]), req(10_000, [1, 2, 3])]  # the second finds 1,024 tokens cached, computes 512
    twin = Twin(cluster, knobs)
    first, second = twin.submit(reqs[0]), twin.submit(reqs[1])
    assert first.ttft_s == pytest.approx(0.01 + 1024 * 3e-5 + 1024 * 512 * 2e-8)
    assert second.computed_tokens == 512
    assert second.ttft_s == pytest.approx(0.01 + 512 * 3e-5 + 512 * (1024 + 256) * 2e-8)
    batch = replay(frame(reqs), cluster, knobs).requests["ttft_s"].to_list()  # the fast loop
    assert batch == pytest.approx([first.ttft_s, second.ttft_s])
    # the GPU profiles have no attention term: a prefill stays linear in the computed tokens
    assert get_profile("g6e-l40s").latency.attention_s_per_token2 == 0.0


def test_a_busy_overhead_holds_the_pod_and_a_free_one_does_not_in_both_replay_paths():
    knobs = Knobs(chunk_tokens=64, cpu_gib=0.0)
    reqs = [req(0, [1, 2]), req(1, [3, 4])]  # 1 ms apart: the second queues behind the first
    service = 1024 * 3e-5 + 1024 * 512 * 2e-8
    for share, wait in ((1.0, 0.05 + service), (0.0, service), (0.4, 0.02 + service)):
        prof = _profile(overhead=0.05)
        prof = dataclasses.replace(prof, latency=dataclasses.replace(prof.latency, overhead_busy_share=share))
        cluster = ClusterSpec(pods=1, gpu_tokens=6144, cpu_tokens=0, l2_tokens=0, profile=prof)
        twin = Twin(cluster, knobs)
        first, second = twin.submit(reqs[0]), twin.submit(reqs[1])
        assert first.ttft_s == pytest.approx(0.05 + service)  # alone, the overhead is paid either way
        assert second.ttft_s == pytest.approx(wait - 0.001 + 0.05 + service)
        batch = replay(frame(reqs), cluster, knobs).requests["ttft_s"].to_list()
        assert batch == pytest.approx([first.ttft_s, second.ttft_s])
    assert CPU.latency.overhead_busy_share == 1.0  # the one-core engine: API server and engine share it
    assert get_profile("g6e-l40s").latency.overhead_busy_share == 0.0


def test_overhead_busy_share_is_a_fraction(tmp_path):
    text = (PROFILE_DIR / "cpu-tiny-llama.yaml").read_text()
    key = next(line for line in text.splitlines() if line.startswith("  overhead_busy_share:"))
    bad = tmp_path / "p.yaml"
    bad.write_text(text.replace(key, "  overhead_busy_share: 1.5"))
    with pytest.raises(ProfileError, match=r"latency\.overhead_busy_share: must be between 0 and 1"):
        get_profile(str(bad))


def test_attention_key_is_optional_and_refuses_negative_values(tmp_path):
    text = (PROFILE_DIR / "cpu-tiny-llama.yaml").read_text()
    bad = tmp_path / "p.yaml"
    bad.write_text("\n".join(line for line in text.splitlines() if not line.startswith("  attention_s_per_token2:")))
    assert get_profile(str(bad)).latency.attention_s_per_token2 == 0.0
    key = next(line for line in text.splitlines() if line.startswith("  attention_s_per_token2:"))
    bad.write_text(text.replace(key, "  attention_s_per_token2: -1"))
    with pytest.raises(ProfileError, match=r"latency\.attention_s_per_token2: must be a finite number >= 0"):
        get_profile(str(bad))


def test_fit_recovers_known_terms_and_refuses_degenerate_input():
    rng = np.random.default_rng(3)
    computed = rng.integers(30, 1900, 200)
    cached = rng.choice([0, 512, 1024], 200)
    truth = _profile(0.012, 2.8e-5, 1.7e-8).latency
    ttft = [truth.request_overhead_s + truth.prefill_s(int(c), int(h)) + rng.normal(0, 2e-4)
            for c, h in zip(computed, cached, strict=True)]
    fit = fit_service_latency(computed, cached, ttft)
    assert fit.overhead_s == pytest.approx(0.012, rel=0.05)
    assert fit.prefill_s_per_token == pytest.approx(2.8e-5, rel=0.05)
    assert fit.attention_s_per_token2 == pytest.approx(1.7e-8, rel=0.05)
    assert fit.r2 > 0.99
    linear = fit_service_latency(computed, cached, ttft, attention=False)
    assert linear.attention_s_per_token2 == 0.0 and linear.rms_s > 3 * fit.rms_s
    prof = with_service_fit(CPU, fit, decode_s_per_token=0.003)
    assert (prof.latency.request_overhead_s, prof.latency.decode_s_per_token) == (fit.overhead_s, 0.003)
    with pytest.raises(FitError, match="at least 10 samples"):
        fit_service_latency([1, 2], [0, 0], [0.1, 0.2])
    with pytest.raises(FitError, match="do not vary"):
        fit_service_latency([100] * 20, [0] * 20, [0.1] * 20)


def test_prompts_share_tokens_exactly_where_the_workload_shares_blocks():
    b = PromptBuilder(salt=1)
    wl = frame([req(0, [1, 2], input_length=900), req(1, [1, 3], input_length=700), req(2, [4], input_length=10)])
    a, c, d = list(prompts(wl, b))
    assert (len(a), len(c), len(d)) == (900, 700, 10)
    assert a[:512] == c[:512] and a[512:700] != c[512:700]
    assert all(4 <= t < 4096 for t in a + c + d)  # never the tokenizer's special ids
    assert PromptBuilder(salt=1).prompt([1, 2], 900) == a  # deterministic
    assert PromptBuilder(salt=2).prompt([1, 2], 900)[:512] != a[:512]  # a new salt: nothing in common
    with pytest.raises(ValueError, match="need 2 block ids"):
        b.prompt([1], 600)
