"""The real-engine demo's record of a pass and its report.md (the emulated demo's scorecard, from
the TTFT each request saw at the client in the tuned and the held pass)."""
from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from contracts.knobs import Knobs
from contracts.output_paths import replacing, write_output
from emulator.demo.engine_charts import plot_engine_hit_ratios, plot_engine_ttft
from emulator.demo.engine_tuning import knobs_text
from emulator.demo.paired_verdict import PairedVerdict, paired_verdict
from emulator.demo.scorecard import PLAN_NOTE, plan_lines
from emulator.demo.workload import DemoWorkload
from emulator.engines.client import Completion
from tuners.payoff import WHOLE_RUN, ActionCounts, score_phases, scorecard_lines

METHOD = ("tuned = every request of the tuned pass as the client saw it (TTFT = response time of a max_tokens=1 "
          "completion through vllm-router, engine restarts included); held = the same stream (same lengths, "
          "sharing and arrival times; fresh token content, so nothing is cached from the other pass) with the "
          "starting configuration held. Hindsight is not measured on real engines (it needs one more real pass "
          "per static configuration), so captured gain is n/a. Noise or effect: the requests sent before the "
          "tuner's first change went to two fleets with the same configuration, so they measure the noise floor of "
          "this machine (fleet bias included); the effect is the ratio after the change over that one, each from "
          "four consecutive blocks of requests, and is stated only when its 95% prediction interval (the fleets' "
          "bias drifts: the after segment may sit where one more A/A block would) excludes no change "
          "(emulator/demo/paired_verdict.py).")
HIT_RATIOS = (
    "- **engines' counters**: `vllm:prefix_cache_hits_total / vllm:prefix_cache_queries_total` summed over the "
    "fleet's engines since they started: the warm-up requests included, and every lookup vLLM makes;\n"
    "- **the agent's cumulative**: `tierpilot_kv_cumulative_hit_ratio`, the share of prompt tokens served from "
    "any cache tier over the agent's last window ({window}) at the end of the pass, averaged over the engines: "
    "the end of the stream only;\n"
    "- **the client's**: `cached_tokens / prompt_tokens` summed over every request of this pass that succeeded "
    "(vLLM's `usage.prompt_tokens_details.cached_tokens`: whole blocks of the prompt found cached), the whole "
    "pass and nothing else;\n"
    "- **engines' tier counters**: per tier, `vllm:kv_offload_tiering_chunk_hits_total / "
    "vllm:kv_offload_tiering_chunk_queries_total` (`tier=\"0:primary\"`: the CPU tier; `\"1:fs\"`: the shared fs "
    "tier), the offload chunks looked up below the KV cache, summed over the fleet's engines since each last started "
    "(a restart resets them); and `vllm:prompt_tokens_cached_by_source_total` per source (device: the KV cache, "
    "host: the CPU tier, disk: the fs tier) over `vllm:prompt_tokens_total`, the share of prompt tokens each served;\n"
    "- **the agent's per tier**: `tierpilot_kv_hit_ratio{{tier}}` over its last window at the end of the pass, "
    "averaged over the engines.")


@dataclasses.dataclass(frozen=True)
class Restart:
    """One rollout of an engine: its Deployment, when (seconds from the pass's start), how long until
    the new pod was ready, why."""

    target: str
    at: float
    seconds: float
    reason: str


@dataclasses.dataclass
class RunRecord:
    name: str
    completions: list[Completion] = dataclasses.field(default_factory=list)
    events: list[tuple[float, str]] = dataclasses.field(default_factory=list)
    final_knobs: Knobs | None = None
    kv: Any = None  # agent.kvevents KvSnapshot at the end of the pass
    agent_hit_ratio: float | None = None
    engine_counters: dict[str, tuple[float, float]] = dataclasses.field(default_factory=dict)
    agent_url: str = ""
    interrupted: bool = False
    plans: list[dict] = dataclasses.field(default_factory=list)  # every plan the tuner's planner priced
    agent_tier_ratios: dict[str, float] = dataclasses.field(default_factory=dict)  # tier -> the agent's hit ratio
    engine_tiers: dict[str, dict[str, float]] = dataclasses.field(default_factory=dict)  # engine -> its counters
    restarts: list[Restart] = dataclasses.field(default_factory=list)  # the fleet's rollouts (seconds from start)

    def ok(self) -> list[Completion]:
        return [c for c in self.completions if c.ok]

    def hit_ratio(self) -> float:
        ok = [c for c in self.ok() if c.cached_tokens is not None]
        prompt = sum(c.prompt_tokens for c in ok)
        return sum(c.cached_tokens or 0 for c in ok) / prompt if prompt else math.nan

    def changed_at(self) -> float | None:
        """When this pass's configuration first changed (seconds from its start), or None: the first
        rollout of its engines, or the tuner's first started trial when nothing was rolled."""
        times = [t for t, msg in self.events if msg.startswith("tuner: trial_started")]
        return min(times + [r.at for r in self.restarts], default=None)

    def verdict(self, held: RunRecord) -> PairedVerdict | None:
        """Noise or effect, on the requests both passes served (None: there are none)."""
        h = {c.index: c.latency_s for c in held.ok()}
        pairs = [(c.sent_s, c.latency_s, h[c.index]) for c in self.ok() if c.index in h]
        if not pairs:
            return None
        sent, tuned, held_s = zip(*pairs, strict=True)
        return paired_verdict(sent, tuned, held_s, self.changed_at())

    def summary_lines(self, held: RunRecord) -> list[str]:
        verdict = self.verdict(held)
        if verdict is None:
            return ["no request was served in both passes: no verdict"]
        return [verdict.sentence(),
                (f"GPU prefix-cache hit ratio at the client (cached / prompt tokens): tuned {self.hit_ratio():.3f}, "
                f"held {held.hit_ratio():.3f}")]


def _by_phase(record: RunRecord, phases: Sequence[int], keep: set[int]) -> dict[int, list[float]]:
    out: dict[int, list[float]] = {}
    for c in record.ok():
        if c.index in keep:
            out.setdefault(phases[c.index], []).append(c.latency_s)
    return out


def _kv_lines(record: RunRecord) -> list[str]:
    snap = record.kv
    if snap is None:
        return []  # the agent in a process of its own: its KV-event figures are on its /metrics
    lines = []
    for e in snap.engines:
        s = e.stream
        rejected = sum(s.rejected.values())
        lines.append(f"- {e.engine}: {s.messages} messages, stored {s.events.get('BlockStored', 0)}, removed "
                     f"{s.events.get('BlockRemoved', 0)}, cleared {s.events.get('AllBlocksCleared', 0)}; resident "
                     f"blocks {dict(e.resident_blocks)}; gaps {s.gaps} (replayed {s.replayed_messages}, lost "
                     f"{s.lost_messages}); rejected {rejected}")
    return lines


def _counter_lines(record: RunRecord) -> list[str]:
    hits = sum(h for h, _q in record.engine_counters.values())
    queries = sum(q for _h, q in record.engine_counters.values())
    engines = hits / queries if queries else math.nan
    agent = "n/a" if record.agent_hit_ratio is None else f"{record.agent_hit_ratio:.4f}"
    return [(f"- hit ratios (defined above): engines' counters {engines:.4f}; the agent's cumulative {agent}; "
            f"the client's {record.hit_ratio():.4f}")]


def _tier_lines(record: RunRecord) -> list[str]:
    def total(key: str) -> float:
        return sum(v.get(key, 0.0) for v in record.engine_tiers.values())

    def ratio(a: float, b: float) -> str:
        return f"{a / b:.4f}" if b else "n/a"

    if not record.engine_tiers:
        return ["- engines' tier counters: not read"]
    prompt = total("prompt_tokens")
    agent = ", ".join(f"{t} {v:.4f}" for t, v in sorted(record.agent_tier_ratios.items())) or "n/a"
    return [(f"- engines' tier counters: CPU tier chunk hits {ratio(total('cpu_chunk_hits'), total('cpu_chunk_queries'))} "
            f"({total('cpu_chunk_hits'):.0f} of {total('cpu_chunk_queries'):.0f}), fs tier "
            f"{ratio(total('fs_chunk_hits'), total('fs_chunk_queries'))} ({total('fs_chunk_hits'):.0f} of "
            f"{total('fs_chunk_queries'):.0f}); prompt tokens served by the KV cache {ratio(total('cached_device'), prompt)}, "
            f"the CPU tier {ratio(total('cached_host'), prompt)}, the fs tier {ratio(total('cached_disk'), prompt)}"),
            f"- the agent's per tier: {agent}"]


def _verdict_lines(workload: DemoWorkload, tuned: RunRecord, held: RunRecord,
                   restarts: Sequence[Restart] = ()) -> list[str]:
    """The answer, what the tuner priced when it applied nothing, the scorecard and the method."""
    phases = workload.frame["phase"].to_list()
    verdict = tuned.verdict(held)
    if verdict is None:
        return ["No verdict: no request was served in both passes."]
    lines = [verdict.sentence(), ""]
    if not verdict.applied:
        dry = any(m.startswith("tuner: dry_run") for _t, m in tuned.events)
        why = " (a dry run: the moves marked apply were proposed, not applied)" if dry else ""
        head = (f"The tuner applied nothing{why}. Every move it priced, with its verdict and reason (seconds from "
                "the pass's start; changes are the twin's):")
        lines += ([head, "", PLAN_NOTE, "", *plan_lines(tuned.plans), ""] if tuned.plans else
                  [f"The tuner applied nothing{why} and priced no move: " + _idle_reason(tuned), ""])
    keep = {c.index for c in tuned.ok()} & {c.index for c in held.ok()}
    actions: dict[int, ActionCounts] = {}
    for t, msg in tuned.events:  # every configuration change the tuner made, in the phase it made it
        p = sum(1 for start in workload.phase_starts_s[1:] if t >= start)
        if not msg.startswith("tuner: "):
            continue
        change = ActionCounts(applies=int(msg.startswith(("tuner: trial_started", "tuner: rolled_back"))),
                              rollbacks=int(msg.startswith("tuner: rolled_back")))
        actions[p] = actions.get(p, ActionCounts()) + change
    for r in restarts:  # every engine of the tuned fleet the kubelet restarted for a new template
        if r.target.startswith(f"vllm-{tuned.name}-"):
            p = sum(1 for start in workload.phase_starts_s[1:] if r.at >= start)
            actions[p] = actions.get(p, ActionCounts()) + ActionCounts(restarts=1)
    scores = score_phases(workload.labels, _by_phase(held, phases, keep), _by_phase(tuned, phases, keep), {}, actions)
    lines += scorecard_lines(scores) + ["", f"Method: {METHOD}"]
    failed = [(r.name, len(r.completions) - len(r.ok())) for r in (tuned, held)]
    lines += ["", "Failed requests: " + ", ".join(f"{n} {k}" for n, k in failed)]
    whole = next(s for s in scores if s.label == WHOLE_RUN)
    lines += [f"Whole run, requests in both passes: {whole.tuned.requests}."]
    lines += ["", "![TTFT of both passes](ttft_p95.png)", "", "![Hit ratios of both passes](hit_ratios.png)"]
    return lines


def _idle_reason(tuned: RunRecord) -> str:
    notes = [m for _t, m in tuned.events if m.startswith(("tuner: ", "planner: "))]
    return ("its last word was: " + notes[-1]) if notes else "the controller never reached a plan (see below)"


def write_engine_report(report_dir: Path, workload: DemoWorkload, records: Sequence[RunRecord],
                        restarts: Sequence[Restart], facts: Mapping[str, str], *, agent_window_s: float = 12.0) -> Path:
    report_dir.mkdir(parents=True, exist_ok=True)
    phases = workload.frame["phase"].to_list()
    lines = ["# tierpilot demo on real vLLM engines", ""]
    lines += [f"- {k}: {v}" for k, v in facts.items()]
    tuned = next((r for r in records if r.name == "tuned"), None)
    held = next((r for r in records if r.name == "held"), None)
    lines += ["", "## Verdict: did tuning pay for itself?", ""]
    if tuned is None or held is None or tuned.interrupted or held.interrupted:
        lines.append("Interrupted: no verdict (it needs both passes).")
    else:
        lines += _verdict_lines(workload, tuned, held, restarts)
        changes = [t for t, m in tuned.events if m.startswith(("tuner: trial_started", "tuner: rolled_back"))]
        passes = {r.name: r.completions for r in (tuned, held)}
        plot_engine_ttft(passes, workload.phase_starts_s, changes, workload.span_s, report_dir / "ttft_p95.png")
        plot_engine_hit_ratios(passes, workload.phase_starts_s, changes, workload.span_s, report_dir / "hit_ratios.png")
    lines += ["", "## What the tuner did (tuned pass, seconds from its start)", ""]
    lines += [f"- {t:.1f} s: {m}" for t, m in (tuned.events if tuned else [])] or ["- nothing"]
    if tuned and tuned.plans:
        lines += ["", "### Every move the planner priced", "", PLAN_NOTE, "", *plan_lines(tuned.plans)]
    lines += ["", "## Engine restarts (the kubelet's rollouts, seconds from the pass's start)", ""]
    lines += [f"- {r.target} at {r.at:.1f} s: {r.reason}; " + (f"ready after {r.seconds:.1f} s" if math.isfinite(r.seconds)
                                                               else "not ready by the end of the pass")
              for r in restarts] or ["- none"]
    lines += ["", "## Hit ratios: what each counts", "", HIT_RATIOS.format(window=f"{agent_window_s:g} s")]
    for r in records:
        lines += ["", f"## The agent in the {r.name} pass ({r.agent_url})", ""]
        lines += _counter_lines(r) + _tier_lines(r) + _kv_lines(r)
        lines += [f"- configuration at the end: {knobs_text(r.final_knobs) if r.final_knobs else 'n/a'}"]
    with replacing(report_dir / "requests.csv") as tmp, open(tmp, "w") as f:  # every request, for a closer look
        f.write("pass,index,phase,sent_s,latency_s,prompt_tokens,cached_tokens,error\n")
        for r in records:
            f.writelines(f"{r.name},{c.index},{phases[c.index]},{c.sent_s:.3f},{c.latency_s:.4f},{c.prompt_tokens},"
                         f"{'' if c.cached_tokens is None else c.cached_tokens},{c.error.replace(',', ';')}\n"
                         for c in r.completions)
    lines += ["", "Every request: requests.csv (pass, index, phase, sent_s, latency_s, prompt and cached tokens)."]
    path = report_dir / "report.md"
    write_output(path, "\n".join(lines) + "\n")
    return path


__all__ = ["HIT_RATIOS", "METHOD", "Restart", "RunRecord", "write_engine_report"]
