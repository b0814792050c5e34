"""Soak: the agent alone, in its own process (`tierpilot run`), against the emulated cluster in
another process, for `--minutes` wall minutes; is its memory flat?

The emulated cluster (emulator/cluster: vLLM pods with LMCache series, Curvine FUSE and master
endpoints, one KV-event publisher per pod, all driven by the digital twin) runs at `--time-scale`
cluster-seconds per wall-second. The agent scrapes it every `--scrape-s` seconds with a short
store retention (so its window is full after a few minutes, not after half an hour) and follows
every pod's KV events. Every `--sample-s` seconds the bench records the agent's RSS and open FDs
(/proc), the time one GET /metrics takes, and the store's row count (`tierpilot_store_rows`),
and the cluster process's RSS beside it (to tell the two apart).

Figures: per sample a line; at the end the growth per hour of RSS, FDs and rows, fitted by least
squares over the samples after the warm-up (`--warmup-min`, default a quarter of the run, at
least twice the retention), and the /metrics latency of the first and last third after it.
Target: agent RSS growth under 20 MB/h, /metrics latency flat.

`--diagnose [DIR]` answers "what grows: the agent or the emulated cluster?": both processes run
with bench/helpers/soak_probe.py inside (tracemalloc, glibc malloc_info, live object counts; it slows them
and adds the tracing's own memory), write a JSON line per `--sample-s` x 3 seconds to DIR
(agent.jsonl, cluster.jsonl), and the end of the run prints, per process, the growth per hour of
RSS, the Python heap, malloc's arenas and the bytes free inside them, the source lines and object
types that grew most, and the RSS before and after malloc_trim(0).

Run: .venv/bin/python bench/soak.py [--minutes 20] [--time-scale 30] [--csv soak.csv]
     .venv/bin/python bench/soak.py --minutes 3 --sample-s 5     # a quick look
     .venv/bin/python bench/soak.py --minutes 30 --diagnose soak-probe   # what grows, and where
"""
from __future__ import annotations

import argparse
import contextlib
import json
import multiprocessing as mp
import os
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
PROBE = ROOT / "bench" / "helpers" / "soak_probe.py"
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(PROBE.parent))

import soak_probe  # stdlib only at import: the probe starts when asked

MODEL = "meta-llama/Llama-3.1-8B-Instruct"
TARGET_MB_PER_H = 20.0


# -- the emulated cluster, in its own process -----------------------------------------------------
def cluster_main(pods: int, span_s: float, time_scale: float, seed: int, out: Any, stop: Any,
                 probe: tuple[str, float, float] | None = None) -> None:
    """Build the demo's emulated world without the agent or the tuner; serve until `stop`.
    `probe`: (file, interval s, baseline s) to run bench/helpers/soak_probe.py in this process."""
    if probe is not None:
        running = soak_probe.start(Path(probe[0]), probe[1], probe[2], "cluster")
    from contracts.knobs import DEFAULT_KNOBS
    from emulator.cluster.driver import ScaledRealtimeDriver
    from emulator.cluster.fleet import ClusterSpec, EmulatedCluster, pod_names
    from emulator.cluster.kv_publisher import TwinEventPublisher, open_pod_publishers
    from emulator.cluster.pod_metrics import PodIdentity
    from emulator.cluster.timeline import Recorder
    from emulator.cluster.twin_adapter import TwinPortAdapter
    from emulator.demo.deployment import DEMO_TTFT_BUCKETS
    from emulator.demo.workload import build_workload
    from simulator.cluster import ClusterSpec as TwinClusterSpec
    from simulator.records import iter_requests
    from simulator.twin import Twin

    names = pod_names(pods)
    twin_cluster = TwinClusterSpec(pods=pods, pod_names=names)
    caps = twin_cluster.capacities(DEFAULT_KNOBS)
    identity = PodIdentity(model_name=MODEL, kv_bytes_per_token=caps.kv_bytes_per_token,
                           num_gpu_blocks=caps.gpu_tokens // 16, ttft_buckets=DEMO_TTFT_BUCKETS)
    workload = build_workload(span_s, seed)
    cluster = EmulatedCluster(ClusterSpec(pods=pods, identity=identity, restart_downtime_s=0.3))
    cluster.start()
    publishers = open_pod_publishers(names, model=MODEL)
    sink = TwinEventPublisher(publishers, tokens="empty")
    twin = Twin(twin_cluster, DEFAULT_KNOBS, event_sink=sink)
    port = TwinPortAdapter(twin, list(iter_requests(workload.frame)))
    recorder = Recorder(keep=1000)  # the bench needs no ground truth
    driver = ScaledRealtimeDriver(port, cluster, recorder, time_scale=time_scale, on_step=sink.flush_step)
    out.put({"targets": cluster.targets(), "requests": workload.frame.height,
             "kv": [{"pod": n, "model": MODEL, "endpoint": p.endpoint, "replay_endpoint": p.replay_endpoint,
                     "topic": f"kv@{n}@"} for n, p in publishers.items()]})
    del workload
    driver.start()
    try:
        while not stop.wait(1.0):
            if driver.error is not None:
                out.put({"error": repr(driver.error)})
                return
        out.put({"served": driver.served, "finished": driver.finished})
    finally:
        if probe is not None:
            running.finish()
        driver.stop()
        cluster.stop()
        for pub in publishers.values():
            pub.close()


# -- measuring ------------------------------------------------------------------------------------
def proc_status(pid: int, field: str = "VmRSS") -> int:
    """A /proc/<pid>/status memory field in bytes (0 when the process is gone)."""
    return soak_probe.proc_kb(field, f"/proc/{pid}/status")


def open_fds(pid: int) -> int:
    try:
        return len(os.listdir(f"/proc/{pid}/fd"))
    except OSError:
        return 0


ROWS = re.compile(rb"^tierpilot_store_rows(?:\{\})? ([0-9.e+]+)$", re.MULTILINE)


def get_metrics(url: str, timeout: float = 10.0) -> tuple[float, int | None, int]:
    """(seconds one GET /metrics took, store rows or None, body bytes)."""
    t0 = time.perf_counter()
    with urllib.request.urlopen(url, timeout=timeout) as resp:
        body = resp.read()
    took = time.perf_counter() - t0
    m = ROWS.search(body)
    return took, (int(float(m.group(1))) if m else None), len(body)


def slope_per_hour(ts: Sequence[float], ys: Sequence[float]) -> float:
    """Least-squares slope of ys over ts (seconds), per hour; 0 for fewer than two points."""
    if len(ts) < 2:
        return 0.0
    mt, my = statistics.fmean(ts), statistics.fmean(ys)
    var = sum((t - mt) ** 2 for t in ts)
    if var == 0:
        return 0.0
    return sum((t - mt) * (y - my) for t, y in zip(ts, ys, strict=True)) / var * 3600.0


# The KV index and the capacity curve are bounded, but at their default sizes (a million hashes
# for the fleet, a million stored blocks per model) the soak's 4 pods take ~25 min to fill them:
# their fill would pass for growth. `--kv-limits soak` sizes them to fill within the warm-up (as the
# short store retention does for the window store); `--kv-limits default` keeps the defaults.
SOAK_KV_LIMITS = {"resident_per_pod": 32_768, "history_per_pod": 32_768, "fleet_resident": 131_072,
                  "fleet_history": 131_072, "shadow_l2": 131_072, "capacity_curve_blocks": 131_072,
                  "seen_capacity": 1_000_000}


def agent_config(cluster: dict, port: int, scrape_s: float, retention_s: float, window_s: float,
                 kv: bool = True, kv_limits: dict | None = None) -> dict:
    return {
        "log_level": "WARNING",
        "server": {"host": "127.0.0.1", "port": port},
        "scrape": {"interval_s": scrape_s, "timeout_s": 2.0, "backoff_base_s": scrape_s, "backoff_max_s": 5.0},
        "store": {"retention_s": retention_s, "window_s": window_s},
        "targets": {"static": cluster["targets"]},
        "kv_events": {"enabled": kv, "discovery": False, "endpoints": cluster["kv"],
                      "overlap_window_s": window_s, **({"limits": kv_limits} if kv_limits else {})},
    }


def summarise(samples: list[dict], warmup_s: float) -> dict[str, float]:
    after = [s for s in samples if s["t"] >= warmup_s] or samples
    ts = [s["t"] for s in after]
    thirds = max(1, len(after) // 3)
    first, last = after[:thirds], after[-thirds:]
    out = {
        "rss_mb_per_h": slope_per_hour(ts, [s["rss"] / 1e6 for s in after]),
        "cluster_rss_mb_per_h": slope_per_hour(ts, [s["cluster_rss"] / 1e6 for s in after]),
        "fds_per_h": slope_per_hour(ts, [s["fds"] for s in after]),
        "rows_per_h": slope_per_hour(ts, [s["rows"] or 0 for s in after]),
        "rss_first_mb": after[0]["rss"] / 1e6, "rss_last_mb": after[-1]["rss"] / 1e6,
        "rss_max_mb": max(s["rss"] for s in samples) / 1e6,
        "metrics_first_ms": statistics.median(s["metrics_ms"] for s in first),
        "metrics_last_ms": statistics.median(s["metrics_ms"] for s in last),
        "metrics_first_max_ms": max(s["metrics_ms"] for s in first),
        "metrics_last_max_ms": max(s["metrics_ms"] for s in last),
        "fit_from_s": after[0]["t"], "fit_points": len(after),
    }
    return out


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--minutes", type=float, default=20.0, help="wall minutes to run (default: 20)")
    ap.add_argument("--time-scale", type=float, default=30.0, help="cluster-seconds per wall-second (default: 30)")
    ap.add_argument("--pods", type=int, default=4, help="emulated vLLM pods (default: 4)")
    ap.add_argument("--scrape-s", type=float, default=0.5, help="agent scrape interval, seconds (default: 0.5)")
    ap.add_argument("--retention-s", type=float, default=60.0, help="agent store retention, seconds (default: 60)")
    ap.add_argument("--sample-s", type=float, default=10.0, help="seconds between samples (default: 10)")
    ap.add_argument("--warmup-min", type=float, default=None,
                    help="minutes left out of the fit (default: a quarter of the run, at least 2 x retention)")
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--no-kv", action="store_true", help="the agent does not follow the KV events")
    ap.add_argument("--csv", type=Path, default=None, help="write every sample to this CSV file")
    ap.add_argument("--env", action="append", default=[], metavar="K=V",
                    help="extra environment for the agent process (e.g. MALLOC_ARENA_MAX=2)")
    ap.add_argument("--kv-limits", choices=("soak", "default"), default="soak",
                    help="KV index and capacity-curve sizes: 'soak' (default) fills them within the warm-up, "
                         "'default' keeps the agent's defaults (they fill in ~25 min at 30x)")
    ap.add_argument("--diagnose", type=Path, nargs="?", const=Path("soak-probe"), default=None, metavar="DIR",
                    help="run bench/helpers/soak_probe.py in the agent and the cluster, write to DIR (default: soak-probe) "
                         "and print what grows in each")
    args = ap.parse_args(argv)
    if args.minutes <= 0 or args.time_scale <= 0 or args.sample_s <= 0:
        ap.error("--minutes, --time-scale and --sample-s must be positive")
    if args.csv is not None and not args.csv.parent.is_dir():
        ap.error(f"--csv: no such directory {args.csv.parent}")
    return args


def probe_files(diagnose: Path | None) -> dict[str, Path]:
    """With --diagnose: the probe's output file per process (agent, cluster), emptied; else none."""
    if diagnose is None:
        return {}
    diagnose.mkdir(parents=True, exist_ok=True)
    probes = {name: diagnose / f"{name}.jsonl" for name in ("agent", "cluster")}
    for path in probes.values():
        path.unlink(missing_ok=True)
    return probes


def start_cluster(args: argparse.Namespace, span_s: float,
                  probe: tuple[str, float, float] | None) -> tuple[Any, Any, Any]:
    """The emulated cluster's process, started: (process, its info queue, its stop event)."""
    ctx = mp.get_context("spawn")
    info, stop = ctx.Queue(), ctx.Event()
    cluster = ctx.Process(target=cluster_main, name="soak-cluster",
                          args=(args.pods, span_s, args.time_scale, args.seed, info, stop, probe))
    cluster.start()
    print(f"soak: building the emulated cluster ({args.pods} pods, {span_s / 3600:.1f} cluster-hours of "
          f"workload at {args.time_scale:g}x) in pid {cluster.pid} ...", flush=True)
    return cluster, info, stop


def start_agent(args: argparse.Namespace, world: dict, port: int, tmp: Path, probes: dict[str, Path],
                probe_s: float, warmup_s: float) -> subprocess.Popen:
    """`tierpilot run` in its own process on `port`, configured for the cluster `world`, logging to
    tmp/agent.log (inside the soak probe with --diagnose)."""
    cfg = tmp / "agent.yaml"
    cfg.write_text(json.dumps(agent_config(world, port, args.scrape_s, args.retention_s,
                                           min(args.retention_s, 60.0), not args.no_kv,
                                           SOAK_KV_LIMITS if args.kv_limits == "soak" else None)))
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    env.update(kv.split("=", 1) for kv in args.env)
    command = [sys.executable, "-m", "agent.cli", "run", "-c", str(cfg)]
    if probes:
        command[1:1] = [str(PROBE), "--out", str(probes["agent"]), "--interval-s",
                        str(probe_s), "--baseline-s", str(warmup_s), "--label", "agent"]
    return subprocess.Popen(command, env=env, cwd=ROOT,
                            stdout=subprocess.DEVNULL, stderr=open(tmp / "agent.log", "w"))


def wait_for_agent(agent: subprocess.Popen, url: str, log: Path) -> None:
    """Until the agent answers GET /metrics (a minute at most)."""
    deadline = time.monotonic() + 60
    while True:
        try:
            get_metrics(url, 2.0)
            break
        except OSError:
            if agent.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError("the agent did not start: " + log.read_text()[-2000:])
            time.sleep(0.2)


def take_samples(agent: subprocess.Popen, cluster_pid: int, url: str, duration_s: float,
                 sample_s: float) -> list[dict]:
    """A sample every `sample_s` seconds for `duration_s`, each printed as a line."""
    samples: list[dict] = []
    t0 = time.monotonic()
    print(f"{'min':>6} {'rss MiB':>8} {'cluster MiB':>11} {'fds':>4} {'metrics ms':>10} {'rows':>8} {'body kB':>8}")
    while (t := time.monotonic() - t0) < duration_s:
        if agent.poll() is not None:
            raise RuntimeError(f"the agent exited with {agent.returncode}")
        try:
            took, rows, size = get_metrics(url)
        except OSError as exc:
            took, rows, size = float("nan"), None, 0
            print(f"  /metrics failed: {exc}", flush=True)
        s = {"t": t, "rss": proc_status(agent.pid), "cluster_rss": proc_status(cluster_pid),
             "fds": open_fds(agent.pid), "metrics_ms": took * 1000, "rows": rows, "body": size}
        samples.append(s)
        print(f"{t / 60:6.1f} {s['rss'] / 2**20:8.1f} {s['cluster_rss'] / 2**20:11.1f} {s['fds']:4d} "
              f"{s['metrics_ms']:10.1f} {rows if rows is not None else '-':>8} {size / 1000:8.1f}", flush=True)
        time.sleep(max(0.0, sample_s - (time.monotonic() - t0 - t)))
    return samples


def stop_processes(agent: subprocess.Popen | None, stop: Any, cluster: Any) -> None:
    """The agent (SIGTERM, then SIGKILL after 15 s), then the cluster (its stop event, then kill after 30 s)."""
    if agent is not None and agent.poll() is None:
        agent.send_signal(signal.SIGTERM)
        with contextlib.suppress(subprocess.TimeoutExpired):
            agent.wait(15)
        if agent.poll() is None:
            agent.kill()
    stop.set()
    cluster.join(30)
    if cluster.is_alive():
        cluster.kill()


def write_csv(path: Path, samples: list[dict]) -> None:
    keys = list(samples[0]) if samples else []
    path.write_text(",".join(keys) + "\n" + "".join(",".join(str(s[k]) for k in keys) + "\n" for s in samples))


def print_growth(r: dict[str, float]) -> None:
    """The figures after the warm-up (`summarise`)."""
    print(f"\nafter warm-up (from {r['fit_from_s'] / 60:.1f} min, {r['fit_points']} samples):")
    print(f"  agent RSS   {r['rss_first_mb']:.0f} -> {r['rss_last_mb']:.0f} MB (max {r['rss_max_mb']:.0f}); "
          f"growth {r['rss_mb_per_h']:+.1f} MB/h = {r['rss_mb_per_h'] / TARGET_MB_PER_H:.2f} x the "
          f"{TARGET_MB_PER_H:g} MB/h target")
    print(f"  cluster RSS growth {r['cluster_rss_mb_per_h']:+.1f} MB/h (the emulated cluster's process)")
    print(f"  FDs {r['fds_per_h']:+.1f}/h; store rows {r['rows_per_h']:+.0f}/h")
    ratio = r["metrics_last_ms"] / r["metrics_first_ms"] if r["metrics_first_ms"] > 0 else float("nan")
    print(f"  /metrics median {r['metrics_first_ms']:.1f} ms (first third) -> {r['metrics_last_ms']:.1f} ms "
          f"(last third) = {ratio:.2f} x; max {r['metrics_first_max_ms']:.1f} -> {r['metrics_last_max_ms']:.1f} ms")


def print_diagnosis(probes: dict[str, Path], diagnose: Path) -> None:
    print(f"\nwhat grows (bench/helpers/soak_probe.py, files in {diagnose}; the probe's tracing adds its own memory):")
    for path in probes.values():
        print("\n".join(soak_probe.diagnose(path)) if path.exists() else f"{path.name}: no probe output")


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    duration_s = args.minutes * 60.0
    warmup_s = (args.warmup_min * 60.0 if args.warmup_min is not None
                else max(duration_s / 4, 2 * args.retention_s))
    probe_s = args.sample_s * 3
    probes = probe_files(args.diagnose)
    span_s = (duration_s + 120.0) * args.time_scale
    cluster_probe = (str(probes["cluster"]), probe_s, warmup_s) if probes else None
    cluster, info, stop = start_cluster(args, span_s, cluster_probe)
    agent: subprocess.Popen | None = None
    samples: list[dict] = []
    tmp = tempfile.TemporaryDirectory(prefix="tierpilot-soak-")
    try:
        world = info.get(timeout=600)
        port = free_port()
        agent = start_agent(args, world, port, Path(tmp.name), probes, probe_s, warmup_s)
        url = f"http://127.0.0.1:{port}/metrics"
        print(f"soak: {world['requests']:,} requests; agent pid {agent.pid} on {url}; scrape {args.scrape_s:g} s, "
              f"retention {args.retention_s:g} s; KV limits {args.kv_limits}; {args.minutes:g} min, fit after "
              f"{warmup_s / 60:.1f} min",
              flush=True)
        wait_for_agent(agent, url, Path(tmp.name) / "agent.log")
        samples = take_samples(agent, cluster.pid or 0, url, duration_s, args.sample_s)
    finally:
        stop_processes(agent, stop, cluster)
        tmp.cleanup()
    if args.csv is not None:
        write_csv(args.csv, samples)
    if len(samples) < 3:
        print("too few samples for a fit")
        return 1
    print_growth(summarise(samples, warmup_s))
    if probes:
        print_diagnosis(probes, args.diagnose)
    return 0


if __name__ == "__main__":
    sys.exit(main())
