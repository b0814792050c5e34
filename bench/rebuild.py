"""Fidelity, speed and memory of the planning workload rebuilt from the KV-event block stream.

For every bench workload of bench/live_tuning.py (emulator.demo.sim_run `workload()` and the
restart scenarios of emulator.demo.scenarios), the twin serves the true request stream at the
deployment's start configuration with its pods publishing their block events (vLLM 0.33 wire
format, one batch per pod per step, as `TwinEventPublisher` sends them). The agent's side then only
has those batches and the pods' counters (requests, prompt tokens and GPU hit tokens per pod, the
requests per 30-s scrape as the agent's store holds them); it decodes them, records them
(agent/kvevents/rebuild/recorder.py) and rebuilds the workload (history.py). Printed per workload,
with ok / MISSED against each target, then the worst over every run:

- the GPU, CPU and L2 capacity curves (simulator/capacity/) of the rebuilt stream against the true
  one: the largest gap in hit ratio at every size of a 41-point grid up to the larger useful size
  (target: within 0.02). Both keep the pods that served each request, as the tuner's curves do
  (tuners/planning/capacity_source.py);
- a twin replay's mean TTFT, rebuilt against true, the rebuilt stream routed afresh as the
  planner's trials replay it (target: within 5%);
- requests: true, rebuilt from stores, synthesised from the counters;
- throughput: block references per second, bare event decoding (msgspec, `decode_payload`) and
  decoding + recording + rebuilding, on one core, in the same run (target: >= 1 M refs/s);
- bytes per recorded block reference (the recorder's columns), and what an hour of 2,000 such pods
  would take (sampling beyond `max_refs`), against 1 GiB.

    TIERPILOT_SHARED=../shared .venv/bin/python bench/rebuild.py [--workloads cpu_hot,chunk] [--seeds 7]
"""
from __future__ import annotations

import argparse
import collections
import gc
import logging
import sys
import time
from pathlib import Path

import msgspec
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from agent.kvevents.rebuild import BlockRecorder, PodRequests, RebuiltHistory
from agent.kvevents.rebuild.chains import rebuild
from agent.kvevents.rebuild.log import STORED, mix64
from agent.kvevents.settings import RebuildSpec
from agent.kvevents.wire import Batch, Stored, decode_payload
from contracts import events as ce
from emulator.cluster.kv_wire_formats import wire_format
from emulator.demo.deployment import demo_deployment
from emulator.demo.scenarios import SCENARIOS, scenario
from emulator.demo.sim_run import WORKLOADS, workload
from simulator.capacity import tier_curves
from simulator.records import observed_placement
from simulator.replay import replay

ALL = (*WORKLOADS, *SCENARIOS)
GRID = 41
MASK = (1 << 64) - 1
FLEET_PODS, FLEET_S = 2_000, 3_600.0
SCRAPE_S = 30.0  # the counters' scrape interval (the simulated-clock harness's controller step)
CURVE_TARGET, TTFT_TARGET = 0.02, 0.05  # max hit-ratio gap per tier; relative mean-TTFT gap
SPEED_TARGET = 1e6  # block references recorded and rebuilt per second on one core


def load(name: str, seed: int):
    if name in SCENARIOS:
        sc = scenario(name, seed)
        return sc.workload.frame, sc.cluster, sc.deployment.start
    wl, cluster = workload(name, seed)
    return wl.frame, cluster, demo_deployment(cluster.pods).start


def wire_batches(events: list) -> list[tuple[str, bytes]]:
    """The twin's events as the pods publish them: (pod, vLLM 0.33 payload) per pod per step."""
    fmt = wire_format("0.33.0")
    enc = msgspec.msgpack.Encoder()
    steps: dict[tuple[float, str], list] = collections.defaultdict(list)
    for ev in events:
        if isinstance(ev, ce.BlockStored):
            gpu = ev.medium == "GPU"
            out = fmt.stored(ev.block_hashes, ev.parent_block_hash, ev.block_size, ev.medium, token_ids=[],
                             group_idx=0 if gpu else None, spec_kind="full_attention" if gpu else None)
        elif isinstance(ev, ce.BlockRemoved):
            out = fmt.removed(ev.block_hashes, ev.medium, group_idx=0 if ev.medium == "GPU" else None)
        else:
            out = fmt.cleared()
        steps[(ev.ts, ev.pod)].append(out)
    return [(pod, enc.encode(fmt.batch(ts, evs, 0))) for (ts, pod), evs in steps.items()]


def vllm_shaped(events: list, block: int = 16) -> list:
    """The same stream at vLLM's 16-token GPU blocks: each chunk hash becomes chunk/16 chained block
    hashes (a bijective mix of (hash, i)), so events carry as many hashes as a real engine's."""
    def expand(h: int, k: int) -> list[int]:
        return [int(x) for x in mix64(np.array([h ^ (i * 0x9E3779B97F4A7C15 & MASK) for i in range(k)],
                                               dtype=np.uint64))]
    out = []
    for ev in events:
        if isinstance(ev, ce.BlockStored):
            k = max(ev.block_size // block, 1)
            hashes = tuple(x for h in ev.block_hashes for x in expand(h, k))
            parent = None if ev.parent_block_hash is None else expand(ev.parent_block_hash, k)[-1]
            out.append(ce.BlockStored(ev.ts, ev.pod, hashes, parent, block, ev.medium))
        elif isinstance(ev, ce.BlockRemoved):
            out.append(ev)
        else:
            out.append(ev)
    return out


def throughput(events: list, spec: RebuildSpec) -> dict:
    """CPU time of bare decoding, and of decoding + recording + rebuilding, over one stream."""
    batches = wire_batches(events)
    gc.collect()
    t0 = time.process_time()
    refs = 0
    for _pod, payload in batches:
        b = decode_payload(payload)
        refs += sum(len(e.hashes) for e in b.events if type(e) is Stored)
    t_decode = time.process_time() - t0
    clock = [0.0]
    recorder = BlockRecorder.from_settings(spec, clock=lambda: clock[0])
    gc.collect()
    t0 = time.process_time()
    for pod, payload in batches:
        b = decode_payload(payload)
        clock[0] = b.ts
        recorder.record("m", pod, b)
    recorder.flush()
    t_record = time.process_time() - t0
    arr = recorder.arrays("m")
    t0 = time.process_time()
    r = rebuild(arr, float("-inf"), float("inf"), join_s=spec.join_s)
    t_rebuild = time.process_time() - t0
    return {"refs": refs, "decode": t_decode, "record": t_record, "rebuild": t_rebuild, "out_refs": len(r.flat),
            "bytes": recorder.nbytes(), "kept": recorder.refs()}


def fleet_memory(max_refs: int, engines: int = FLEET_PODS, seed: int = 1) -> dict:
    """A recorder fed a fleet's vLLM-shaped stream (`engines` pods; each request stores 64 blocks
    under one of 1,000 shared prefixes) until it has sampled three times its budget: the bytes it
    holds (its columns, and the peak Python allocations traced) per kept block reference."""
    import tracemalloc

    rng = np.random.default_rng(seed)
    prefixes = rng.integers(1, 2**63, (1000, 32), dtype=np.uint64)
    clock = [0.0]
    rec = BlockRecorder(retain_s=FLEET_S, max_refs=max_refs, engine_refs_per_s=1e9, clock=lambda: clock[0])
    names = [f"pod-{i}" for i in range(engines)]
    for i, p in enumerate(prefixes):  # the shared prefixes, stored once
        rec.record("m", names[i % engines], Batch(b"", 0, 0.0, 0, [Stored(p.tolist(), None, 16, "GPU", None)], {}))
    tracemalloc.start()
    t0 = time.process_time()
    fed = 0
    step = 0
    while fed < 3 * max_refs:
        clock[0] = step * FLEET_S / (3 * max_refs / 64)
        own = rng.integers(1, 2**63, 64, dtype=np.uint64).tolist()
        parent = int(prefixes[rng.integers(0, 1000), -1])
        rec.record("m", names[step % engines], Batch(b"", 0, clock[0], 0, [Stored(own, parent, 16, "GPU", None)], {}))
        fed += 64
        step += 1
    rec.flush()
    took = time.process_time() - t0
    _cur, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    return {"fed": fed, "kept": rec.refs(), "level": rec.level, "bytes": rec.nbytes(), "peak": peak, "s": took}


def pod_counts(served, names: tuple[str, ...], end: float) -> dict[str, PodRequests]:
    """Each pod's counters as the agent scrapes them every SCRAPE_S: requests (counted at their first
    token: the twin's requests carry no decode time), prompt tokens and GPU hit tokens over the
    run, and the requests counted per scrape interval."""
    edges = np.arange(0.0, end + SCRAPE_S, SCRAPE_S)
    out = {}
    for i, pod in enumerate(names):
        mine = served.filter(served["pod_index"] == i)
        per, _ = np.histogram((mine["time_s"] + mine["ttft_s"]).to_numpy(), bins=edges)
        out[pod] = PodRequests(float(mine.height), float(mine["prompt_tokens"].sum()), float(mine["gpu_hit_tokens"].sum()),
                               tuple((float(a), float(b), float(n)) for a, b, n in zip(edges[:-1], edges[1:], per, strict=True)
                                     if n))
    return out


def curve_gap(true, rebuilt) -> float:
    top = max(true.max_useful_gib, rebuilt.max_useful_gib, 1e-3)
    grid = np.linspace(0.0, top, GRID)
    return max(abs(true.hit_ratio(g) - rebuilt.hit_ratio(g)) for g in grid)


def run(name: str, seed: int, spec: RebuildSpec, shaped: bool = False) -> dict:
    frame, cluster, knobs = load(name, seed)
    events: list = []
    truth = replay(frame, cluster, knobs, event_sink=events.append)
    batches = wire_batches(events)
    speed = throughput(vllm_shaped(events), spec) if shaped else None
    del events
    # the agent's side: decode, record, rebuild
    gc.collect()
    t0 = time.process_time()
    decoded = [(pod, decode_payload(payload)) for pod, payload in batches]
    t_decode = time.process_time() - t0
    clock = [0.0]
    recorder = BlockRecorder.from_settings(spec, clock=lambda: clock[0])
    t0 = time.process_time()
    for pod, payload in batches:
        b = decode_payload(payload)
        clock[0] = b.ts
        recorder.record("m", pod, b)
    t_record = time.process_time() - t0
    names = cluster.pod_names or tuple(f"pod-{i}" for i in range(cluster.pods))
    end = float(frame["timestamp_ms"].max()) / 1000.0 + 1.0
    counts = pod_counts(truth.requests, names, end)
    history = RebuiltHistory.from_settings(recorder, lambda since, until: counts, lambda: end, spec)
    t0 = time.process_time()
    window = history.window(end, end)
    t_rebuild = time.process_time() - t0
    rebuilt = history(end, end)
    arr = recorder.arrays("m")
    refs = int(arr.n[(arr.kind == STORED)].sum())
    gpu_refs = int(arr.n[(arr.kind == STORED) & (arr.medium == 0)].sum())
    decoded_refs = sum(len(e.hashes) for _pod, b in decoded for e in b.events if hasattr(e, "block_size"))
    del decoded
    true_curves = tier_curves(frame, cluster, knobs, run=truth)
    re_run = replay(rebuilt, cluster, knobs)  # routed afresh, as the planner's trials replay it
    placed = observed_placement(rebuilt, cluster.pods)  # as the tuner's capacity curves take it
    re_curves = tier_curves(rebuilt, cluster, knobs)
    gaps = {t: curve_gap(true_curves[t], re_curves[t]) for t in ("gpu", "cpu", "l2")
            if true_curves[t].lookup_tokens or re_curves[t].lookup_tokens}
    ttft_true = float(truth.requests["ttft_s"].mean())
    ttft_re = float(re_run.requests["ttft_s"].mean())
    span = end - float(frame["timestamp_ms"].min()) / 1000.0
    return {
        "name": name, "seed": seed, "requests": frame.height, "stored": window.stored,
        "synth": sum(window.synthesised.values()), "rebuilt": rebuilt.height, "gaps": gaps,
        "ttft_true": ttft_true, "ttft_re": ttft_re, "refs": refs, "gpu_refs": gpu_refs,
        "decoded_refs": decoded_refs, "t_decode": t_decode, "t_record": t_record, "t_rebuild": t_rebuild,
        "bytes": recorder.nbytes(), "span": span, "pods": cluster.pods, "chunk": knobs.chunk_tokens,
        "outliers": window.outliers, "speed": speed, "placed": placed is not None,
    }


def verdict(ok: bool) -> str:
    return "ok" if ok else "MISSED"


def summary(rows: list[dict]) -> None:
    """The worst curve gap per tier and the worst TTFT gap over every row, against the targets."""
    print(f"\nfidelity over {len(rows)} run(s), worst per tier (target <= {CURVE_TARGET}):")
    for tier in ("gpu", "cpu", "l2"):
        have = [(o["gaps"][tier], o["name"], o["seed"]) for o in rows if tier in o["gaps"]]
        if have:
            g, name, seed = max(have)
            print(f"  {tier.upper():>3}: {g:.4f} ({name}, seed {seed}) {verdict(g <= CURVE_TARGET)}")
    err, name, seed = max((abs(o["ttft_re"] / o["ttft_true"] - 1.0), o["name"], o["seed"]) for o in rows)
    print(f"  mean TTFT: {err:.1%} ({name}, seed {seed}; target within {TTFT_TARGET:.0%}) {verdict(err <= TTFT_TARGET)}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 epilog="example: bench/rebuild.py --workloads cpu_hot,chunk --seeds 7,11")
    ap.add_argument("--workloads", default=",".join(ALL), help=f"comma-separated, from {', '.join(ALL)}")
    ap.add_argument("--seeds", default="7", help="comma-separated seeds (default 7)")
    ap.add_argument("--memory-refs", type=int, default=8_000_000,
                    help="max_refs of the fleet memory measurement (default 8 M; 0: skip it)")
    args = ap.parse_args()
    logging.disable(logging.WARNING)
    spec = RebuildSpec()
    names = [w for w in args.workloads.split(",") if w]
    bad = [w for w in names if w not in ALL]
    if bad:
        ap.error(f"unknown workload(s) {', '.join(bad)}; valid: {', '.join(ALL)}")
    rows = []
    print("| workload | seed | chunk | requests (stored + synthesised) | GPU gap | CPU gap | L2 gap | max gap "
          f"(<= {CURVE_TARGET}) | mean TTFT true -> rebuilt (within {TTFT_TARGET:.0%}) |")
    print("|---|---|---|---|---|---|---|---|---|")
    for name in names:
        for seed in (int(s) for s in args.seeds.split(",")):
            t = time.perf_counter()
            o = run(name, seed, spec, shaped=not rows)
            rows.append(o)
            gap = [f"{o['gaps'][t]:.4f}" if t in o["gaps"] else "-" for t in ("gpu", "cpu", "l2")]
            worst, err = max(o["gaps"].values(), default=0.0), o["ttft_re"] / o["ttft_true"] - 1.0
            print(f"| {name} | {seed} | {o['chunk']} | {o['requests']} ({o['stored']} + {o['synth']}) | {gap[0]} | "
                  f"{gap[1]} | {gap[2]} | {worst:.4f} {verdict(worst <= CURVE_TARGET)} | {o['ttft_true'] * 1000:.0f} -> "
                  f"{o['ttft_re'] * 1000:.0f} ms ({err:+.1%}) {verdict(abs(err) <= TTFT_TARGET)} |"
                  + ("" if o["placed"] else " (no placement: curves routed)"), flush=True)
            print(f"  ({time.perf_counter() - t:.0f} s)", file=sys.stderr, flush=True)
    summary(rows)
    sp = rows[0]["speed"]
    print(f"\nthroughput, one core (process time), {rows[0]['name']} at vLLM's 16-token blocks "
          f"({sp['refs']:,} stored block references):")
    print(f"  bare decoding (msgspec, decode_payload):    {sp['refs'] / sp['decode'] / 1e6:.2f} M refs/s")
    print(f"  decoding + recording:                       {sp['refs'] / sp['record'] / 1e6:.2f} M refs/s")
    rate = sp["refs"] / max(sp["record"] - sp["decode"] + sp["rebuild"], 1e-9)
    print(f"  recording + rebuilding (decoding excluded): {rate / 1e6:.2f} M refs/s = "
          f"{rate / (sp['refs'] / sp['decode']):.2f}x bare decoding's rate (rebuild {sp['rebuild']:.2f} s for "
          f"{sp['out_refs']:,} chain references out); target >= {SPEED_TARGET / 1e6:.0f} M refs/s: "
          f"{verdict(rate >= SPEED_TARGET)}")
    print(f"  memory: {sp['bytes'] / sp['kept']:.1f} bytes per recorded block reference at this block size")
    if args.memory_refs:
        m = fleet_memory(args.memory_refs)
        # a sampled recorder's memory follows its budget, not what it keeps between compactions
        per, peak = m["bytes"] / args.memory_refs, m["peak"] / args.memory_refs
        print(f"\nmemory, a {FLEET_PODS:,}-pod stream at 16-token blocks fed {m['fed'] / 1e6:.0f} M references into "
              f"max_refs = {args.memory_refs / 1e6:.0f} M: kept {m['kept'] / 1e6:.1f} M at sample level {m['level']}; "
              f"columns {m['bytes'] / m['kept']:.1f} bytes a kept reference; per reference of the budget: columns "
              f"{per:.1f} bytes, peak traced allocations {peak:.1f} ({m['s']:.0f} s, "
              f"{m['fed'] / m['s'] / 1e6:.2f} M refs/s recorded with compactions)")
        print(f"  an hour of {FLEET_PODS:,} pods at the default max_refs = {spec.max_refs / 1e6:.0f} M (the budget's bytes "
              f"scaled): "
              f"{spec.max_refs * per / 2**30:.2f} GiB of columns, {spec.max_refs * peak / 2**30:.2f} GiB at the traced peak "
              f"(compaction included); target < 1 GiB: {verdict(spec.max_refs * peak < 2**30)}")
    rec_refs = sum(o["refs"] for o in rows)
    per_ref = sum(o["bytes"] for o in rows) / max(rec_refs, 1)
    rate = max(o["refs"] / o["span"] / o["pods"] for o in rows)
    hour = rate * FLEET_PODS * FLEET_S
    print(f"\nmemory at the twin's chunk sizes: {per_ref:.1f} bytes per recorded block reference (the recorder's "
          f"columns, growth slack included)")
    print(f"  the busiest workload stores {rate:.1f} refs/s per pod: an hour of {FLEET_PODS:,} pods = {hour / 1e6:.0f} M refs "
          f"= {hour * per_ref / 2**30:.2f} GiB unsampled; kept under max_refs = {spec.max_refs / 1e6:.0f} M refs: "
          f"{min(hour, spec.max_refs) * per_ref / 2**30:.2f} GiB of columns")


if __name__ == "__main__":
    main()
