"""The twin's tier terms fitted to a real tiered engine (simulator/tier_fit.py), without an engine:
the CPU-tier load's fixed latency in both replay paths, the transfer fit, vLLM-style per-tier hit
ratios of a replay, and the CPU tier's size as vLLM computes it."""
from __future__ import annotations

import dataclasses

import numpy as np
import polars as pl
import pytest

from contracts.knobs import Knobs
from emulator.engines.tier_probe import cpu_tier_tokens, parse_counters
from emulator.engines.tiering import TieringConfig
from simulator.chunking import chunk_hashes
from simulator.cluster import ClusterSpec
from simulator.profile import PROFILE_DIR, ProfileError, get_profile
from simulator.profile_fit import FitError
from simulator.replay import replay
from simulator.tier_fit import TransferFit, counter_ratios, engine_style_ratios, fit_transfer, with_tier_fit
from simulator.twin import Twin
from tests.support.twin_helpers import frame, req

CPU = get_profile("cpu-tiny-llama")
BPT = 4096  # tiny-llama's KV bytes per token in the twin's model table (bf16)


def _profile():
    fit = TransferFit(0.004, 2e-6, 10, 0.0, 0.004, 2e-6)  # CPU tier: 4 ms + 2 us/token
    fs = TransferFit(0.009, 5e-6, 10, 0.0, 0.009, 5e-6)  # fs tier: 9 ms + 5 us/token
    lat = dataclasses.replace(CPU.latency, request_overhead_s=0.01, prefill_s_per_token=3e-5,
                              attention_s_per_token2=0.0)
    return with_tier_fit(dataclasses.replace(CPU, latency=lat), fit, fs)


@pytest.mark.parametrize("tier", ["cpu", "l2"])
def test_a_tier_hit_pays_its_fixed_part_and_its_bytes_in_both_replay_paths(tier):
    prof = _profile()
    cpu, l2 = (4096, 0) if tier == "cpu" else (0, 1 << 20)
    cluster = ClusterSpec(pods=1, gpu_tokens=1024, cpu_tokens=cpu, l2_tokens=l2, profile=prof)
    knobs = Knobs(chunk_tokens=64, cpu_gib=0.0)
    # the second request pushes the first out of the KV cache; the third finds it in the tier below
    reqs = [req(0, [1, 2]), req(10_000, [3, 4]), req(20_000, [1, 2, 5])]
    twin = Twin(cluster, knobs)
    out = [twin.submit(r) for r in reqs]
    hit = out[2].cpu_hit_tokens if tier == "cpu" else out[2].l2_hit_tokens
    assert hit == 1024 and out[2].computed_tokens == 512
    fixed, per_token = (0.004, 2e-6) if tier == "cpu" else (0.009, 5e-6)
    assert out[2].ttft_s == pytest.approx(0.01 + 512 * 3e-5 + fixed + 1024 * per_token, rel=1e-6)
    assert out[0].ttft_s == pytest.approx(0.01 + 1024 * 3e-5)  # a cold request pays neither
    batch = replay(frame(reqs), cluster, knobs).requests["ttft_s"].to_list()  # the fast loop
    assert batch == pytest.approx([o.ttft_s for o in out])


def test_the_cpu_load_overhead_is_optional_and_never_negative(tmp_path):
    assert get_profile("g6e-l40s").latency.cpu_load_overhead_s == 0.0
    text = (PROFILE_DIR / "cpu-tiny-llama.yaml").read_text()
    bad = tmp_path / "p.yaml"
    bad.write_text("\n".join(line for line in text.splitlines() if not line.startswith("  cpu_load_overhead_s:")))
    assert get_profile(str(bad)).latency.cpu_load_overhead_s == 0.0
    bad.write_text("\n".join(line if not line.startswith("  cpu_load_overhead_s:") else "  cpu_load_overhead_s: -1"
                             for line in text.splitlines()) + ("" if "cpu_load_overhead_s" in text
                                                               else "\n  cpu_load_overhead_s: -1"))
    with pytest.raises(ProfileError, match=r"latency\.cpu_load_overhead_s: must be a finite number >= 0"):
        get_profile(str(bad))


def test_transfer_fit_recovers_the_fixed_part_given_the_per_token_cost():
    rng = np.random.default_rng(5)
    tokens = rng.integers(128, 1800, 60)
    extra = 0.006 + 3e-6 * tokens + rng.normal(0, 5e-4, 60)
    fit = fit_transfer(tokens, extra, 3e-6)
    assert fit.fixed_s == pytest.approx(0.006, abs=3e-4)
    assert fit.free_per_token_s == pytest.approx(3e-6, rel=0.3) and fit.rms_s < 1e-3
    assert fit.predict(1000) == pytest.approx(fit.fixed_s + 3e-3)
    assert fit_transfer(tokens, 1e-6 * tokens, 3e-6).fixed_s == 0.0  # faster than the copies: no fixed part
    with pytest.raises(FitError, match="at least 5 samples"):
        fit_transfer([1, 2], [0.1, 0.2], 1e-6)
    with pytest.raises(FitError, match="finite number >= 0"):
        fit_transfer(tokens, extra, -1.0)


def test_byte_rates_make_the_fitted_cost_follow_the_chunk_size():
    lat = _profile().latency
    for chunk in (64, 256):
        assert lat.cpu_load_s(1, chunk * BPT) == pytest.approx(chunk * 2e-6, rel=1e-4)
        assert lat.l2_read_s(1, chunk * BPT) == pytest.approx(chunk * 5e-6, rel=1e-4)
    assert (lat.cpu_load_overhead_s, lat.l2_retrieve_overhead_s) == (0.004, 0.009)


def test_replay_ratios_are_counted_as_vllm_counts_its_tiers():
    r = pl.DataFrame({  # tokens; 64-token chunks
        "prompt_tokens": [1000, 1000, 1000, 640, 100],
        "gpu_hit_tokens": [0, 512, 0, 640, 0],  # 15 full chunks; the fourth is all in the KV cache
        "cpu_hit_tokens": [0, 128, 640, 0, 0],
        "l2_hit_tokens": [0, 64, 256, 0, 0],
    })
    t = engine_style_ratios(r, 64)
    # with an fs tier the CPU tier is asked for every full chunk after the KV-cache hit (the fs
    # tier's first answer is "retry" and the scan goes on); the fs tier for its hits and the chunk
    # that missed both (none when the lookup ran to the last full chunk)
    assert (t.l1_queries, t.l1_hits) == (15 + 7 + 15 + 0 + 1, 2 + 10)
    assert (t.l2_queries, t.l2_hits) == (1 + (1 + 1) + (4 + 1) + 0 + 1, 1 + 4)
    assert (t.l0_queries, t.l0_hits) == (3740, 1152)
    alone = engine_style_ratios(r, 64, l2=False)  # no fs tier: the CPU tier's lookup stops at its first miss
    assert (alone.l1_queries, alone.l2_queries) == (1 + (2 + 1) + (10 + 1) + 0 + 1, 0.0)


def test_engine_ratios_come_from_the_increase_of_its_own_counters():
    lines = ['vllm:prefix_cache_queries_total{engine="0"} 5000.0', 'vllm:prefix_cache_hits_total{engine="0"} 1000.0',
             'vllm:kv_offload_tiering_chunk_queries_total{engine="0",tier="0:primary"} 40.0',
             'vllm:kv_offload_tiering_chunk_hits_total{engine="0",tier="0:primary"} 10.0',
             'vllm:kv_offload_tiering_chunk_queries_total{engine="0",tier="1:fs"} 30.0',
             'vllm:kv_offload_tiering_chunk_hits_total{engine="0",tier="1:fs"} 24.0']
    text = "".join(line + "\n" for line in lines)
    after = parse_counters("# TYPE vllm:prefix_cache_queries counter\n" + text)
    before = {k: v / 2 for k, v in after.items()}
    t = counter_ratios(before, after)
    assert (t.l0, t.l1, t.l2) == (0.2, 0.25, 0.8)


def test_cpu_tier_size_follows_vllms_page_aligned_chunks():
    cfg = TieringConfig(cpu_bytes=48 << 20)
    assert cpu_tier_tokens(cfg, 64, 4096) == (48 << 20) // (64 * 4096) * 64  # 256 KiB chunks: aligned
    assert cpu_tier_tokens(cfg, 32, 4100) == (48 << 20) // (32 * 4096 + 4096) * 32  # padded to the next page


@pytest.mark.parametrize("tier", ["gpu", "cpu"])
def test_native_keeps_a_prompts_prefix_where_prompt_order_keeps_its_tail(tier):
    # 16 chunks of room in the tier under test; the second request pushes 8 chunks of the first out
    gpu, cpu = (1024, 0) if tier == "gpu" else (64, 1024)
    reqs = [req(0, [1, 2]), req(10_000, [3]), req(20_000, [1, 2, 4])]
    for native_tiering, prefix in ((False, 0), (True, 512)):
        cluster = ClusterSpec(pods=1, gpu_tokens=gpu, cpu_tokens=cpu, l2_tokens=0, native_tiering=native_tiering)
        knobs = Knobs(chunk_tokens=64, cpu_gib=0.0)
        seen = []
        twin = Twin(cluster, knobs)
        last = [twin.submit(r) for r in reqs][-1]
        traced = Twin(cluster, knobs, event_sink=seen.append)
        last_traced = [traced.submit(r) for r in reqs][-1]
        hit = "gpu_hit_tokens" if tier == "gpu" else "cpu_hit_tokens"
        assert getattr(last, hit) == getattr(last_traced, hit) == prefix
        assert replay(frame(reqs), cluster, knobs).requests[hit].to_list()[-1] == prefix
    with pytest.raises(ValueError, match="native_tiering: must be true or false"):
        ClusterSpec(pods=1, native_tiering=1)


def test_native_tiering_offers_a_whole_prompt_to_the_cpu_tier_when_nothing_came_from_it():
    # vLLM's OffloadingConnector stores from chunk 0 unless the request loaded from the connector,
    # so KV-cache hits go back to the CPU tier; LMCache's store covers only the computed chunks
    reqs = [req(0, [1]), req(10_000, [2]), req(20_000, [1])]  # the third is all KV-cache hit
    block1 = set(chunk_hashes([1], 512, 64))
    for native, in_cpu in ((False, False), (True, True)):
        cluster = ClusterSpec(pods=1, gpu_tokens=1024, cpu_tokens=512, l2_tokens=0, native_tiering=native)
        for sink in (None, [].append):
            twin = Twin(cluster, Knobs(chunk_tokens=64, cpu_gib=0.0), event_sink=sink)
            out = [twin.submit(r) for r in reqs]
            assert out[2].gpu_hit_tokens == 512
            assert (twin.resident("pod-0", "CPU") == block1) is in_cpu


def test_the_base_fit_drops_the_attention_term_only_when_the_samples_make_it_negative():
    from emulator.engines.tier_probe import Sample
    from emulator.engines.tier_twin import fit_base

    ns = [100, 200, 300, 400, 500, 600, 700, 800, 900, 1000, 150, 650]
    convex = [Sample("cold", n, 0, 0.02 + 1e-4 * n + 6e-8 * n * n / 2) for n in ns]
    fit = fit_base(convex)
    assert fit.attention_s_per_token2 == pytest.approx(6e-8, rel=1e-6) and fit.r2 == pytest.approx(1.0)
    concave = [Sample("cold", n, 0, 0.05 + 2e-4 * n - 6e-8 * n * n / 2) for n in ns]  # a slow first request's shape
    fit = fit_base(concave)
    assert fit.attention_s_per_token2 == 0.0 and fit.overhead_s > 0 and fit.prefill_s_per_token > 0
    with pytest.raises(FitError, match="at least"):
        fit_base(concave[:5])
