"""One pass of the real-engine demo: the stream through a fleet's router while its `tierpilot run`
watches (and, in the tuned pass, tunes through the Kubernetes API), recorded for the report.

What the pass records, on its own clock (seconds from the stream's start):
- every request as the client saw it (emulator/engines/paired.py sends both passes' request i at
  once);
- the agent's tuning steps (its log: `tuning step: ... state=trial_started ...`), and every plan its
  planner priced (its /healthz `info.tuner_plan`, polled);
- the kubelet's rollouts of the fleet's Deployments (a pod stopped because its template changed,
  its successor ready), which are the changes' real restarts;
- at the end, the knobs the engines run (their Deployment's `--kv-transfer-config`), the engines'
  own counters (GPU prefix cache, CPU and fs tier chunks, prompt tokens by cache source) and the
  agent's view of the same.
"""
from __future__ import annotations

import json
import re
import time
import urllib.request
from collections.abc import Callable, Sequence
from typing import Any

from contracts.knobs import Knobs
from emulator.demo.engine_cluster import FleetDesign
from emulator.demo.engine_kube import AgentProcess, KubeWorld
from emulator.demo.engine_report import Restart, RunRecord
from emulator.demo.engine_tuning import knobs_text
from emulator.demo.workload import DemoWorkload
from emulator.engines.client import StreamSender
from emulator.engines.paired import PairedSend
from emulator.engines.prompts import PromptBuilder, prompts

TICK_S = 0.5
STEP = re.compile(r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d),(\d{3}) \w+ [\w.]+: tuning step: phase=(\d+) state=(\w+) "
                  r"trial=(\S+) ?(.*)$")
WARM = re.compile(r'^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d),(\d{3}) \w+ [\w.]+: (\{"event": "warm_start".*\})$')
QUIET = ("measuring", "baseline", "holding", "idle", "settling", "waiting")
COUNTERS = {
    "gpu_hits": ("vllm:prefix_cache_hits_total", None),
    "gpu_queries": ("vllm:prefix_cache_queries_total", None),
    "cpu_chunk_hits": ("vllm:kv_offload_tiering_chunk_hits_total", 'tier="0:primary"'),
    "cpu_chunk_queries": ("vllm:kv_offload_tiering_chunk_queries_total", 'tier="0:primary"'),
    "fs_chunk_hits": ("vllm:kv_offload_tiering_chunk_hits_total", 'tier="1:fs"'),
    "fs_chunk_queries": ("vllm:kv_offload_tiering_chunk_queries_total", 'tier="1:fs"'),
    "cached_device": ("vllm:prompt_tokens_cached_by_source_total", 'source="device"'),
    "cached_host": ("vllm:prompt_tokens_cached_by_source_total", 'source="host"'),
    "cached_disk": ("vllm:prompt_tokens_cached_by_source_total", 'source="disk"'),
    "prompt_tokens": ("vllm:prompt_tokens_total", None),
}


def log_epoch(stamp: str, millis: str) -> float:
    """The logging module's `asctime` (local time) as seconds since the epoch."""
    return time.mktime(time.strptime(stamp, "%Y-%m-%d %H:%M:%S")) + int(millis) / 1000


def tuning_steps(lines: Sequence[str]) -> list[tuple[float, str]]:
    """(epoch, `tuner: <state> (trial N): message`) for every tuning step that did something, and
    (epoch, `twin search: ...`) for each twin search's best candidates (pure)."""
    out = []
    for line in lines:
        w = WARM.match(line)
        if w is not None:
            event = json.loads(w.group(3))
            best = "; ".join(knobs_text(Knobs(**c)) for c in event.get("candidates", [])) or "none"
            out.append((log_epoch(w.group(1), w.group(2)), f"twin search ({event.get('trials')} trials): best {best}"))
            continue
        m = STEP.match(line)
        if m is None or m.group(4) in QUIET:
            continue
        trial = "" if m.group(5) == "None" else f" (trial {m.group(5)})"
        out.append((log_epoch(m.group(1), m.group(2)), f"tuner: {m.group(4)}{trial}" + (f": {m.group(6)}" if m.group(6) else "")))
    return out


def counters_from_text(text: str) -> dict[str, float]:
    """The engine's own counters of COUNTERS from its /metrics text (absent: not reported) (pure)."""
    out: dict[str, float] = {}
    for key, (metric, label) in COUNTERS.items():
        for m in re.finditer(rf"^{re.escape(metric)}{{([^}}]*)}} ([0-9.e+-]+)$", text, re.MULTILINE):
            if label is None or label in m.group(1):
                out[key] = out.get(key, 0.0) + float(m.group(2))
    return out


def knobs_from_deployment(obj: dict[str, Any], base: Knobs) -> Knobs:
    """The tier knobs an engine Deployment's `--kv-transfer-config` gives (`base` for the rest)."""
    args = obj["spec"]["template"]["spec"]["containers"][0]["args"]
    extra = json.loads(args[args.index("--kv-transfer-config") + 1])["kv_connector_extra_config"]
    return base.replace(cpu_gib=extra["cpu_bytes_to_use"] / (1 << 30),
                        chunk_tokens=int(extra.get("block_size", base.chunk_tokens)),
                        cpu_eviction=extra.get("eviction_policy", base.cpu_eviction))


def rollouts(world: KubeWorld, deployments: Sequence[str], t0: float) -> list[Restart]:
    """Each pod of `deployments` stopped for a new template, with its successor's time to ready."""
    out = []
    for stop in world.events:
        if stop.what != "stopped" or stop.reason != "pod template changed":
            continue
        dep = stop.pod.rsplit("-", 2)[0]
        if dep not in deployments:
            continue
        ready = next((at for pod, at in world.ready if pod.rsplit("-", 2)[0] == dep and at > stop.at), None)
        out.append(Restart(dep, stop.at - t0, (ready - stop.at) if ready is not None else float("nan"),
                           "the pod template changed (the agent's patch): stopped, started with the new args"))
    return out


class EnginePass:
    """One pass of the stream through `design`'s router, with `agent` watching it."""

    def __init__(self, design: FleetDesign, world: KubeWorld, agent: AgentProcess, router_url: str,
                 workload: DemoWorkload, *, salt: int, paired: PairedSend, progress: Callable[[str], None],
                 base_knobs: Knobs, wall: Callable[[], float] = time.monotonic) -> None:
        self.d, self.world, self.agent, self.router_url = design, world, agent, router_url
        self.workload, self.salt, self.paired, self.progress = workload, salt, paired, progress
        self.base_knobs, self.wall = base_knobs, wall
        self.record = RunRecord(design.name, agent_url=agent.url)
        self.t0 = wall()
        self.epoch0 = time.time()
        self.sender: StreamSender | None = None
        self._seen_plans: set[Any] = set()
        self._log_at = 0

    def now(self) -> float:
        return self.wall() - self.t0

    def run(self) -> RunRecord:
        frame = self.workload.frame
        ids = list(prompts(frame, PromptBuilder(salt=self.salt)))
        offsets = [t / 1000 for t in frame["timestamp_ms"].to_list()]
        self.sender = StreamSender(self.router_url, model="tiny-llama", retry_for_s=90.0)
        thread = self.paired.join(self.d.name, self.sender, ids, offsets)  # waits for the other pass
        self.t0, self.epoch0 = self.wall(), time.time()
        last_note = -10.0
        try:
            while thread.is_alive():
                self._watch_agent()
                if self.now() - last_note >= 20:
                    last_note = self.now()
                    self.progress(f"{self.d.name}: {self.now():5.0f} s of {self.workload.span_s:.0f} s")
                time.sleep(TICK_S)
        except KeyboardInterrupt:
            self.sender.stop.set()
            self.record.interrupted = True
            raise
        finally:
            thread.join(timeout=120)
            self._watch_agent()
            self._finish()
        return self.record

    def _watch_agent(self) -> None:
        lines = self.agent.log_lines(self._log_at)
        self._log_at += len(lines)
        for at, msg in tuning_steps(lines):
            self._note(at - self.epoch0, msg)
        info = (self.agent.health() or {}).get("info") or {}
        plan = info.get("tuner_plan")
        if plan and plan.get("at") not in self._seen_plans:
            self._seen_plans.add(plan.get("at"))
            plan = {**plan, "at": plan["at"] - self.epoch0 if plan.get("at") is not None else None}
            self.record.plans.append(plan)
            self._note_plan(plan)

    def _note_plan(self, plan: dict[str, Any]) -> None:
        priced = plan.get("priced") or []
        best = max(priced, key=lambda d: -1e18 if d.get("gain_per_hour_s") is None else d["gain_per_hour_s"], default=None)
        if best is None:
            self._note(self.now(), "planner: nothing to price")
            return
        moves = ", ".join(f"{k} {b}" for k, (_a, b) in best["knobs"].items())
        self._note(self.now(), f"planner: best move {moves}: {best['verdict']}"
                   + (f" ({best['reason']})" if best.get("reason") else ""))

    def _note(self, at: float, msg: str) -> None:
        self.record.events.append((at, msg))
        self.progress(f"{self.d.name}: {at:5.0f} s  {msg}")

    def _finish(self) -> None:
        from emulator.demo.probe import fetch_agent_text, parse_agent_view

        rec = self.record
        rec.completions = sorted(self.paired.done[self.d.name], key=lambda c: c.index)
        names = self.d.engine_names()
        first = self.world.deployment(names[0])
        rec.final_knobs = knobs_from_deployment(first, self.base_knobs) if first else None
        text = fetch_agent_text(f"{self.agent.url}/metrics", timeout_s=5.0)
        view = parse_agent_view(text) if text else None
        rec.agent_hit_ratio = view.cumulative_hit_ratio if view else None
        rec.agent_tier_ratios = dict(view.tier_hit_ratios) if view else {}
        rec.restarts = rollouts(self.world, names, self.world_t0())
        for name in names:
            pod = (self.world.kubelet.pods.get(name) or {}).get(0) if self.world.kubelet else None
            if pod is None:
                continue
            try:
                with urllib.request.urlopen(f"http://{pod.ip}:{self.d.ports.engines[names.index(name)][0]}/metrics",
                                            timeout=5) as r:
                    rec.engine_tiers[name] = counters_from_text(r.read().decode())
            except OSError:
                continue
        c = rec.engine_tiers
        rec.engine_counters = {n: (v.get("gpu_hits", float("nan")), v.get("gpu_queries", float("nan")))
                               for n, v in c.items()}

    def world_t0(self) -> float:
        """The pass's start on the kubelet's clock (the world's monotonic clock)."""
        return self.world.clock() - self.now()


__all__ = ["COUNTERS", "EnginePass", "counters_from_text", "knobs_from_deployment", "rollouts", "tuning_steps"]
