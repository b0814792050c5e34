"""Benchmark: one scrape cycle over 200 loopback targets with realistic vLLM 0.33 + LMCache payloads.

Prints:
- wall time per full cycle (fetch, parse, normalise, store, snapshot) and CPU time per target;
- parse+normalise throughput against prometheus_client's `text_string_to_metric_families`
  alone, on the same payloads, in this process (ratio > 1 means the agent is faster): parse then
  normalise, and both together by the payload's shape (what the cycle does for a payload whose
  lines it has seen before);
- peak RSS of this process with 200 targets and a full 15-minute window (60 cycles at 15 s).
Targets: cycle < 1 s, ratio >= 2x, peak RSS < 300 MB.

The 200 endpoints are served by a separate process (aiohttp, one port, one path per pod) so the
agent's CPU time is its own. Payloads are rendered with prometheus_client, as vLLM and LMCache do,
with every default bucket list, the `engine` label, `_created` series and the process/GC families.
"""
from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from agent.collect.discovery import StaticTargets
from agent.collect.normalise import normalise, resolve
from agent.collect.parse import forget_series, parse
from agent.collect.scrape import new_session
from agent.collect.shapes import Shapes
from agent.runtime.app import Agent
from agent.runtime.process import configure_process, freeze_startup
from agent.settings import AgentSettings, load_settings
from contracts.tier_model import Signal, Target

N_TARGETS = 200
CYCLES = 5
RETENTION_S = 900.0
INTERVAL_S = 15.0

TTFT = [0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0,
        80.0, 160.0, 640.0, 2560.0]
ITL = [0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0]
REQ = [0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0, 240.0, 480.0,
       960.0, 1920.0, 7680.0]
TOKENS = [1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000, 10000, 20000, 50000, 100000]
ITER = [1, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384]
LM_FAST = [0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0]
LM_POW2 = [1e-5 * 2**i for i in range(20)]
MODEL = "meta-llama/Llama-3.1-8B-Instruct"


def render_payload(seed: int) -> str:
    """One pod's /metrics: vLLM 0.33 (1 engine) + LMCache in-process, as prometheus_client writes it."""
    import random

    from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
    from prometheus_client.gc_collector import GCCollector
    from prometheus_client.platform_collector import PlatformCollector
    from prometheus_client.process_collector import ProcessCollector

    rng = random.Random(seed)
    r = CollectorRegistry()
    ProcessCollector(registry=r)
    PlatformCollector(registry=r)
    GCCollector(registry=r)
    L = ["model_name", "engine"]
    lab = (MODEL, "0")
    for name in ("num_requests_running", "num_requests_waiting", "kv_cache_usage_perc"):
        Gauge(f"vllm:{name}", name, L, registry=r).labels(*lab).set(rng.random())
    wr = Gauge("vllm:num_requests_waiting_by_reason", "w", [*L, "reason"], registry=r)
    for reason in ("capacity", "deferred"):
        wr.labels(*lab, reason).set(rng.randint(0, 5))
    base = rng.randint(10**6, 10**7)
    for name, v in (("prefix_cache_queries", base), ("prefix_cache_hits", base // 3),
                    ("external_prefix_cache_queries", base // 2), ("external_prefix_cache_hits", base // 5),
                    ("prompt_tokens", base), ("prompt_tokens_cached", base // 2), ("generation_tokens", base // 4),
                    ("num_preemptions", 12), ("mm_cache_queries", 0), ("mm_cache_hits", 0)):
        Counter(f"vllm:{name}", name, L, registry=r).labels(*lab).inc(v)
    by = Counter("vllm:prompt_tokens_by_source", "s", [*L, "source"], registry=r)
    for s in ("local_compute", "local_cache_hit", "external_kv_transfer"):
        by.labels(*lab, s).inc(base // 3)
    cached = Counter("vllm:prompt_tokens_cached_by_source", "s", [*L, "source"], registry=r)
    for s, f in (("device", 3), ("host", 8), ("p2p", 0), ("disk", 12), ("external_unspecified", 0)):
        cached.labels(*lab, s).inc(base // f if f else 0)
    succ = Counter("vllm:request_success", "s", [*L, "finished_reason"], registry=r)
    for s in ("stop", "length", "abort", "error", "repetition"):
        succ.labels(*lab, s).inc(rng.randint(0, 5000))
    Gauge("vllm:cache_config_info", "c", ["block_size", "cache_dtype", "enable_prefix_caching",
                                          "gpu_memory_utilization", "num_gpu_blocks"],
          registry=r).labels("16", "auto", "True", "0.9", "27000").set(1)
    hists = [("time_to_first_token_seconds", TTFT, 0.3), ("inter_token_latency_seconds", ITL, 0.05),
             ("request_time_per_output_token_seconds", ITL, 0.05), ("e2e_request_latency_seconds", REQ, 5),
             ("request_queue_time_seconds", REQ, 0.5), ("request_inference_time_seconds", REQ, 4),
             ("request_prefill_time_seconds", REQ, 0.4), ("request_decode_time_seconds", REQ, 3.5),
             ("request_prompt_tokens", TOKENS, 2000), ("request_generation_tokens", TOKENS, 300),
             ("request_max_num_generation_tokens", TOKENS, 500), ("request_params_max_tokens", TOKENS, 500),
             ("request_prefill_kv_computed_tokens", TOKENS, 800), ("request_params_n", [1, 2, 5, 10, 20], 1),
             ("iteration_tokens_total", ITER, 300)]
    for name, buckets, scale in hists:
        h = Histogram(f"vllm:{name}", name, L, buckets=buckets, registry=r)
        child = h.labels(*lab)
        for _ in range(40):
            child.observe(rng.expovariate(1 / scale))
    LL = ["model_name", "worker_id", "role", "served_model_name"]
    llab = ("/models/llama", "0", "worker", MODEL)
    for name in ("num_retrieve_requests", "num_store_requests", "num_lookup_requests", "num_requested_tokens",
                 "num_hit_tokens", "num_stored_tokens", "num_lookup_tokens", "num_lookup_hits",
                 "num_vllm_hit_tokens", "num_prompt_tokens", "num_remote_read_requests", "num_remote_read_bytes",
                 "num_remote_write_requests", "num_remote_write_bytes", "local_cpu_evict_count",
                 "local_cpu_evict_keys_count", "local_cpu_evict_failed_count", "forced_unpin_count",
                 "lookup_0_hit_requests"):
        Counter(f"lmcache:{name}", name, LL, registry=r).labels(*llab).inc(rng.randint(0, base))
    for name in ("retrieve_hit_rate", "lookup_hit_rate", "local_cache_usage", "remote_cache_usage",
                 "local_storage_usage", "active_memory_objs_count", "pinned_memory_objs_count"):
        Gauge(f"lmcache:{name}", name, LL, registry=r).labels(*llab).set(rng.random())
    for name, buckets in (("time_to_retrieve", LM_FAST), ("time_to_store", LM_FAST), ("time_to_lookup", LM_POW2),
                          ("retrieve_process_tokens_time", LM_POW2), ("store_process_tokens_time", LM_POW2),
                          ("retrieve_to_gpu_time", LM_POW2), ("store_from_gpu_time", LM_POW2)):
        h = Histogram(f"lmcache:{name}", name, LL, buckets=buckets, registry=r).labels(*llab)
        for _ in range(20):
            h.observe(rng.expovariate(50))
    return generate_latest(r).decode()


SERVER = r'''
import asyncio, json, sys
from aiohttp import web
payloads = json.load(open(sys.argv[1]))
async def handle(request):
    return web.Response(text=payloads[int(request.match_info["i"])], content_type="text/plain")
app = web.Application()
app.router.add_get("/pod/{i}/metrics", handle)
async def main():
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0, backlog=1024)
    await site.start()
    print(site._server.sockets[0].getsockname()[1], flush=True)
    await asyncio.Event().wait()
asyncio.run(main())
'''


def peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def print_machine() -> None:
    load = os.getloadavg()
    print(f"machine: {os.cpu_count()} cores, load average {load[0]:.1f} / {load[1]:.1f} / {load[2]:.1f} "
          "(wall times scale with other work on the machine; CPU times much less)")


def render_payloads() -> list[str]:
    """Every target's payload (`render_payload`), with their size printed."""
    t0 = time.perf_counter()
    payloads = [render_payload(i) for i in range(N_TARGETS)]
    sizes = [len(p.encode()) for p in payloads]
    lines = sum(p.count("\n") for p in payloads)
    print(f"payloads: {N_TARGETS} x {statistics.mean(sizes) / 1024:.1f} KiB (vLLM 0.33 + LMCache in-process), "
          f"{lines / N_TARGETS:.0f} lines each; rendered in {time.perf_counter() - t0:.1f}s")
    return payloads


@contextlib.contextmanager
def payload_server(payloads: list[str]) -> Iterator[int]:
    """The payloads served by a separate process (SERVER), one path per pod; yields its port."""
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
        json.dump(payloads, f)
        data_path = f.name
    server = subprocess.Popen([sys.executable, "-c", SERVER, data_path], stdout=subprocess.PIPE,
                              start_new_session=True)
    try:
        yield int(server.stdout.readline())
    finally:
        server.terminate()
        server.wait(10)
        os.unlink(data_path)


@dataclasses.dataclass
class ScrapeRun:
    """The agent under test, its settings and targets, the targets' payloads, and the clock the
    bench advances (`clock[0]`, seconds)."""

    targets: list[Target]
    payloads: list[str]
    settings: AgentSettings
    agent: Agent
    clock: list[float]


def start_agent(port: int, payloads: list[str]) -> ScrapeRun:
    """An agent scraping the payload server's N_TARGETS paths on `port`, on a clock of its own."""
    targets = [Target(f"http://127.0.0.1:{port}/pod/{i}/metrics", "vllm", f"vllm-{i}")
               for i in range(N_TARGETS)]
    clock = [1.0e9]
    settings = load_settings(scrape={"timeout_s": 10, "interval_s": INTERVAL_S},
                             store={"retention_s": RETENTION_S, "window_s": 300})
    configure_process()  # as `tierpilot run` sets its process up
    agent = Agent(settings, StaticTargets(targets), clock=lambda: clock[0])
    freeze_startup()
    return ScrapeRun(targets, payloads, settings, agent, clock)


def fill_window(run: ScrapeRun) -> None:
    """Fill the 15-minute window first (55 cycles of signals, counters advancing), so the measured
    cycles run in steady state: a full store and a full 300 s window."""
    mappings = run.agent.mappings
    wanted = mappings.wanted["vllm"]
    base = resolve([s for t, text in zip(run.targets, run.payloads, strict=True)
                    for s in normalise(t, parse(text, wanted), mappings).signals], mappings)
    total_cycles = int(RETENTION_S / INTERVAL_S)
    for k in range(total_cycles - CYCLES - 1):
        run.clock[0] += INTERVAL_S
        step = [Signal(s.pod, s.model, s.name, s.le, s.value + (k + 1) * 10.0 if s.kind == "counter" else s.value,
                       s.kind, s.source) for s in base]
        run.agent.store.ingest(step, ts=run.clock[0])


async def timed_cycles(run: ScrapeRun) -> tuple[list[float], list[float]]:
    """Wall and CPU seconds of each of CYCLES full scrape cycles, after one to warm up."""
    walls, cpus = [], []
    async with new_session(run.settings.scrape.concurrency) as session:
        await run.agent.cycle.run(session, run.targets)  # warm-up (connections, caches)
        for _ in range(CYCLES):
            run.clock[0] += INTERVAL_S
            w0, c0 = time.perf_counter(), time.process_time()
            snap = await run.agent.cycle.run(session, run.targets)
            walls.append(time.perf_counter() - w0)
            cpus.append(time.process_time() - c0)
            assert sum(st.up for st in snap.targets) == N_TARGETS, [s.reason for s in snap.targets if not s.up]
    return walls, cpus


def measure_cycles(run: ScrapeRun) -> None:
    walls, cpus = asyncio.run(timed_cycles(run))
    wall = statistics.median(walls)
    cpu = statistics.median(cpus)
    print(f"steady state (full window) cycle wall time: median {wall * 1000:.0f} ms over {CYCLES} cycles "
          f"(min {min(walls) * 1000:.0f}, max {max(walls) * 1000:.0f}); target < 1000 ms -> "
          f"{'PASS' if wall < 1 else 'FAIL'}")
    print(f"CPU time per target: {cpu / N_TARGETS * 1000:.2f} ms (cycle CPU {cpu * 1000:.0f} ms, "
          f"includes fetch, parse, normalise, store and snapshot)")


def best(fn: Callable[[], None], reps: int = 3) -> float:
    """Best CPU time of this process (robust on a shared, noisy machine)."""
    times = []
    for _ in range(reps):
        s = time.process_time()
        fn()
        times.append(time.process_time() - s)
    return min(times)


def compare_parsers(run: ScrapeRun) -> None:
    """parse+normalise vs the reference parser alone, same payloads, same process; then parse and
    normalise together by shape, and with every series new."""
    targets, payloads, mappings = run.targets, run.payloads, run.agent.mappings
    wanted = mappings.wanted["vllm"]

    def ours() -> None:
        for t, text in zip(targets, payloads, strict=True):
            normalise(t, parse(text, wanted), mappings)

    def reference() -> None:
        for text in payloads:
            for fam in text_string_to_metric_families(text):
                for _ in fam.samples:
                    pass

    t_ours, t_ref = best(ours), best(reference)
    mb = sum(len(p.encode()) for p in payloads) / 2**20
    print(f"parse+normalise (CPU time): {t_ours * 1000:.0f} ms for {N_TARGETS} payloads ({mb / t_ours:.1f} MiB/s); "
          f"text_string_to_metric_families alone: {t_ref * 1000:.0f} ms ({mb / t_ref:.1f} MiB/s); "
          f"ratio {t_ref / t_ours:.2f}x; target >= 2x -> {'PASS' if t_ref / t_ours >= 2 else 'FAIL'}")

    shapes = Shapes(mappings, run.agent.cycle.limits)

    def together() -> None:  # what the cycle does: parse and normalise at once, by the payload's shape
        for t, text in zip(targets, payloads, strict=True):
            shapes.read(text, t)

    together()
    together()  # a shape is remembered the second time it is seen
    t_shape = best(together)
    print(f"parse and normalise together by shape (a payload seen before, as the cycle reads it): "
          f"{t_shape * 1000:.0f} ms; ratio to text_string_to_metric_families {t_ref / t_shape:.2f}x; "
          f"{t_ours / t_shape:.2f}x faster than parse then normalise (same run)")

    def cold() -> None:  # every series new to the parser (a target's first scrape)
        for t, text in zip(targets, payloads, strict=True):
            forget_series()
            normalise(t, parse(text, wanted), mappings)

    t_cold = best(cold)
    print(f"parse+normalise with every series new (a target's first scrape): {t_cold * 1000:.0f} ms; "
          f"ratio to text_string_to_metric_families {t_ref / t_cold:.2f}x")


def report_window(run: ScrapeRun) -> None:
    """The full window: its rows, one snapshot over it, and the size of /metrics."""
    agent, clock = run.agent, run.clock
    s0 = time.perf_counter()
    from agent.collect.snapshot import build_snapshot

    snap = build_snapshot(agent.store.window(now=clock[0]), [], taken_at=clock[0],
                          kv_bytes_per_token=run.settings.tiers.kv_bytes_per_token)
    snap_s = time.perf_counter() - s0
    text = agent.metrics_text()
    print(f"window: {agent.store.rows:,} rows in {len(agent.store._frames)} cycles "
          f"({RETENTION_S / 60:.0f} min at {INTERVAL_S:g}s); snapshot over it {snap_s * 1000:.0f} ms, "
          f"{len(snap.tiers)} tier series; /metrics {len(text) / 1024:.0f} KiB")


def main() -> None:
    print_machine()
    payloads = render_payloads()
    with payload_server(payloads) as port:
        run = start_agent(port, payloads)
        rss_before = peak_rss_mb()
        fill_window(run)
        measure_cycles(run)
        compare_parsers(run)
        report_window(run)
        rss = peak_rss_mb()
        print(f"peak RSS: {rss:.0f} MB (before scraping {rss_before:.0f} MB); target < 300 MB -> "
              f"{'PASS' if rss < 300 else 'FAIL'}")


if __name__ == "__main__":
    main()
