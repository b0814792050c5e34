"""The real-engine demo's verdict from recorded passes (no engine): pairing, the bootstrap ratio,
the scorecard in report.md, the demo-scale workload, and the settings' one-line errors."""
from __future__ import annotations

import pytest

from contracts.knobs import DEFAULT_KNOBS
from emulator.demo.engine_report import RunRecord, tuned_vs_held, write_engine_report
from emulator.demo.engine_run import MAX_PROMPT, EngineDemoSettings, engine_workload
from emulator.engines.client import Completion
from emulator.engines.process_actuator import Restart


def _record(name: str, workload, latency, failed=()) -> RunRecord:
    comps = [Completion(i, i * 0.1, latency(i), 1000, 250 if name == "tuned" else 100,
                        "HTTP 503: x" if i in failed else "") for i in range(workload.frame.height)]
    events = [(3.0, "controller step took 2.0 s (trial_started)"), (3.0, "tuner: trial_started (trial 1)")]
    return RunRecord(name, comps, events, DEFAULT_KNOBS, None, 0.25, {})


def test_the_verdict_pairs_the_requests_both_passes_served(tmp_path) -> None:
    wl = engine_workload(30.0, 7, 3.0)
    assert wl.frame.height > 20 and wl.frame["input_length"].max() <= MAX_PROMPT
    tuned = _record("tuned", wl, lambda i: 0.08, failed={0})
    held = _record("held", wl, lambda i: 0.10)
    path = write_engine_report(tmp_path, wl, [tuned, held], [Restart("router", 1.0, 1.2, "policy -> cache_aware")],
                               {"engines": "2 x 2"})
    text = path.read_text()
    assert "| **whole run** |" in text and "1.25x / 1.25x" in text  # p95 and mean, held / tuned
    whole = next(line for line in text.splitlines() if line.startswith("| **whole run**"))
    assert whole.endswith("| 0 | 1 | 0 | 0 / 0 |")  # one apply (the trial), counted once
    assert f"requests in both passes: {wl.frame.height - 1}" in text and "tuned 1, held 0" in text
    assert "router at 1.0 s (monotonic): policy -> cache_aware, healthy after 1.2 s" in text
    assert "Every move the planner priced" not in text  # no plan, no section
    tuned.plans.append({"at": 40.0, "horizon": {"horizon_s": 60.0, "basis": "configured"}, "priced": [
        {"knobs": {"router": ("roundrobin", "prefixaware")}, "restart": False, "gain_p95": 0.05, "gain_mean": 0.08,
         "gain_per_hour_s": 120.0, "transition_cost_s": 1.5, "payback_s": 45.0, "verdict": "apply", "reason": ""}]})
    text = write_engine_report(tmp_path, wl, [tuned, held], [], {"engines": "2 x 2"}).read_text()
    assert "- plan at 40 s: horizon 60 s (configured)" in text
    assert "router prefixaware (hot reload): p95 +5.0%, mean +8.0% over the horizon" in text and "**apply**" in text
    line = tuned.summary_lines(held)[0]
    assert "held/tuned = 1.25x" in line and "not worse than held" in line
    assert tuned.hit_ratio() == pytest.approx(0.25)


def test_bootstrap_interval_brackets_the_ratio_of_means() -> None:
    tuned = [0.1, 0.2, 0.3, 0.4] * 25
    held = [0.12, 0.2, 0.36, 0.5] * 25
    ratio, lo, hi = tuned_vs_held(tuned, held)
    assert ratio == pytest.approx(sum(held) / sum(tuned)) and lo < ratio < hi


def test_settings_refuse_what_cannot_run() -> None:
    with pytest.raises(ValueError, match="--duration: with --engine vllm"):
        EngineDemoSettings(stream_s=5)
    with pytest.raises(ValueError, match="kv_cache_tokens"):
        EngineDemoSettings(kv_cache_tokens=512)
