"""vLLM's native tiered KV offload on real CPU engines, with the project's CPU worker
(emulator/engines/cpu_offload_spec.py): a CPU tier (L1) and an fs tier (L2) on one shared directory.

Two engines for the module (one per core), both with a 40 MiB CPU tier and the same fs `root_dir`,
as pods share a Curvine mount. `/reset_prefix_cache` (the engines' dev API) empties the KV cache
alone, or the KV cache and the CPU tier (`reset_external=true`), so the next request must reload
from the tier below. Checked against the engines' own counters and outputs:
- a block stored and loaded back through the worker is byte-identical (no engine: the worker on a
  real SharedOffloadRegion, in the engine venv);
- greedy output with logprobs after a CPU-tier reload and after an fs-tier reload equals the cold
  prefill (the same tokens and top-5 candidates, every logprob within float32 rounding: a reload
  attends over the loaded blocks in other kernel chunks than one cold prefill, which on some CPUs
  moves a logprob by one ulp), with `kv_offload_tiering_chunk_hits{tier="0:primary"|"1:fs"}` showing the tier;
- engine B hits, in its own fs-tier counters, every chunk engine A wrote (the cross-pod L2 hit);
- the agent's L1 and L2 hit ratios, hit tokens and L2 read time equal the engines' own counters;
- the emulated Curvine master's LRU quota eviction deletes the oldest files, and an engine then
  misses them and recomputes;
- a restarted engine hits the files its previous process wrote.
The restart comes last (tests run in file order).
"""
from __future__ import annotations

import dataclasses
import json
import os
import random
import subprocess
import time
import urllib.request
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from agent.collect.mapping import load_mappings
from agent.collect.normalise import normalise, resolve
from agent.collect.parse import parse
from agent.collect.snapshot import build_snapshot
from agent.collect.store import WindowStore
from contracts.tier_model import Target, TierView
from emulator.cluster.curvine_master import CurvineMaster, CurvineMasterServer
from emulator.cluster.curvine_quota import QuotaConfig
from emulator.engines.engine import EngineProcess, engine_python, kv_bytes_per_token
from emulator.engines.tiering import TieringConfig
from tests.conftest import REPO_ROOT
from tests.support.real_engine import MODEL, engine_spec, http_get, skip_reason, start_engines

pytestmark = pytest.mark.skipif(skip_reason() is not None, reason=skip_reason() or "")

MAPPINGS = load_mappings()
PROMPT_TOKENS, BLOCK = 2000, 32
CHUNKS = (PROMPT_TOKENS - 1) // BLOCK  # full blocks before the last prompt token: 62
CPU, FS = "0:primary", "1:fs"


def _spec(core: str, fs_root: Path, inductor: Path):
    """A tiered engine; the dev API on (`/reset_prefix_cache`); one inductor cache for the module, so
    the sampler's logprobs kernels (compiled at the first request asking for logprobs, ~20 s) are
    compiled once."""
    return engine_spec(cpu_bind=core, kv_events=False, tiering=TieringConfig(cpu_bytes=40 << 20, fs_root=fs_root),
                       extra_env=(("VLLM_SERVER_DEV_MODE", "1"), ("TORCHINDUCTOR_CACHE_DIR", str(inductor))),
                       extra_args=("--enable-prompt-tokens-details",))


@pytest.fixture(scope="module")
def fs_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("l2")


@pytest.fixture(scope="module")
def engines(tmp_path_factory: pytest.TempPathFactory, fs_root: Path):
    scratch = tmp_path_factory.mktemp("tiered")
    procs = start_engines([_spec("0", fs_root, scratch / "inductor"), _spec("1", fs_root, scratch / "inductor")],
                          scratch)
    yield procs
    for e in procs:
        e.stop()


def _prompt(seed: int) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(4, 4096) for _ in range(PROMPT_TOKENS)]


def _generate(engine: EngineProcess, prompt: list[int]) -> dict:
    """Greedy, 8 tokens, top-5 logprobs: the text and the logprobs, to compare (`_assert_same_output`)."""
    body = json.dumps({"model": MODEL, "prompt": prompt, "max_tokens": 8, "temperature": 0.0,
                       "logprobs": 5}).encode()
    req = urllib.request.Request(f"{engine.base_url}/v1/completions", data=body, method="POST",
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=120) as resp:
        choice = json.loads(resp.read())["choices"][0]
    return {"text": choice["text"], "logprobs": choice["logprobs"]}


LOGPROB_TOL = 1e-5  # ~20 float32 ulps at |logprob| ~7; a wrong or stale KV block moves them far more


def _assert_same_output(got: dict, cold: dict) -> None:
    """`got` is the cold prefill's output: the same text, tokens and top-5 candidates, and each
    logprob within LOGPROB_TOL."""
    assert got["text"] == cold["text"]
    g, c = got["logprobs"], cold["logprobs"]
    assert g["tokens"] == c["tokens"] and g["text_offset"] == c["text_offset"]
    assert g["token_logprobs"] == pytest.approx(c["token_logprobs"], abs=LOGPROB_TOL, rel=0)
    assert [set(t) for t in g["top_logprobs"]] == [set(t) for t in c["top_logprobs"]]
    for gt, ct in zip(g["top_logprobs"], c["top_logprobs"], strict=True):
        assert gt == pytest.approx(ct, abs=LOGPROB_TOL, rel=0)


def _reset(engine: EngineProcess, *, cpu_tier: bool) -> None:
    """Empty the KV cache (and the CPU tier when `cpu_tier`); the fs tier keeps its files."""
    url = f"{engine.base_url}/reset_prefix_cache" + ("?reset_external=true" if cpu_tier else "")
    with urllib.request.urlopen(urllib.request.Request(url, data=b"", method="POST"), timeout=30) as resp:
        assert json.loads(resp.read())["success"] is True


def _counters(engine: EngineProcess) -> dict[tuple[str, str], float]:
    """(metric, tier or source) -> value, from the engine's own /metrics."""
    status, text = http_get(engine.metrics_url)
    assert status == 200
    out: dict[tuple[str, str], float] = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            if s.name.startswith(("vllm:kv_offload_tiering_", "vllm:prompt_tokens_cached_by_source")):
                key = (s.name, s.labels.get("tier") or s.labels.get("source", ""))
                out[key] = out.get(key, 0.0) + s.value
    return out


def _delta(before: dict, after: dict, name: str, label: str) -> float:
    return after.get((name, label), 0.0) - before.get((name, label), 0.0)


def _chunk_bytes(engine: EngineProcess) -> int:
    return BLOCK * kv_bytes_per_token(engine.spec.dtype)


def _wait_fs_written(engine: EngineProcess, before: dict, chunks: int, timeout: float = 60.0) -> None:
    """Until the engine's fs tier counted `chunks` chunks written since `before` (writes are asynchronous)."""
    deadline = time.monotonic() + timeout
    written = 0.0
    while time.monotonic() < deadline:
        written = _delta(before, _counters(engine), "vllm:kv_offload_tiering_write_bytes_total", FS)
        if written >= chunks * _chunk_bytes(engine):
            return
        time.sleep(0.2)
    raise AssertionError(f"engine {engine.spec.port}: the fs tier wrote {written:.0f} bytes, not {chunks} chunks, "
                         f"in {timeout:.0f} s")


def test_worker_round_trip_is_byte_identical() -> None:
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
    env.pop("VIRTUAL_ENV", None)
    out = subprocess.run([str(engine_python()), str(REPO_ROOT / "tests/support/offload_roundtrip.py")], env=env,
                         capture_output=True, text=True, timeout=180, check=True).stdout
    got = json.loads(out.strip().splitlines()[-1])
    assert got["equal"] and got["layout"], got
    assert got["padding_untouched"] and got["others_untouched"], got
    assert got["results"] == [[1, True, 3 * (4096 + 6144)], [2, True, 3 * (4096 + 6144)]]
    assert got["after"] == 0


def _files(root: Path) -> set[Path]:
    return {p for p in root.rglob("*.bin")}


@pytest.fixture(scope="module")
def first_prompt() -> dict:
    """What the first test wrote: its cold output and its L2 files (a later test evicts them)."""
    return {}


def test_cpu_tier_and_fs_tier_reloads_equal_the_cold_prefill(engines: list[EngineProcess], fs_root: Path,
                                                             first_prompt: dict) -> None:
    a = engines[0]
    prompt = _prompt(1)
    c0 = _counters(a)
    files0 = _files(fs_root)
    cold = _generate(a, prompt)
    _wait_fs_written(a, c0, CHUNKS)
    first_prompt.update(cold=cold, files=_files(fs_root) - files0)

    _reset(a, cpu_tier=False)
    c1 = _counters(a)
    _assert_same_output(_generate(a, prompt), cold)
    c2 = _counters(a)
    assert _delta(c1, c2, "vllm:kv_offload_tiering_chunk_hits_total", CPU) == CHUNKS
    assert _delta(c1, c2, "vllm:kv_offload_tiering_chunk_hits_total", FS) == 0
    assert _delta(c1, c2, "vllm:prompt_tokens_cached_by_source_total", "host") == CHUNKS * BLOCK

    _reset(a, cpu_tier=True)
    c3 = _counters(a)
    _assert_same_output(_generate(a, prompt), cold)
    c4 = _counters(a)
    assert _delta(c3, c4, "vllm:kv_offload_tiering_chunk_hits_total", CPU) == 0
    assert _delta(c3, c4, "vllm:kv_offload_tiering_chunk_hits_total", FS) == CHUNKS
    assert _delta(c3, c4, "vllm:kv_offload_tiering_read_bytes_total", FS) == CHUNKS * _chunk_bytes(a)
    assert _delta(c3, c4, "vllm:prompt_tokens_cached_by_source_total", "disk") == CHUNKS * BLOCK


def test_an_engine_hits_the_l2_blocks_another_engine_wrote(engines: list[EngineProcess]) -> None:
    a, b = engines
    prompt = _prompt(2)
    ca = _counters(a)
    cold = _generate(a, prompt)
    _wait_fs_written(a, ca, CHUNKS)
    before = _counters(b)
    _assert_same_output(_generate(b, prompt), cold)
    after = _counters(b)
    assert _delta(before, after, "vllm:kv_offload_tiering_chunk_queries_total", FS) == CHUNKS
    assert _delta(before, after, "vllm:kv_offload_tiering_chunk_hits_total", FS) == CHUNKS  # 100% cross-engine
    assert _delta(before, after, "vllm:prompt_tokens_cached_by_source_total", "disk") == CHUNKS * BLOCK


def _agent_tiers(engine: EngineProcess, *scrapes: tuple[float, str]) -> dict[str, TierView]:
    """The agent's tier view of one engine from its /metrics texts (scrape time, text)."""
    store = WindowStore()
    target = Target(engine.metrics_url, "vllm", f"engine-{engine.spec.port}")
    for ts, text in scrapes:
        signals = normalise(target, parse(text, MAPPINGS.wanted["vllm"]), MAPPINGS).signals
        store.ingest(resolve(signals, MAPPINGS), ts=ts)
    snap = build_snapshot(store.window(now=scrapes[-1][0]), [], taken_at=scrapes[-1][0])
    return {t.tier: t for t in snap.tiers}


def _engine_counters(text: str) -> dict[tuple[str, str], float]:
    out: dict[tuple[str, str], float] = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            key = (s.name, s.labels.get("tier") or s.labels.get("source", ""))
            out[key] = out.get(key, 0.0) + s.value
    return out


def test_the_agents_tier_ratios_equal_the_engines_counters(engines: list[EngineProcess]) -> None:
    """The agent reads the real tiered engines: its L1 (CPU tier) and L2 (fs tier) hit ratios, hit
    tokens and L2 read time are the engines' own counters, over a window and over their lifetime."""
    hits, queries = "vllm:kv_offload_tiering_chunk_hits_total", "vllm:kv_offload_tiering_chunk_queries_total"
    a, b = engines
    _, t0 = http_get(b.metrics_url)
    prompt = _prompt(4)
    ca = _counters(a)
    _generate(a, prompt)
    _wait_fs_written(a, ca, CHUNKS)
    _generate(b, prompt)  # engine B reads what A wrote: a window of fs-tier hits
    _, t1 = http_get(b.metrics_url)
    c0, c1 = _engine_counters(t0), _engine_counters(t1)
    tiers = _agent_tiers(b, (1000.0, t0), (1010.0, t1))
    fs_hits = c1[(hits, FS)] - c0.get((hits, FS), 0.0)
    assert tiers["l2"].hit_ratio == fs_hits / (c1[(queries, FS)] - c0.get((queries, FS), 0.0)) == 1.0
    cpu_hits = c1.get((hits, CPU), 0.0) - c0.get((hits, CPU), 0.0)
    assert tiers["cpu"].hit_ratio == cpu_hits / (c1[(queries, CPU)] - c0.get((queries, CPU), 0.0))
    for engine in engines:  # lifetime totals
        status, text = http_get(engine.metrics_url)
        assert status == 200
        c, tiers = _engine_counters(text), _agent_tiers(engine, (1000.0, text))
        # vLLM creates a tier's hit counter at its first hit: none is 0
        assert tiers["cpu"].hit_ratio == c.get((hits, CPU), 0.0) / c[(queries, CPU)]
        assert tiers["cpu"].hit_tokens == c[("vllm:prompt_tokens_cached_by_source_total", "host")]
        if (queries, FS) in c:
            assert tiers["l2"].hit_ratio == c.get((hits, FS), 0.0) / c[(queries, FS)]
            assert tiers["l2"].hit_tokens == c[("vllm:prompt_tokens_cached_by_source_total", "disk")]
            assert tiers["l2"].read_seconds == c.get(("vllm:kv_offload_tiering_read_time_total", FS))
    assert (queries, FS) in c  # engine B asked its fs tier


def test_the_curvine_quota_evicts_the_oldest_files_and_an_engine_then_misses(engines: list[EngineProcess],
                                                                             fs_root: Path, first_prompt: dict) -> None:
    """The emulated Curvine master on the shared directory, its quota set so that reaching it means
    freeing exactly the first prompt's bytes: LRU evicts the oldest files, the first prompt's
    (written before anything else here); engine B, which never saw that prompt, then misses its
    first chunk in its own counters, and recomputes it to the same output."""
    b = engines[1]
    assert "files" in first_prompt, "needs the first prompt of test_cpu_tier_and_fs_tier_reloads_equal_the_cold_prefill"
    assert len(first_prompt["files"]) == CHUNKS
    master = CurvineMaster(fs_root, QuotaConfig(capacity_bytes=1 << 40))
    with CurvineMasterServer(master).start(loop=False) as server:
        others = master.used - CHUNKS * _chunk_bytes(b)
        master.cfg = dataclasses.replace(master.cfg, capacity_bytes=int(others / master.cfg.low_watermark))
        result = server.step()
        assert result is not None and first_prompt["files"] <= set(result.files)
        assert not first_prompt["files"] & _files(fs_root)
        assert len(result.files) <= CHUNKS + 2  # the first prompt's files, config.json and a page's overshoot
        before = _counters(b)
        _assert_same_output(_generate(b, _prompt(1)), first_prompt["cold"])
        after = _counters(b)
    assert _delta(before, after, "vllm:kv_offload_tiering_chunk_queries_total", FS) >= 1
    assert _delta(before, after, "vllm:kv_offload_tiering_chunk_hits_total", FS) == 0
    assert _delta(before, after, "vllm:kv_offload_tiering_chunk_hits_total", CPU) == 0


def test_a_restarted_engine_hits_the_files_it_wrote(engines: list[EngineProcess]) -> None:
    a = engines[0]
    prompt = _prompt(3)
    c0 = _counters(a)
    cold = _generate(a, prompt)
    _wait_fs_written(a, c0, CHUNKS)
    a.restart()
    before = _counters(a)
    _assert_same_output(_generate(a, prompt), cold)
    after = _counters(a)
    assert _delta(before, after, "vllm:kv_offload_tiering_chunk_hits_total", CPU) == 0
    assert _delta(before, after, "vllm:kv_offload_tiering_chunk_hits_total", FS) == CHUNKS
