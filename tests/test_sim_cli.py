"""`tierpilot replay`: outputs and bad-input errors (in-process through click's runner)."""
from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from agent.cli import main


def run(*args: str):
    return CliRunner().invoke(main, ["replay", *args], catch_exceptions=False)


@pytest.fixture
def tiny_trace(tmp_path):
    rows = [(0, 1100, [1, 2, 3]), (500, 1100, [1, 2, 3]), (900, 600, [4, 5]), (1500, 1100, [1, 2, 6])]
    path = tmp_path / "tiny.jsonl"
    path.write_text("".join(json.dumps({"timestamp": t, "input_length": n, "output_length": 10, "hash_ids": h}) + "\n"
                            for t, n, h in rows))
    return path


def test_json_output_on_default_synthetic_workload():
    r = run("--duration", "60", "--json")
    assert r.exit_code == 0, r.output
    s = json.loads(r.output)
    assert 0 < s["hit_ratio"] <= 1 and s["ttft_p95_s"] >= s["ttft_p50_s"] > 0
    for tier in ("gpu", "cpu", "l2"):
        assert {"lookup_tokens", "hit_tokens", "evictions"} <= set(s["tiers"][tier])
    assert s["knobs"] == {"chunk_tokens": 256, "cpu_gib": 5.0, "cpu_eviction": "lru", "l2_eviction": "lru",
                          "l2_high_watermark": 1.0, "l2_low_watermark": 1.0, "router": "roundrobin",
                          "l2_min_prompt_tokens": 0, "router_temperature": 0.0, "kv_penalty_host": 0.8,
                          "kv_penalty_external": 0.6}
    assert s["workload"] == "synthetic 'shift' (seed 0)" and s["profile"] == "g6e-l40s"


def test_pure_replay_mode_on_a_trace(tiny_trace):
    r = run("--trace", str(tiny_trace), "--pods", "1", "--cpu-tokens", "0", "--l2-tokens", "0",
            "--chunk-tokens", "512", "--json")
    s = json.loads(r.output)
    # hits: request 2 reuses 2 full blocks, request 4 reuses 2 (block 3 differs and is partial)
    assert s["tiers"]["gpu"]["hit_tokens"] == 2048 and s["hit_ratio"] == pytest.approx(2048 / 3900)
    assert s["tiers"]["cpu"]["lookup_tokens"] == 0 and s["tiers"]["l2"]["capacity_tokens"] == 0


def test_table_output_and_plot(tiny_trace, tmp_path):
    png = tmp_path / "p.png"
    r = run("--trace", str(tiny_trace), "--router", "prefixaware", "--l2-eviction", "arc", "--plot", str(png))
    assert r.exit_code == 0, r.output
    assert "token hit ratio" in r.output and "GPU" in r.output and "miss: routing" in r.output
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 10_000


def test_config_file_with_command_line_override(tiny_trace, tmp_path):
    cfg = tmp_path / "best.yaml"
    cfg.write_text("knobs:\n  chunk_tokens: 512\n  router: session\n  cpu_eviction: lfu\n")
    s = json.loads(run("--trace", str(tiny_trace), "--config", str(cfg), "--router", "kvaware", "--json").output)
    assert (s["knobs"]["chunk_tokens"], s["knobs"]["router"], s["knobs"]["cpu_eviction"]) == (512, "kvaware", "lfu")
    cfg.write_text("chunk_tokens: 300\n")
    r = run("--trace", str(tiny_trace), "--config", str(cfg))
    assert r.exit_code == 1 and "chunk_tokens: invalid value 300; valid choices: 64, 128" in r.output


def test_gib_capacities_use_the_model(tiny_trace):
    s = json.loads(run("--trace", str(tiny_trace), "--gpu-gib", "1", "--l2-gib", "2", "--cpu-gib", "0.5",
                       "--model", "qwen2.5-7b", "--json").output)
    assert s["tiers"]["gpu"]["capacity_tokens"] == 2**30 // 57_344
    assert s["tiers"]["l2"]["capacity_tokens"] == 2 * 2**30 // 57_344
    assert s["tiers"]["cpu"]["capacity_tokens"] == 2**29 // 57_344 and s["model"] == "qwen2.5-7b"


@pytest.mark.parametrize(
    ("args", "code", "message"),
    [
        (["--router", "random"], 2, "'random' is not one of 'roundrobin', 'session', 'prefixaware', 'kvaware'"),
        (["--l2-eviction", "mru"], 2, "'mru' is not one of 'lru', 'lfu', 'fifo', 's3fifo', 'arc'"),
        (["--workload", "chat"], 2, "'chat' is not one of 'rag', 'sessions', 'shift', 'short'"),
        (["--chunk-tokens", "100"], 2, "'100' is not one of '64', '128', '256', '512', '1024', '2048'"),
        (["--model", "gpt"], 2, "'gpt' is not one of 'llama-3.1-8b'"),
        (["--profile", "tpu-v5"], 1, "unknown profile 'tpu-v5'; valid choices: cpu-tiny-llama, g6e-l40s, p5-h100"),
        (["--gpu-tokens", "-5"], 2, "-5 is not in the range x>=0"),
        (["--gpu-tokens", "100000000"], 1, "gpu capacity: 100,000,000 tokens of llama-3.1-8b need"),
        (["--cpu-gib", "500"], 1, "cpu capacity: 500.0 GiB per pod exceeds the g6e-l40s host memory"),
        (["--cpu-gib", "1", "--cpu-tokens", "5"], 2, "give either --cpu-tokens or --cpu-gib, not both"),
        (["--pods", "0"], 2, "0 is not in the range 1<=x<=1024"),
        (["--trace", "a.jsonl", "--workload", "rag"], 2, "give either --trace or --workload, not both"),
    ],
)
def test_bad_input_errors(args, code, message):
    r = run("--duration", "5", *args)
    assert r.exit_code == code
    assert message in " ".join(r.output.split())


def test_malformed_trace_names_file_and_line(tmp_path):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"timestamp": 0, "input_length": 10, "output_length": 1, "hash_ids": [1]}\n{"timestamp": 1}\n')
    r = run("--trace", str(bad))
    assert r.exit_code == 1 and f"{bad}:2: missing field(s) input_length, output_length, hash_ids" in r.output
