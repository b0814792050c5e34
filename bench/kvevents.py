"""Benchmark of the KV-event pipeline (agent/kvevents).

1. Throughput, one core: block events (one hash in a BlockStored or BlockRemoved) decoded and
   applied to the fleet index per second of this process's CPU time (the work is single-threaded;
   CPU time leaves out the time a loaded machine makes it wait for a core). Messages are batched
   as vLLM batches one scheduler step: a few BlockStored events (a prefill's new blocks each,
   16-token blocks with their token ids) plus single-hash BlockRemoved events from evictions.
   Reference in the same process: the bare generic `msgspec.msgpack.decode` of the same payloads
   (the least any consumer pays).
2. Index memory at 10 M distinct hashes stored through the index with the default limits
   (4 pods): RSS growth and tracemalloc's traced peak.
3. End to end over real ZMQ on loopback (publisher thread -> SUB -> manager), for context.

Targets: >= 500,000 block events/s on one core (decode + index of vLLM 0.33 map events);
< 500 MB at 10 M hashes, and at 1 M hashes (--quick) no more than the 0.77 of it measured before
the decode and sketch were compiled. Each prints PASS or FAIL.
Run: .venv/bin/python bench/kvevents.py [--quick]
"""
from __future__ import annotations

import argparse
import gc
import random
import sys
import time
import tracemalloc
from pathlib import Path

import msgspec

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from agent.kvevents.index import FleetIndex, IndexLimits
from agent.kvevents.manager import KvEventManager
from agent.kvevents.settings import EndpointSpec, KvEventsSettings
from agent.kvevents.wire import Stored, decode_payload
from emulator.cluster.kv_publisher import KvEventPublisher
from emulator.cluster.kv_wire_formats import wire_format

BLOCK = 16
TARGET_RATE = 500_000  # block events/s on one core, decode + index
MEMORY_BUDGET = 500e6  # bytes
MEMORY_BEFORE = {1_000_000: 0.77}  # fraction of the budget at that many hashes (docs/kv-events.md)


def make_messages(n_msgs: int, release: str, seed: int = 7, reuse: float = 0.5,
                  hashes_kind: str | None = None) -> tuple[list[bytes], int]:
    """Payloads of `n_msgs` scheduler steps (as vLLM `release` encodes them) and the number of
    block events they carry."""
    fmt = wire_format(release, hashes_kind)  # type: ignore[arg-type]
    rng = random.Random(seed)
    enc = msgspec.msgpack.Encoder()
    next_hash, recent = 1, []
    payloads, blocks = [], 0
    for i in range(n_msgs):
        events = []
        for _ in range(4):  # four prefills per step, 16 new blocks each
            hashes = []
            for _ in range(16):
                if recent and rng.random() < reuse:
                    hashes.append(rng.choice(recent))
                else:
                    hashes.append(next_hash * 0x9E3779B97F4A7C15 & (2**64 - 1))
                    next_hash += 1
            recent.extend(hashes[:4])
            del recent[:-4096]
            events.append(fmt.stored(hashes, None, BLOCK))
            blocks += len(hashes)
        for _ in range(32):  # evictions, one hash per event as the GPU pool emits them
            events.append(fmt.removed([rng.choice(recent)]))
            blocks += 1
        payloads.append(enc.encode(fmt.batch(float(i), events, 0)))
    return payloads, blocks


def rate(label: str, fn, payloads: list[bytes], blocks: int, repeat: int = 3) -> float:
    best = float("inf")
    for _ in range(repeat):
        gc.collect()
        t0 = time.process_time()
        fn(payloads)
        best = min(best, time.process_time() - t0)
    r = blocks / best
    print(f"  {label:<44} {r:>12,.0f} block events/s  ({best * 1e3:8.1f} ms CPU for {blocks:,})")
    return r


def throughput(n_msgs: int) -> float:
    """Prints each release's rates; returns decode + index of vLLM 0.33 map events."""
    print(f"1. throughput, one core, CPU time ({n_msgs:,} messages of 96 block events)")
    target_row = 0.0
    for release, kind, label in (("0.33.0", None, "map events, vLLM >= 0.24"),
                                 ("0.23.0", None, "positional events, vLLM <= 0.23"),
                                 ("0.10.1", None, "positional, signed builtin hashes, vLLM <= 0.10.1"),
                                 ("0.33.0", "bytes", "map events, 32-byte hashes")):
        payloads, blocks = make_messages(n_msgs, release, hashes_kind=kind)

        def bare(ps: list[bytes]) -> None:
            for p in ps:
                msgspec.msgpack.decode(p)

        def decode_only(ps: list[bytes]) -> None:
            for p in ps:
                decode_payload(p)

        def full(ps: list[bytes]) -> None:
            idx = FleetIndex(IndexLimits(seen_capacity=1_000_000))
            for i, p in enumerate(ps):
                b = decode_payload(p)
                idx.apply(f"pod-{i % 4}", b.ts, b.events)

        print(f" release {release}{'' if kind is None else ' ' + kind} ({label})")
        ref = rate("reference: msgspec.msgpack.decode (generic)", bare, payloads, blocks)
        dec = rate("decode_payload (typed, tokens skipped)", decode_only, payloads, blocks)
        tot = rate("decode + fleet index update", full, payloads, blocks)
        print(f"  ratios: decode/reference {dec / ref:.2f}x, decode+index/reference {tot / ref:.2f}x, "
              f"decode+index vs target 500k/s {tot / TARGET_RATE:.2f}x")
        if release == "0.33.0" and kind is None:
            target_row = tot
    return target_row


def rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * 4096


def memory(n_hashes: int) -> float:
    """Prints the index's memory; returns its fraction of MEMORY_BUDGET."""
    print(f"2. index memory at {n_hashes:,} distinct hashes (default limits, 4 pods, 64 blocks per event)")
    limits = IndexLimits()
    gc.collect()
    rss0 = rss_bytes()
    tracemalloc.start()
    idx = FleetIndex(limits)
    per_msg = 512
    h = 1
    t0 = time.perf_counter()
    step = 0
    while h <= n_hashes:
        events = []
        for _ in range(per_msg // 64):
            hashes = [(x * 0x9E3779B97F4A7C15) & (2**64 - 1) for x in range(h, min(h + 64, n_hashes + 1))]
            h += 64
            if hashes:
                events.append(Stored(hashes, None, BLOCK, "GPU", 0))
        idx.apply(f"pod-{step % 4}", float(step), events)
        step += 1
    elapsed = time.perf_counter() - t0
    current, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    gc.collect()
    rss1 = rss_bytes()
    resident = sum(len(e.resident) for e in idx.engines.values())
    print(f"  stored {n_hashes:,} hashes in {elapsed:.1f} s (tracemalloc on); resident entries kept "
          f"{resident:,} (cap {limits.resident_per_engine:,}/pod), aged out "
          f"{sum(e.stats.aged_out for e in idx.engines.values()):,}")
    print(f"  sketch {idx.sketch.nbytes / 1e6:.1f} MB ({idx.sketch.generations} x {idx.sketch.bits:,} bits, "
          f"k={idx.sketch.k}, rotations {idx.sketch.rotations})")
    share = max(peak, rss1 - rss0) / MEMORY_BUDGET
    print(f"  tracemalloc: current {current / 1e6:.1f} MB, peak {peak / 1e6:.1f} MB; "
          f"RSS growth {(rss1 - rss0) / 1e6:.1f} MB; target < 500 MB -> {share:.2f} of budget")
    return share


def end_to_end(n_msgs: int) -> None:
    print(f"3. end to end over ZMQ on 127.0.0.1 ({n_msgs:,} messages, publisher thread + manager loop)")
    payloads, blocks = make_messages(n_msgs, "0.33.0", seed=11)
    with KvEventPublisher("tcp://127.0.0.1:0", bind=True) as pub:
        spec = EndpointSpec(pod="p", model="m", endpoint=pub.endpoint)
        mgr = KvEventManager(KvEventsSettings(endpoints=(spec,), reorder_hold_s=0.0))
        mgr.run_once(10)
        time.sleep(0.3)
        batches = [msgspec.msgpack.decode(p) for p in payloads]
        t0 = time.perf_counter()
        for ts, events, _ in batches:
            pub.publish(events, ts=ts)
        while mgr.applied_batches < n_msgs and time.perf_counter() - t0 < 120:
            mgr.run_once(50)
        elapsed = time.perf_counter() - t0
        got = mgr.applied_batches
        mgr.stop()
    print(f"  applied {got:,}/{n_msgs:,} batches: {blocks * got / n_msgs / elapsed:,.0f} block events/s "
          f"(both ends share this machine's cores, encode included)")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="smaller runs (1 M hashes)")
    ap.add_argument("--throughput-only", action="store_true", help="section 1 only")
    args = ap.parse_args()
    rate_033 = throughput(2_000 if args.quick else 10_000)
    verdict = "PASS" if rate_033 >= TARGET_RATE else "FAIL"
    first = (f"decode + index, vLLM 0.33 map events: {rate_033:,.0f} block events/s per core "
             f"(target >= {TARGET_RATE:,}): {verdict}")
    verdicts = [first]
    if not args.throughput_only:
        n_hashes = 1_000_000 if args.quick else 10_000_000
        share = memory(n_hashes)
        before = MEMORY_BEFORE.get(n_hashes)
        bound = 1.0 if before is None else before
        as_before = "" if before is None else ", as before"
        verdicts.append(f"index memory at {n_hashes:,} hashes: {share:.2f} of the 500 MB budget "
                        f"(at most {bound:.2f}{as_before}): {'PASS' if share <= bound else 'FAIL'}")
        end_to_end(1_000 if args.quick else 5_000)
    print("targets")
    for line in verdicts:
        print(f"  {line}")


if __name__ == "__main__":
    main()
