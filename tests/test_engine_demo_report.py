"""The real-engine demo's verdict from recorded passes (no engine): pairing, the answer sentence
(noise or effect), the plans priced when nothing was applied, the scorecard, the charts and the
hit ratios' definitions in report.md, the demo-scale workload, and the settings' one-line errors."""
from __future__ import annotations

import pytest

from contracts.knobs import DEFAULT_KNOBS
from emulator.demo.engine_report import Restart, RunRecord, write_engine_report
from emulator.demo.engine_run import MAX_PROMPT, EngineDemoSettings, engine_workload
from emulator.engines.client import Completion


def _record(name: str, workload, latency, failed=()) -> RunRecord:
    comps = [Completion(i, i * 0.1, latency(i), 1000, 250 if name == "tuned" else 100,
                        "HTTP 503: x" if i in failed else "") for i in range(workload.frame.height)]
    events = [(3.0, "controller step took 2.0 s (trial_started)"), (3.0, "tuner: trial_started (trial 1)")]
    return RunRecord(name, comps, events, DEFAULT_KNOBS, None, 0.25, {})


PLAN = {"at": 40.0, "horizon": {"horizon_s": 60.0, "basis": "configured"}, "priced": [
    {"knobs": {"router": ("roundrobin", "prefixaware")}, "restart": False, "gain_p95": 0.05, "gain_mean": -0.08,
     "gain_per_hour_s": -120.0, "transition_cost_s": 1.5, "payback_s": None, "verdict": "decline",
     "reason": "mean slower once settled (p95 5.0% faster, mean 8.0% slower, against staying)"}]}


def test_the_verdict_pairs_the_requests_both_passes_served(tmp_path) -> None:
    wl = engine_workload(60.0, 7, 3.0)
    assert wl.frame.height > 100 and wl.frame["input_length"].max() <= MAX_PROMPT
    tuned = _record("tuned", wl, lambda i: 0.08 if i * 0.1 >= 3.0 else 0.10 * (1 + 0.05 * (i % 3)), failed={0})
    held = _record("held", wl, lambda i: 0.10 * (1 + 0.05 * (i % 3)))
    path = write_engine_report(tmp_path, wl, [tuned, held], [Restart("router", 1.0, 1.2, "policy -> cache_aware")],
                               {"engines": "2 x 2"})
    text = path.read_text()
    verdict = text.split("## Verdict: did tuning pay for itself?\n\n", 1)[1].splitlines()[0]
    assert verdict.startswith("Yes: from its first change at 3 s on, tuned served 1.31x faster"), verdict
    assert "x faster" in verdict and "noise floor" in verdict
    whole = next(line for line in text.splitlines() if line.startswith("| **whole run**"))
    assert "| same speed; 1.25x faster |" in whole and whole.endswith("| 0 / 1 / 0 | 0 / 0 |"), whole  # one apply, counted once
    assert f"requests in both passes: {wl.frame.height - 1}" in text and "tuned 1, held 0" in text
    assert "router at 1.0 s: policy -> cache_aware; ready after 1.2 s" in text
    assert "Every move the planner priced" not in text  # no plan, no section
    for png in ("ttft_p95.png", "hit_ratios.png"):
        assert f"]({png})" in text and (tmp_path / png).stat().st_size > 10_000, png
    section = text.split("## Hit ratios: what each counts", 1)[1]
    for name in ("engines' counters", "the agent's cumulative", "the client's", "engines' tier counters",
                 "the agent's per tier"):
        assert f"**{name}**" in section, name
    assert "hit ratios (defined above): engines' counters" in text
    tuned.plans.append(PLAN)
    text = write_engine_report(tmp_path, wl, [tuned, held], [], {"engines": "2 x 2"}).read_text()
    assert "- plan at 40 s: horizon 60 s (configured)" in text
    assert "router prefixaware (hot reload): p95 5.0% faster, mean 8.0% slower over the horizon; once settled " \
           "loses 120 s of TTFT per hour" in text
    assert "**decline**" in text and "+" not in text.split("## What the tuner did")[1].split("## Engine restarts")[0]
    assert tuned.hit_ratio() == pytest.approx(0.25)


def test_the_kubelets_engine_restarts_count_in_the_scorecard_even_before_the_agent_logs_its_trial(tmp_path) -> None:
    wl = engine_workload(60.0, 7, 3.0)
    tuned = _record("tuned", wl, lambda i: 0.10)
    tuned.events = []  # the agent was still waiting for the rollout when the pass ended
    restarts = [Restart("vllm-tuned-0", 20.0, 31.5, "new args"), Restart("vllm-tuned-1", 52.0, float("nan"), "new args"),
                Restart("vllm-held-0", 20.0, 30.0, "new args")]
    text = write_engine_report(tmp_path, wl, [tuned, _record("held", wl, lambda i: 0.10)], restarts, {}).read_text()
    rows = {line.split(" |")[0]: line for line in text.splitlines() if line.startswith("| ")}
    assert rows["| phase 1: shared prompts + RAG"].endswith("| 1 / 0 / 0 | 0 / 0 |"), rows
    assert rows["| phase 2: multi-turn sessions"].endswith("| 1 / 0 / 0 | 0 / 0 |"), rows
    assert rows["| **whole run**"].endswith("| 2 / 0 / 0 | 0 / 0 |"), rows  # the held fleet's restart is not the tuner's
    assert "vllm-tuned-0 at 20.0 s: new args; ready after 31.5 s" in text
    assert "vllm-tuned-1 at 52.0 s: new args; not ready by the end of the pass" in text


def test_nothing_applied_reads_no_change_noise_and_lists_the_plans(tmp_path) -> None:
    wl = engine_workload(30.0, 7, 3.0)
    tuned = _record("tuned", wl, lambda i: 0.10 * (1 + 0.3 * ((i // 20) % 2)))  # slow stretches: noise
    tuned.events = [(12.0, "planner: best move router prefixaware (mean -8.0% on the twin): decline")]
    dry = _record("tuned", wl, lambda i: 0.10)
    dry.events = [(13.0, "tuner: dry_run (trial 2): proposed, not applied; running defaults")]
    dry.plans.append(PLAN)
    text = write_engine_report(tmp_path, wl, [dry, _record("held", wl, lambda i: 0.10)], [], {}).read_text()
    assert "The tuner applied nothing (a dry run: the moves marked apply were proposed, not applied)." in text
    tuned.plans.append(PLAN)
    held = _record("held", wl, lambda i: 0.10)
    text = write_engine_report(tmp_path, wl, [tuned, held], [], {"engines": "2 x 2"}).read_text()
    verdict = text.split("## Verdict: did tuning pay for itself?\n\n", 1)[1]
    assert verdict.startswith("No change, noise: the tuner applied nothing"), verdict[:300]
    head = verdict.split("| phase |", 1)[0]
    assert "The tuner applied nothing. Every move it priced, with its verdict and reason" in head
    assert "router prefixaware (hot reload)" in head and "mean slower once settled" in head
    assert tuned.summary_lines(held)[0].startswith("No change, noise")


def test_settings_refuse_what_cannot_run() -> None:
    with pytest.raises(ValueError, match="--duration: with --engine vllm"):
        EngineDemoSettings(stream_s=5)
    with pytest.raises(ValueError, match="kv_cache_tokens"):
        EngineDemoSettings(kv_cache_tokens=512)
