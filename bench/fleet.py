"""Benchmark: large fleets. 2,000 scrape targets served from one loopback server process with
realistic payloads (vLLM 0.33 + LMCache as prometheus_client renders them, bench/scrape.py; the
emulated cluster's pods; the reference samples that parse), then:

1. direct scrape, sharded: for 1, 2 and 4 shards, one replica's cycle over its rendezvous share
   of the targets (median wall time and CPU time of that replica's cycles). Replicas run on their
   own cores in production, so the fleet's cycle is the slowest replica's. Scaling efficiency
   = (1-shard CPU) / (N x the mean replica's CPU); target: within 20% of linear (>= 0.8). CPU per
   target: target <= 3 ms, printed with PASS or FAIL and against the same cycle with the shape
   cache off (every payload parsed, then normalised) in the same run.
2. `source: prometheus`: one real Prometheus (Debian's) scrapes the same 2,000 payloads (with the
   `pod` label); the agent's cycle (all queries + normalise + store + snapshot) at 200 and at 2,000
   pods, with `aggregate: server` (the default: Prometheus aggregates each mapping rule per pod)
   and `aggregate: agent` (raw series normalised in the agent: the reference run), and
   Prometheus' own query time for one server-side cycle (`stats=all`, queries one at a time).
   Targets: the 2,000-pod cycle within 1.3x of Prometheus' own work for it (measured in the same
   run) and within 2x of the 200-pod cycle; both ratios are printed with PASS or FAIL.
3. KV events, sharded: decoded vLLM event batches of 32 pods applied to one replica (the whole
   fleet) or to 2 (each its rendezvous share, with the mergeable fleet sketches on); block events
   per second of the fleet (events / the slowest replica's time), in this process.

The machine is shared (2 cores, other engineers' tests): wall times move with its load, CPU
times much less; the load average is printed next to the figures.
Run: .venv/bin/python bench/fleet.py [--targets 2000] [--skip-prometheus] [--skip-direct] [--skip-kv]
     [--profile FILE]  (Prometheus source only, with a cProfile of one cycle: --skip-direct --skip-kv)
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.scrape import SERVER, render_payload

SHARED = Path(os.environ.get("TIERPILOT_SHARED", "/work/shared"))


def load() -> str:
    a, b, _ = os.getloadavg()
    return f"load average {a:.1f}/{b:.1f}"


def payload_pool() -> list[str]:
    """Distinct payloads the targets cycle through: rendered, emulated, and reference samples."""
    from agent.collect.mapping import load_mappings
    from agent.collect.parse import ParseError, parse
    from emulator.cluster.exposition import render_python_client
    from emulator.cluster.pod_metrics import PodIdentity, VllmPodMetrics

    pool = [render_payload(i) for i in range(24)]
    emulated = render_python_client(VllmPodMetrics(PodIdentity(), time.time()).snapshot())
    pool.append(emulated.decode() if isinstance(emulated, bytes) else emulated)
    wanted = load_mappings().wanted["vllm"]
    for path in sorted((SHARED / "reference" / "samples").glob("*vllm*.prom")):
        text = path.read_text()
        try:
            if len(parse(text, wanted)):  # a sample with no mapped series is not a KV-cache pod
                pool.append(text)
        except ParseError:
            continue
    return pool


def start_server(payloads: list[str]) -> tuple[subprocess.Popen, int, str]:
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
        json.dump(payloads, f)
    server = subprocess.Popen([sys.executable, "-c", SERVER, f.name], stdout=subprocess.PIPE,
                              start_new_session=True)
    return server, int(server.stdout.readline()), f.name  # type: ignore[union-attr]


def replica(mine: list, cycles: int, shapes: bool = True) -> tuple[float, float, list[str]]:
    """One replica's cycles over its targets: median wall and CPU seconds, failure reasons.
    `shapes=False`: the shape cache off, every payload parsed and then normalised (the reference)."""
    from agent.collect.discovery import StaticTargets
    from agent.collect.scrape import new_session
    from agent.runtime.app import Agent
    from agent.runtime.process import configure_process, freeze_startup
    from agent.settings import load_settings

    configure_process()  # as `tierpilot run` sets its process up
    clock = [1.0e9]
    settings = load_settings(env={}, scrape={"timeout_s": 120, "concurrency": 256})
    agent = Agent(settings, StaticTargets(mine), clock=lambda: clock[0])
    freeze_startup()
    if not shapes:
        agent.cycle.shapes.max_chars = 0  # nothing is remembered
    failed: list[str] = []

    async def run() -> tuple[list, list]:
        w, c = [], []
        async with new_session(256) as session:
            await agent.cycle.run(session, mine)  # warm-up: connections, first samples, shapes
            for _ in range(cycles):
                clock[0] += 15.0
                w0, c0 = time.perf_counter(), time.process_time()
                snap = await agent.cycle.run(session, mine)
                w.append(time.perf_counter() - w0)
                c.append(time.process_time() - c0)
                failed.extend(s.reason for s in snap.targets if not s.up)
        return w, c

    w, c = asyncio.run(run())
    return statistics.median(w), statistics.median(c), failed


def direct(targets: list, shard_counts: list[int], cycles: int) -> None:
    from agent.collect.shard import owned

    print(f"\n1. direct scrape, {len(targets)} targets, sharded ({load()})")
    print("   shards  targets/replica  replica cycle wall ms (median, max over replicas)  replica CPU ms (mean)"
          "  efficiency")
    base_cpu = None
    for n in shard_counts:
        walls, cpus, failed = [], [], []
        for index in range(n):
            wall, cpu, fails = replica(list(owned(targets, index, n)), cycles)
            walls.append(wall)
            cpus.append(cpu)
            failed.extend(fails)
        mean_cpu = statistics.mean(cpus)
        if base_cpu is None:
            base_cpu = mean_cpu
        eff = base_cpu / (n * mean_cpu)
        print(f"   {n:>6}  {len(targets) // n:>15}  {statistics.median(walls) * 1000:>26.0f}, {max(walls) * 1000:>6.0f}"
              f"  {mean_cpu * 1000:>36.0f}  {eff:>9.2f}"
              + (f"  ({len(failed)} target scrapes failed: {sorted(set(failed))})" if failed else ""))
        if n == 1:
            per = mean_cpu / len(targets) * 1000
            _, full_cpu, _ = replica(list(targets), cycles, shapes=False)
            full = full_cpu / len(targets) * 1000
            print(f"   CPU per target (fetch, parse, normalise, store, snapshot): {per:.2f} ms "
                  f"(target <= 3 ms: {'PASS' if per <= 3 else 'FAIL'}); the same cycle with every payload parsed "
                  f"and then normalised (shape cache off, same run): {full:.2f} ms; ratio {per / full:.2f}x")


def via_prometheus(port: int, n_targets: int, cycles: int, interval_s: int = 30,
                   profile: str | None = None) -> None:
    from agent.collect.discovery import StaticTargets
    from agent.runtime.app import Agent
    from agent.runtime.process import configure_process, freeze_startup
    from agent.settings import load_settings
    from tests.support.prometheus import start_prometheus

    configure_process()  # as `tierpilot run` sets its process up

    small = min(200, n_targets)
    configs = [{"targets": [f"127.0.0.1:{port}"],
                "labels": {"__metrics_path__": f"/pod/{i}/metrics", "pod": f"vllm-{i}",
                           "subset": "small" if i < small else "rest"}} for i in range(n_targets)]
    work = Path(tempfile.mkdtemp(prefix="tierpilot-fleet-prom-"))
    print(f"\n2. source: prometheus, one real Prometheus scraping {n_targets} targets every {interval_s} s ({load()})")
    t0 = time.perf_counter()
    # every target shares one host:port, so `up` counts scrape pools' series, not addresses
    prom = start_prometheus([], work, scrape_interval=f"{interval_s}s", job="fleet", static_configs=configs,
                            wait_for_first_scrape=False, timeout=120)
    try:
        deadline = time.monotonic() + 1200
        while True:  # an overloaded Prometheus may time out on the way; keep asking
            try:
                if len(prom.query('up{job="fleet"}')) >= n_targets:
                    break
            except (OSError, RuntimeError):
                pass
            if time.monotonic() > deadline:
                raise RuntimeError(f"Prometheus did not scrape all {n_targets} targets in 20 min")
            time.sleep(5)
        time.sleep(2 * interval_s + 5)  # at least two scrapes of every target, so increases exist
        print(f"   Prometheus up with {n_targets} targets scraped twice in {time.perf_counter() - t0:.0f} s")
        walls: dict[tuple[str, int], float] = {}
        for aggregate in ("server", "agent"):  # agent: the raw series normalised here, the reference
            for size, selector in ((small, 'subset="small"'), (n_targets, 'job="fleet"')):
                settings = load_settings(env={}, source="prometheus",
                                         prometheus={"url": prom.url, "roles": {"vllm": selector}, "backfill": False,
                                                     "timeout_s": 120, "aggregate": aggregate})
                agent = Agent(settings, StaticTargets(()))
                freeze_startup()
                agent.scrape_now()  # warm-up (and the store's first read)
                cycle_walls, cpus, waits = [], [], []
                for _ in range(cycles):
                    w0, c0 = time.perf_counter(), time.process_time()
                    snap = agent.scrape_now()
                    cycle_walls.append(time.perf_counter() - w0)
                    cpus.append(time.process_time() - c0)
                    waits.append(getattr(agent.cycle, "last_timings", {}).get("queries_s", float("nan")))
                if profile and size == n_targets and aggregate == "server":  # not in the figures
                    import cProfile
                    cProfile.runctx("agent.scrape_now()", globals(), {"agent": agent}, profile)
                    print(f"   profile of one {size}-pod cycle written to {profile}")
                up = sum(st.up for st in snap.targets)
                assert up == len(snap.targets) == size, (up, size, [s.reason for s in snap.targets if not s.up][:3])
                walls[(aggregate, size)] = statistics.median(cycle_walls)
                wait = "" if aggregate == "agent" else \
                    f", of which queries (Prometheus + decoding) {statistics.median(waits) * 1000:.0f} ms"
                print(f"   aggregate: {aggregate:6} {size:>5} pods: agent cycle wall median "
                      f"{statistics.median(cycle_walls) * 1000:.0f} ms (min {min(cycle_walls) * 1000:.0f}){wait}; "
                      f"agent CPU {statistics.median(cpus) * 1000:.0f} ms; {len(snap.tiers)} tier series ({load()})")
            if aggregate == "server":
                work, about = prometheus_work(prom.url, 'job="fleet"')
                print(f"   Prometheus' own work for one {n_targets}-pod cycle, queries one at a time: {about}")
        for aggregate in ("server", "agent"):  # the targets are the default's (server); agent: for reference
            big, little = walls[(aggregate, n_targets)], walls[(aggregate, small)]
            verdict = aggregate == "server"
            print(f"   aggregate: {aggregate}: {n_targets}/{small} cycle ratio {big / little:.2f}x"
                  + (f" (target <= 2x: {'PASS' if big / little <= 2 else 'FAIL'})" if verdict else "")
                  + f"; at {n_targets}: {big:.2f} s, {big / work:.2f}x Prometheus' own work"
                  + (f" (target <= 1.3x: {'PASS' if big / work <= 1.3 else 'FAIL'})" if verdict else ""))
        print(f"   server vs agent (the reference, same process) at {n_targets} pods: "
              f"{walls[('agent', n_targets)] / walls[('server', n_targets)]:.2f}x faster")
    finally:
        prom.stop()


def prometheus_work(url: str, selector: str) -> tuple[float, str]:
    """Prometheus' own time (`stats=all`: execTotalTime) for every query of one server-side
    cycle, asked one at a time: what the agent waits for even with a core to itself."""
    import urllib.parse
    import urllib.request

    from agent.collect.mapping import load_mappings
    from agent.collect.prom.frame import Labelling, plan
    from agent.collect.prom.plan import compile_group

    mappings = load_mappings()
    (group,) = plan(mappings, {"vllm": selector})
    names = json.load(urllib.request.urlopen(
        f"{url}/api/v1/label/__name__/values?{urllib.parse.urlencode({'match[]': group.last_query()})}"))["data"]
    queries = {p.query for p in compile_group(group, mappings, Labelling(), frozenset(names) & set(group.names))}
    totals = []
    for _ in range(3):  # the median of three passes, as the cycle's figure is the median of its cycles
        total = series = size = 0
        for q in queries:
            body = urllib.request.urlopen(f"{url}/api/v1/query",
                                          data=urllib.parse.urlencode({"query": q, "stats": "all"}).encode()).read()
            data = json.loads(body)["data"]
            total += data["stats"]["timings"]["execTotalTime"]
            series += len(data["result"])
            size += len(body)
        totals.append(total)
    work = statistics.median(totals)
    passes = ", ".join(f"{t:.2f}" for t in totals)
    return work, (f"{work:.2f} s (median of {passes} s) over {len(queries)} queries, {series} series answered "
                  f"({size / 1e6:.0f} MB JSON)")


def kv_events(n_msgs: int) -> None:
    from agent.collect.shard import shard_of
    from agent.kvevents.fleet import BlockSketches
    from agent.kvevents.signals import EngineId, KvSignals
    from agent.kvevents.wire import decode_payload
    from bench.kvevents import make_messages

    pods = [f"vllm-{i}" for i in range(32)]
    streams = {p: make_messages(n_msgs // len(pods), "0.33.0", seed=i)[0] for i, p in enumerate(pods)}
    blocks = sum(make_messages(n_msgs // len(pods), "0.33.0", seed=i)[1] for i in range(len(pods)))

    def replica(mine: list[str], sketches: bool) -> float:
        sig = KvSignals()
        if sketches:
            sig.blocks = BlockSketches()
        t0 = time.process_time()
        for k in range(n_msgs // len(pods)):
            for p in mine:
                sig.apply(EngineId(p, "m"), decode_payload(streams[p][k]))
        return time.process_time() - t0

    print(f"\n3. KV events, {len(pods)} pods, {blocks:,} block events ({load()})")
    one = min(replica(pods, False) for _ in range(2))
    one_sk = min(replica(pods, True) for _ in range(2))
    print(f"   1 replica (no sketches):       {blocks / one:>10,.0f} block events/s")
    print(f"   1 replica (with sketches):     {blocks / one_sk:>10,.0f} block events/s "
          f"(sketch cost {one_sk / one - 1:+.0%})")
    shares = [[p for p in pods if shard_of(p, 2) == i] for i in range(2)]
    times = [min(replica(s, True) for _ in range(2)) for s in shares]
    print(f"   2 replicas (sketches on): {[len(s) for s in shares]} pods each; fleet "
          f"{blocks / max(times):>10,.0f} block events/s = {one / max(times):.2f}x one replica "
          f"(the slower replica sets the pace)")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--targets", type=int, default=2000)
    ap.add_argument("--shards", default="1,2,4")
    ap.add_argument("--cycles", type=int, default=3)
    ap.add_argument("--kv-messages", type=int, default=4000)
    ap.add_argument("--skip-prometheus", action="store_true")
    ap.add_argument("--skip-direct", action="store_true")
    ap.add_argument("--skip-kv", action="store_true")
    ap.add_argument("--profile", metavar="FILE", help="cProfile one Prometheus-source cycle at --targets pods")
    args = ap.parse_args()
    from contracts.tier_model import Target

    print(f"machine: {os.cpu_count()} cores, {load()} (shared and noisy; CPU times are the steadier figure)")
    t0 = time.perf_counter()
    pool = payload_pool()
    payloads = [pool[i % len(pool)] for i in range(args.targets)]
    print(f"payloads: {len(pool)} distinct ({statistics.mean(len(p) for p in pool) / 1024:.0f} KiB mean) over "
          f"{args.targets} targets; built in {time.perf_counter() - t0:.1f} s")
    server, port, data = start_server(payloads)
    try:
        targets = [Target(f"http://127.0.0.1:{port}/pod/{i}/metrics", "vllm", f"vllm-{i}")
                   for i in range(args.targets)]
        if not args.skip_direct:
            direct(targets, [int(x) for x in args.shards.split(",")], args.cycles)
        if not args.skip_prometheus:
            via_prometheus(port, args.targets, args.cycles, profile=args.profile)
    finally:
        server.terminate()
        server.wait(10)
        os.unlink(data)
    if not args.skip_kv:
        kv_events(args.kv_messages)


if __name__ == "__main__":
    main()
