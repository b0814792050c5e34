"""Hostile KV-event input against the subscriber's memory: peak RSS of the agent
side under each attack, as a ratio of the 1 GiB memory limit the Deployment sets.

Each attack runs in two fresh spawned processes: the publishers (emulated vLLM, real ZMQ on
127.0.0.1) and the subscriber (`KvEventManager` with the default settings), so the figure is the
subscriber's own peak (`VmHWM`), next to its RSS before the attack in the same process.

Attacks (in brackets, for scale, what a subscriber without byte bounds took):
  dp16_flood      one pod annotated dp-size 16, every rank storing 400k distinct hashes
                  [16 engines OOM at 1 GiB; 8 x 400k used 542 MB]
  big_messages    100 messages of ~3 MB of token ids, and every tenth one followed by ~3 MB of
                  hashes (330k) [100 x 3 MB: 2.4 GB RSS]
  oversized       20 messages of ~12 MB, over the 8 MiB max_message_bytes, then a normal one
  media           20,000 distinct `medium` strings [20k series]
  jump_and_topic  a sequence jump to 2^64-1 and 1,000 messages on a wrong topic [1.8e19 gaps]
  flood_5mb       100 messages of ~5.4 MB of hashes (600k each), sent as fast as the socket takes
                  them [30: 1.07 GB; 100: killed at 1.5 GiB in 6 s; /metrics render up to 24 s]

The subscriber runs its I/O thread (`start()`) while the main thread renders the KV collector's
/metrics text every 50 ms: the render latency (median, max) is printed next to the peak RSS.

Run: .venv/bin/python bench/hostile_kv.py [--quick] [--only NAME]
"""
from __future__ import annotations

import argparse
import multiprocessing as mp
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tests.support.prometheus import free_port_range

LIMIT = 2**30  # the Deployment's memory limit (deploy/)
ATTACKS = ("dp16_flood", "big_messages", "oversized", "media", "jump_and_topic", "flood_5mb")


def _status(field: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    return 0


def _ranks(attack: str) -> int:
    return 16 if attack == "dp16_flood" else 1


# -- the subscriber process ----------------------------------------------------------------------
def subscriber(attack: str, base: int, ready: Any, done: Any, finished: Any, out: Any) -> None:
    from prometheus_client import CollectorRegistry, generate_latest

    from agent.kvevents.collector import KvEventsCollector
    from agent.kvevents.manager import KvEventManager
    from agent.kvevents.settings import EndpointSpec, KvEventsSettings

    spec = EndpointSpec(pod="hostile", model="m", endpoint=f"tcp://127.0.0.1:{base}", dp_size=_ranks(attack),
                        topic="kv@hostile@m")
    mgr = KvEventManager(KvEventsSettings(endpoints=(spec,)))
    registry = CollectorRegistry()
    registry.register(KvEventsCollector(mgr.snapshot))
    mgr.start()
    time.sleep(0.5)
    rss0 = _status("VmRSS")
    ready.set()
    t0 = time.perf_counter()
    quiet, seen, renders = None, -1, []

    def progress() -> int:
        snap = mgr.snapshot()
        return sum(e.stream.messages + e.stream.shed_messages + sum(e.stream.rejected.values()) for e in snap.engines)

    while True:
        r0 = time.perf_counter()
        generate_latest(registry)
        renders.append(time.perf_counter() - r0)
        time.sleep(0.05)
        if done.is_set():
            now = progress()
            if now != seen or mgr._behind:
                seen, quiet = now, None
            elif quiet is None:
                quiet = time.monotonic()
            elif time.monotonic() - quiet > 6.0:  # longer than one huge apply (the snapshot is kept meanwhile)
                break
    elapsed = time.perf_counter() - t0
    finished.set()
    mgr.stop()
    snap = mgr.snapshot()
    streams = [e.stream for e in snap.engines]
    out.put({
        "rss0": rss0, "peak": _status("VmHWM"), "elapsed": elapsed,
        "messages": sum(s.messages for s in streams), "lost": sum(s.lost_messages for s in streams),
        "missed": sum(s.missed_messages for s in streams), "reconnects": sum(s.reconnects for s in streams),
        "rejected": {k: sum(s.rejected.get(k, 0) for s in streams) for k in {k for s in streams for k in s.rejected}},
        "resident": sum(sum(e.resident_blocks.values()) for e in snap.engines),
        "media": sorted({m for e in snap.engines for m in (*e.stored_blocks, *e.removed_blocks)}),
        "shed": sum(s.shed_messages for s in streams),
        "render_p50": sorted(renders)[len(renders) // 2], "render_max": max(renders),
    })


# -- the publisher process -----------------------------------------------------------------------
def publisher(attack: str, base: int, quick: bool, ready: Any, done: Any, finished: Any) -> None:
    import msgspec

    from emulator.cluster.kv_publisher import KvEventPublisher

    pubs = [KvEventPublisher(f"tcp://127.0.0.1:{base}", data_parallel_rank=r, bind=True, topic="kv@hostile@m",
                             hwm=1_000_000) for r in range(_ranks(attack))]
    f = pubs[0].format
    ready.wait(30)
    time.sleep(0.5)
    scale = 0.25 if quick else 1.0
    mix = 0x9E3779B97F4A7C15
    if attack == "dp16_flood":
        per_rank, per_msg = int(400_000 * scale), 1024
        for start in range(0, per_rank, per_msg):
            for r, p in enumerate(pubs):
                first = r * 10**8 + start
                p.publish([f.stored([((first + i) * mix) & (2**64 - 1) for i in range(per_msg)], None, 16,
                                    token_ids=[])], ts=float(start))
            if start % (per_msg * 32) == 0:
                for p in pubs:
                    p.flush(120)
    elif attack == "big_messages":  # ~3 MB of token ids, then ~3 MB of hashes alone
        for i in range(int(100 * scale) or 1):
            hashes = [((i * 10**6 + b) * mix) & (2**64 - 1) for b in range(64)]
            tokens = [100_000 + t for t in range(600_000)]  # 5 bytes each in msgpack
            pubs[0].publish([f.stored(hashes, None, 16, token_ids=tokens)], ts=float(i))
            if i % 10 == 0:
                many = [((i * 10**7 + b) * mix) & (2**64 - 1) for b in range(330_000)]
                pubs[0].publish([f.stored(many, None, 16, token_ids=[])], ts=float(i) + 0.5)
            pubs[0].flush(120)
    elif attack == "oversized":  # ~12 MB each, over the 8 MiB max_message_bytes
        for i in range(int(20 * scale) or 1):
            tokens = [100_000 + t for t in range(2_400_000)]
            pubs[0].publish([f.stored([(i * mix) & (2**64 - 1)], None, 16, token_ids=tokens)], ts=float(i))
            pubs[0].flush(120)
        pubs[0].publish([f.stored([1], None, 16)], ts=100.0)
    elif attack == "media":
        for i in range(int(20_000 * scale)):
            pubs[0].publish([f.stored([(i * mix) & (2**64 - 1)], None, 16, medium=f"tier-{i}", token_ids=[]),
                             f.removed([(i * mix) & (2**64 - 1)], medium=f"evil-{i}")], ts=float(i))
    elif attack == "flood_5mb":  # encoded first, then sent as fast as the socket takes them
        payloads = []
        for i in range(int(100 * scale) or 1):
            hashes = [((i * 10**7 + b) * mix) & (2**64 - 1) for b in range(600_000)]
            payloads.append(msgspec.msgpack.encode(f.batch(float(i), [f.stored(hashes, None, 16, token_ids=[])], 0)))
        for seq, payload in enumerate(payloads):
            pubs[0].send_raw([b"kv@hostile@m", seq.to_bytes(8, "big"), payload])
    elif attack == "jump_and_topic":
        pubs[0].publish([f.stored([1], None, 16)], ts=1.0)
        payload = msgspec.msgpack.encode(f.batch(2.0, [f.stored([2], None, 16)], 0))
        pubs[0].send_raw([b"kv@hostile@m", (2**64 - 1).to_bytes(8, "big"), payload])
        for i in range(1000):
            pubs[0].send_raw([b"kv@somebody-else@m", i.to_bytes(8, "big"), payload])
    for p in pubs:
        p.flush(300)
    time.sleep(1.0)
    done.set()
    finished.wait(600)  # closing drops what TCP back-pressure still holds in the PUB's queue
    for p in pubs:
        p.close()


def run(attack: str, quick: bool) -> dict[str, Any]:
    ctx = mp.get_context("spawn")
    ready, done, finished, out = ctx.Event(), ctx.Event(), ctx.Event(), ctx.Queue()
    base = free_port_range(_ranks(attack))
    sub = ctx.Process(target=subscriber, args=(attack, base, ready, done, finished, out))
    pub = ctx.Process(target=publisher, args=(attack, base, quick, ready, done, finished))
    sub.start()
    pub.start()
    result = out.get(timeout=1800)
    sub.join(30)
    pub.join(30)
    return result


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="a quarter of each attack")
    ap.add_argument("--only", choices=ATTACKS)
    args = ap.parse_args()
    print(f"KV-event attacks against the subscriber, default settings; limit {LIMIT / 2**20:.0f} MiB"
          f"{' (quick: a quarter of each)' if args.quick else ''}")
    worst = 0.0
    for attack in [args.only] if args.only else ATTACKS:
        r = run(attack, args.quick)
        worst = max(worst, r["peak"] / LIMIT)
        print(f"  {attack:<15} peak RSS {r['peak'] / 2**20:7.1f} MiB = {r['peak'] / LIMIT:.2f} x limit "
              f"(idle before {r['rss0'] / 2**20:.1f} MiB) in {r['elapsed']:.1f} s; applied {r['messages']:,}, "
              f"resident {r['resident']:,}, missed {r['missed']:,} (lost {r['lost']:,}), reconnects "
              f"{r['reconnects']}, rejected {r['rejected'] or '{}'}, shed {r['shed']:,}, media {r['media']}; "
              f"/metrics render median {r['render_p50'] * 1000:.1f} ms, max {r['render_max'] * 1000:.1f} ms")
    print(f"worst peak: {worst:.2f} x the 1 GiB limit (target < 1)")


if __name__ == "__main__":
    main()
