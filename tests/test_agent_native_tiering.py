"""vLLM's native tiering (TieringOffloadingSpec: a CPU primary tier, L1, and an fs tier, L2) read
from the real 0.32 capture: the agent's per-tier hit ratios and L2 read time are the engine's own
counters. The expected figures are the capture's values, read off its lines by hand."""
from __future__ import annotations

import re

import pytest

from agent.collect.mapping import load_mappings
from agent.collect.normalise import normalise, resolve
from agent.collect.parse import parse
from agent.collect.snapshot import build_snapshot
from agent.collect.store import WindowStore
from agent.collect.tiers import offload_chunk_tokens
from contracts.tier_model import Target
from exporters.prom import build_registry

MAPPINGS = load_mappings()
CAPTURE = "vllm_0_32_cpu_native_tiering_metrics.prom"
MODEL = "tiny-llama"

# From the capture, by hand:
#   chunk_queries_total{tier="0:primary"} 3530   chunk_hits_total{tier="0:primary"} 368
#   chunk_queries_total{tier="1:fs"}       539   chunk_hits_total{tier="1:fs"}       496
#   read_time_total{tier="1:fs"} 1.0412832689989955, read_bytes_total{tier="1:fs"} 1.30023424e+08
#   prompt_tokens_cached_by_source_total host 11776, disk 15872; cache_config_info block_size "32"
L1_QUERIES, L1_HITS, L2_QUERIES, L2_HITS = 3530, 368, 539, 496
L2_READ_SECONDS, L2_READ_BYTES = 1.0412832689989955, 1.30023424e+08
HOST_TOKENS, DISK_TOKENS, BLOCK = 11776, 15872, 32


@pytest.fixture(scope="module")
def capture(samples_dir) -> str:
    return (samples_dir / CAPTURE).read_text()


def _bump(text: str, name: str, tier_or_source: str, by: float) -> str:
    """The capture with one counter series increased by `by` (a later scrape of the same engine)."""
    pattern = re.compile(rf'^({re.escape(name)}{{[^}}]*"{re.escape(tier_or_source)}"}}) (\S+)$', re.MULTILINE)
    out, n = pattern.subn(lambda m: f"{m.group(1)} {float(m.group(2)) + by!r}", text)
    assert n == 1, (name, tier_or_source)
    return out


def _snapshot(*scrapes: tuple[float, str]):
    store = WindowStore()
    target = Target("http://engine:8000/metrics", "vllm", "engine-0")
    for ts, text in scrapes:
        signals = normalise(target, parse(text, MAPPINGS.wanted["vllm"]), MAPPINGS).signals
        store.ingest(resolve(signals, MAPPINGS), ts=ts)
    now = scrapes[-1][0]
    return build_snapshot(store.window(now=now), [], taken_at=now)


def test_every_tiering_series_of_the_capture_is_read(capture):
    names = {line.split("{", 1)[0].split(" ", 1)[0] for line in capture.splitlines()
             if line.startswith("vllm:kv_offload_tiering_") and not re.match(r"\S+_created[{ ]", line)}
    assert len(names) == 16
    assert names <= MAPPINGS.wanted["vllm"], sorted(names - MAPPINGS.wanted["vllm"])
    assert "vllm:prompt_tokens_cached_by_source_total" in MAPPINGS.wanted["vllm"]


def test_per_tier_hit_ratios_and_l2_read_time_equal_the_engines_counters(capture):
    snap = _snapshot((1000.0, capture))
    tiers = {t.tier: t for t in snap.tiers}
    cpu, l2 = tiers["cpu"], tiers["l2"]
    assert (cpu.source, l2.source) == ("vllm_tiering", "vllm_tiering")
    assert cpu.hit_ratio == L1_HITS / L1_QUERIES
    assert l2.hit_ratio == L2_HITS / L2_QUERIES
    # chunks of 32 tokens: the hit tokens are exactly what vLLM counted as cached from host and disk
    assert (cpu.lookup_tokens, cpu.hit_tokens) == (L1_QUERIES * BLOCK, HOST_TOKENS)
    assert (l2.lookup_tokens, l2.hit_tokens) == (L2_QUERIES * BLOCK, DISK_TOKENS)
    assert l2.read_seconds == L2_READ_SECONDS
    assert l2.read_latency_seconds == L2_READ_SECONDS / L2_HITS
    assert cpu.usage_ratio == 0.0 and cpu.read_seconds is None
    reg = build_registry(lambda: snap)
    labels = {"pod": "engine-0", "model": MODEL, "source": "vllm_tiering"}
    assert reg.get_sample_value("tierpilot_kv_hit_ratio", {**labels, "tier": "cpu"}) == L1_HITS / L1_QUERIES
    assert reg.get_sample_value("tierpilot_kv_hit_ratio", {**labels, "tier": "l2"}) == L2_HITS / L2_QUERIES
    assert reg.get_sample_value("tierpilot_kv_read_seconds_total", {**labels, "tier": "l2"}) == L2_READ_SECONDS
    assert reg.get_sample_value("tierpilot_kv_read_latency_seconds", {**labels, "tier": "l2"}) == (
        L2_READ_SECONDS / L2_HITS)


def test_window_ratios_follow_the_engines_counter_increases(capture):
    # the next scrape: one prompt hit 46 CPU chunks after 62 lookups, and 20 fs chunks after 24
    later = capture
    for name, label, by in (("vllm:kv_offload_tiering_chunk_queries_total", "0:primary", 62),
                            ("vllm:kv_offload_tiering_chunk_hits_total", "0:primary", 46),
                            ("vllm:kv_offload_tiering_chunk_queries_total", "1:fs", 24),
                            ("vllm:kv_offload_tiering_chunk_hits_total", "1:fs", 20),
                            ("vllm:kv_offload_tiering_read_time_total", "1:fs", 0.05),
                            ("vllm:prompt_tokens_cached_by_source_total", "host", 46 * 32),
                            ("vllm:prompt_tokens_cached_by_source_total", "disk", 20 * 32)):
        later = _bump(later, name, label, by)
    snap = _snapshot((1000.0, capture), (1010.0, later))
    tiers = {t.tier: t for t in snap.tiers}
    assert tiers["cpu"].hit_ratio == 46 / 62
    assert tiers["l2"].hit_ratio == 20 / 24
    assert tiers["l2"].read_latency_seconds == pytest.approx(0.05 / 20)
    assert tiers["cpu"].hit_tokens == HOST_TOKENS + 46 * 32  # lifetime totals


def test_chunk_tokens_follow_a_larger_offload_block_size():
    # block_size 64 in the offload spec: 2 engine blocks per chunk
    values = {"l1_chunk_hits": 10.0, "l2_chunk_hits": 5.0, "cached_host_tokens": 640.0,
              "cached_disk_tokens": 320.0, "gpu_block_size": 32.0}
    assert offload_chunk_tokens(values) == 64
    assert offload_chunk_tokens({"gpu_block_size": 32.0}) == 32  # no hit yet: the engine's block size
    assert offload_chunk_tokens({}) == 1  # nothing known: chunks are counted as they are


def test_a_tier_that_never_hit_has_no_hit_counter_yet_and_a_ratio_of_zero(capture):
    # vLLM creates chunk_hits{tier=...} at the tier's first hit
    no_hits = "\n".join(line for line in capture.splitlines()
                        if not line.startswith("vllm:kv_offload_tiering_chunk_hits")) + "\n"
    tiers = {t.tier: t for t in _snapshot((1000.0, no_hits)).tiers}
    assert (tiers["cpu"].source, tiers["cpu"].hit_ratio, tiers["l2"].hit_ratio) == ("vllm_tiering", 0.0, 0.0)


def test_without_an_fs_tier_only_the_cpu_tier_is_native(capture):
    cpu_only = "\n".join(line for line in capture.splitlines() if 'tier="1:fs"' not in line) + "\n"
    tiers = {t.tier: t for t in _snapshot((1000.0, cpu_only)).tiers}
    assert tiers["cpu"].source == "vllm_tiering" and tiers["cpu"].hit_ratio == L1_HITS / L1_QUERIES
    assert "l2" not in tiers


def _doubled(text: str) -> str:
    """The capture as a later scrape that saw everything twice: counters and histograms x2."""
    cumulative = set(re.findall(r"^# TYPE (\S+) (?:counter|histogram)$", text, re.MULTILINE))
    out = []
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name = line.split("{", 1)[0].split(" ", 1)[0]
            if name in cumulative or re.sub(r"_(total|bucket|count|sum)$", "", name) in cumulative:
                head, _, value = line.rpartition(" ")
                line = f"{head} {float(value) * 2!r}"
        out.append(line)
    return "\n".join(out) + "\n"


def test_l2_break_even_from_the_fs_tiers_own_read_time_and_lookup_delay(capture):
    # by hand from the capture: prefill 94.26839201899884 s for 86,384 computed tokens; the fs tier
    # read 130,023,424 bytes in 1.0412832689989955 s for 15,872 disk-cached tokens (8,192 bytes a
    # token); its lookups resolved after a retry: 10 by 5 ms, 343 by 10 ms, 539 in all (median in
    # (5 ms, 10 ms], interpolated)
    c_p = 94.26839201899884 / 86384
    c_r = 1.0412832689989955 / 130023424 * (130023424 / 15872)
    fixed = 0.005 + 0.005 * (539 / 2 - 10) / (343 - 10)
    (pod,) = _snapshot((1000.0, capture), (1010.0, _doubled(capture))).pods
    assert pod.l2_break_even_tokens == pytest.approx(fixed / (c_p - c_r), rel=1e-9)
