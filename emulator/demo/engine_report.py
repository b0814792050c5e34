"""The real-engine demo's record of a pass and its report.md (the emulated demo's scorecard, from
the TTFT each request saw at the client in the tuned and the held pass)."""
from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from contracts.knobs import Knobs
from emulator.demo.scorecard import plan_lines
from emulator.demo.workload import DemoWorkload
from emulator.engines.client import Completion
from emulator.engines.process_actuator import Restart
from tuners.payoff import WHOLE_RUN, ActionCounts, score_phases, scorecard_lines

METHOD = ("tuned = every request of the tuned pass as the client saw it (TTFT = response time of a max_tokens=1 "
          "completion through vllm-router, router restarts included); held = the same stream (same lengths, "
          "sharing and arrival times; fresh token content, so nothing is cached from the other pass) with the "
          "defaults held (round-robin). Hindsight is not measured on real engines (it needs one more real pass "
          "per static configuration), so captured gain is n/a.")


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

    def ok(self) -> list[Completion]:
        return [c for c in self.completions if c.ok]

    def hit_ratio(self) -> float:
        ok = [c for c in self.ok() if c.cached_tokens is not None]
        prompt = sum(c.prompt_tokens for c in ok)
        return sum(c.cached_tokens or 0 for c in ok) / prompt if prompt else math.nan

    def summary_lines(self, held: RunRecord) -> list[str]:
        pairs = _paired(self, held)
        if not pairs:
            return ["no request was served in both passes: no verdict"]
        ratio, lo, hi = tuned_vs_held([t for t, _ in pairs], [h for _, h in pairs])
        t = np.asarray([t for t, _ in pairs])
        h = np.asarray([h for _, h in pairs])
        verdict = "not worse than" if ratio >= 1.0 else "SLOWER than"
        return [(f"tuned mean TTFT {t.mean() * 1e3:.1f} ms vs held {h.mean() * 1e3:.1f} ms: held/tuned = {ratio:.2f}x "
                f"(90% bootstrap interval {lo:.2f}-{hi:.2f}x over {len(pairs)} paired requests); "
                f"p95 {np.quantile(t, 0.95) * 1e3:.1f} vs {np.quantile(h, 0.95) * 1e3:.1f} ms; "
                f"tuned is {verdict} held on the mean"),
                f"GPU hit ratio: tuned {self.hit_ratio():.3f}, held {held.hit_ratio():.3f} (engines' cached_tokens)"]


def tuned_vs_held(tuned: list[float], held: list[float], *, seed: int = 0, rounds: int = 2000) -> tuple[float, float, float]:
    """held mean / tuned mean, with a 90% bootstrap interval over requests (pairs resampled together:
    request i of the tuned pass is request i of the held pass)."""
    t, h = np.asarray(tuned, float), np.asarray(held, float)
    n = min(len(t), len(h))
    t, h = t[:n], h[:n]
    rng = np.random.default_rng(seed)
    idx = rng.integers(0, n, (rounds, n))
    ratios = h[idx].mean(axis=1) / t[idx].mean(axis=1)
    return float(h.mean() / t.mean()), float(np.quantile(ratios, 0.05)), float(np.quantile(ratios, 0.95))


def _paired(tuned: RunRecord, held: RunRecord) -> list[tuple[float, float]]:
    h = {c.index: c.latency_s for c in held.ok()}
    return [(c.latency_s, h[c.index]) for c in tuned.ok() if c.index in h]


def _by_phase(record: RunRecord, phases: Sequence[int], keep: set[int]) -> dict[int, list[float]]:
    out: dict[int, list[float]] = {}
    for c in record.ok():
        if c.index in keep:
            out.setdefault(phases[c.index], []).append(c.latency_s)
    return out


def _kv_lines(record: RunRecord) -> list[str]:
    snap = record.kv
    if snap is None:
        return ["- no KV-event snapshot"]
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
    return [(f"- engines' own counters (prefix_cache_hits / queries since start, both passes so far): {engines:.4f}; "
            f"the agent's cumulative GPU hit ratio at the end of the pass: {agent}; this pass's cached_tokens / "
            f"prompt tokens at the client: {record.hit_ratio():.4f}")]


def write_engine_report(report_dir: Path, workload: DemoWorkload, records: Sequence[RunRecord],
                        restarts: Sequence[Restart], facts: Mapping[str, str]) -> Path:
    report_dir.mkdir(parents=True, exist_ok=True)
    phases = workload.frame["phase"].to_list()
    lines = ["# tierpilot demo on real vLLM engines", ""]
    lines += [f"- {k}: {v}" for k, v in facts.items()]
    tuned = next((r for r in records if r.name == "tuned"), None)
    held = next((r for r in records if r.name == "held"), None)
    lines += ["", "## Verdict", ""]
    if tuned is None or held is None or tuned.interrupted or held.interrupted:
        lines.append("Interrupted: no verdict (it needs both passes).")
    else:
        keep = {c.index for c in tuned.ok()} & {c.index for c in held.ok()}
        actions: dict[int, ActionCounts] = {}
        for t, msg in tuned.events:  # every configuration change the tuner made, in the phase it made it
            p = sum(1 for start in workload.phase_starts_s[1:] if t >= start)
            if not msg.startswith("tuner: "):
                continue
            change = ActionCounts(applies=int(msg.startswith(("tuner: trial_started", "tuner: rolled_back"))),
                                  rollbacks=int(msg.startswith("tuner: rolled_back")))
            actions[p] = actions.get(p, ActionCounts()) + change
        scores = score_phases(workload.labels, _by_phase(held, phases, keep), _by_phase(tuned, phases, keep), {},
                              actions)
        lines += scorecard_lines(scores) + ["", tuned.summary_lines(held)[0], "", f"Method: {METHOD}"]
        failed = [(r.name, len(r.completions) - len(r.ok())) for r in records]
        lines += ["", "Failed requests: " + ", ".join(f"{n} {k}" for n, k in failed)]
        whole = next(s for s in scores if s.label == WHOLE_RUN)
        lines += [f"Whole run, requests in both passes: {whole.tuned.requests}."]
    lines += ["", "## What the tuner did (tuned pass, seconds from its start)", ""]
    lines += [f"- {t:.1f} s: {m}" for t, m in (tuned.events if tuned else [])] or ["- nothing"]
    if tuned and tuned.plans:
        lines += ["", "Every move the planner priced (seconds from the pass's start; gains are the twin's):", "",
                  *plan_lines(tuned.plans)]
    lines += ["", "## Process restarts", ""]
    lines += [f"- {r.target} at {r.at:.1f} s (monotonic): {r.reason}, healthy after {r.seconds:.1f} s"
              for r in restarts] or ["- none"]
    for r in records:
        lines += ["", f"## The agent in the {r.name} pass ({r.agent_url})", ""]
        lines += _counter_lines(r) + _kv_lines(r)
        lines += [f"- configuration at the end: {r.final_knobs.router if r.final_knobs else 'n/a'} router"]
    with open(report_dir / "requests.csv", "w") as f:  # every request of every pass, for a closer look
        f.write("pass,index,phase,sent_s,latency_s,prompt_tokens,cached_tokens,error\n")
        for r in records:
            f.writelines(f"{r.name},{c.index},{phases[c.index]},{c.sent_s:.3f},{c.latency_s:.4f},{c.prompt_tokens},"
                         f"{'' if c.cached_tokens is None else c.cached_tokens},{c.error.replace(',', ';')}\n"
                         for c in r.completions)
    lines += ["", "Every request: requests.csv (pass, index, phase, sent_s, latency_s, prompt and cached tokens)."]
    path = report_dir / "report.md"
    path.write_text("\n".join(lines) + "\n")
    return path


__all__ = ["METHOD", "RunRecord", "tuned_vs_held", "write_engine_report"]
