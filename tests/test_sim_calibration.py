"""The default profile reproduces the HyperPod + Curvine figures; the model table; profiles."""
from __future__ import annotations

import pytest

from contracts.knobs import Knobs
from simulator.cluster import ClusterError, ClusterSpec
from simulator.models import ModelError, get_model, models
from simulator.profile import PROFILE_DIR, ProfileError, get_profile, profile_names
from simulator.twin import Twin
from tests.support.twin_helpers import req


def miss_and_l2_hit(tokens: int, profile: str = "g6e-l40s"):
    """TTFT of a prompt on a cold pod (full miss), then on another pod reading it all from L2."""
    twin = Twin(ClusterSpec(pods=2, profile=profile), Knobs())  # LMCache defaults: 256-token chunks
    blocks = list(range(1, -(-tokens // 512) + 1))
    miss = twin.submit(req(0, blocks, input_length=tokens))
    hit = twin.submit(req(600_000, blocks, input_length=tokens))  # pod 1, idle queues
    assert (miss.pod, hit.pod, hit.gpu_hit_tokens, hit.cpu_hit_tokens) == ("pod-0", "pod-1", 0, 0)
    assert hit.l2_hit_tokens == tokens // 256 * 256
    return miss, hit


def test_2500_token_prompt_full_miss_and_full_l2_hit():
    miss, hit = miss_and_l2_hit(2500)
    assert miss.ttft_s == pytest.approx(0.774, rel=0.02)
    assert hit.ttft_s == pytest.approx(0.287, rel=0.02)
    assert miss.ttft_s / hit.ttft_s == pytest.approx(2.7, rel=0.03)


def test_500_token_prompt_l2_hit_is_about_1x():
    miss, hit = miss_and_l2_hit(500)
    assert miss.ttft_s / hit.ttft_s == pytest.approx(1.0, abs=0.05)


def test_1925_token_cross_node_l2_read_takes_about_56_ms():
    lat = get_profile("g6e-l40s").latency
    bpt = get_model("llama-3.1-8b").kv_bytes_per_token
    assert lat.l2_read_s(8, 1925 * bpt) == pytest.approx(0.056, rel=0.02)  # 1,925 tokens in 8 x 256-token files
    _, hit = miss_and_l2_hit(1925)  # the twin reads the 7 full chunks (1,792 tokens)
    assert hit.l2_read_s == pytest.approx(lat.l2_read_s(7, 1792 * bpt))
    assert 0.045 < hit.l2_read_s < 0.056


def test_h100_profile_is_faster_everywhere():
    for tokens in (500, 2500, 8000):
        m_l40, h_l40 = miss_and_l2_hit(tokens)
        m_h100, h_h100 = miss_and_l2_hit(tokens, "p5-h100")
        assert m_h100.ttft_s < m_l40.ttft_s and h_h100.ttft_s < h_l40.ttft_s


def test_l2_pays_off_more_for_longer_prompts():
    ratios = [m.ttft_s / h.ttft_s for m, h in (miss_and_l2_hit(n) for n in (500, 1000, 2500, 8000))]
    assert ratios == sorted(ratios) and ratios[-1] > 3


def test_model_table_kv_bytes_per_token():
    expect = {"llama-3.1-8b": 131_072, "llama-3.1-70b": 327_680, "qwen2.5-7b": 57_344, "qwen2.5-32b": 262_144,
              "deepseek-v2-lite": 27 * (512 + 64) * 2, "deepseek-v3": 61 * (512 + 64) * 1,
              "tiny-llama": 2 * 4 * 4 * 64 * 2}  # the engine: 24 MiB of KV = 6,144 tokens
    assert {name: m.kv_bytes_per_token for name, m in models().items()} == expect
    assert get_model("llama-3.1-8b").tokens_for_gib(5) == 40_960
    with pytest.raises(ModelError, match="valid choices: llama-3.1-8b"):
        get_model("gpt-5")


def test_capacities_from_gib_and_zero_disables():
    caps = ClusterSpec().capacities(Knobs(cpu_gib=2.0))
    assert (caps.gpu_tokens, caps.cpu_tokens, caps.l2_tokens) == (196_608, 16_384, 16_777_216)
    twin = Twin(ClusterSpec(pods=1, gpu_tokens=0, cpu_tokens=0, l2_tokens=0), Knobs())
    o = twin.submit(req(0, [1, 2]))
    o = twin.submit(req(1, [1, 2]))
    assert o.computed_tokens == 1024 and twin.pod_counters(0).get("vllm:external_prefix_cache_queries_total") is None


def test_impossible_and_invalid_capacities_are_clear_errors():
    with pytest.raises(ClusterError, match="gpu capacity: .* g6e-l40s GPU has 48 GiB"):
        ClusterSpec(gpu_tokens=10**7).capacities(Knobs())
    with pytest.raises(ClusterError, match="cpu capacity: 200.0 GiB per pod exceeds"):
        ClusterSpec().capacities(Knobs(cpu_gib=200.0))
    with pytest.raises(ClusterError, match=r"l2_tokens: must be an integer >= 0 \(0 disables the tier\), got -1"):
        ClusterSpec(l2_tokens=-1)
    with pytest.raises(ClusterError, match="pods: must be an integer in 1..1024"):
        ClusterSpec(pods=0)
    with pytest.raises(ClusterError, match="valid choices: cpu-tiny-llama, g6e-l40s, p5-h100"):
        ClusterSpec(profile="tpu")
    assert profile_names() == ["cpu-tiny-llama", "g6e-l40s", "p5-h100"]


def test_profile_file_errors_name_the_key(tmp_path):
    text = (PROFILE_DIR / "g6e-l40s.yaml").read_text()
    bad = tmp_path / "x.yaml"
    bad.write_text(text.replace("prefill_s_per_token: 0.00026675908076298705", "prefill_s_per_token: -1"))
    with pytest.raises(ProfileError, match=r"x\.yaml: latency\.prefill_s_per_token: must be a positive number"):
        get_profile(str(bad))
    bad.write_text(text.replace("gpu_kv_gib:", "gpu_kv_gb:"))
    with pytest.raises(ProfileError, match=r"unknown key\(s\) \['gpu_kv_gb'\], missing key\(s\) \['gpu_kv_gib'\]"):
        get_profile(str(bad))
