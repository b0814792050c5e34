"""The demo's window statistics, verdict table and report files, on small hand-built data."""
from __future__ import annotations

import math
from pathlib import Path

from rich.console import Console

from contracts.knobs import DEFAULT_KNOBS
from emulator.cluster.timeline import (
    DemoEvent,
    PhaseVerdict,
    Recorder,
    Served,
    TimelinePoint,
    quantile,
    window_stats,
)
from emulator.demo.console import render_view
from emulator.demo.report import verdict_lines, write_report


def _row(ts: float, prompt: int, gpu: int, cpu: int, l2: int, ttft: float) -> Served:
    return Served(ts, "vllm-0", prompt, gpu, cpu, l2, ttft, phase=0)


def test_window_stats_exact() -> None:
    rows = [_row(0, 1000, 500, 250, 125, 0.1), _row(1, 1000, 0, 0, 0, 0.5), _row(2, 2000, 1000, 0, 500, 0.3)]
    s = window_stats(rows)
    assert s.requests == 3
    assert s.hit_ratio["gpu"] == 1500 / 4000
    assert s.hit_ratio["cpu"] == 250 / 2500
    assert s.hit_ratio["l2"] == 625 / 2250
    assert s.cumulative_hit_ratio == 2375 / 4000
    assert math.isclose(s.ttft_p95_s, 0.48) and s.ttft_p50_s == 0.3
    assert math.isnan(window_stats([]).ttft_p95_s)
    assert quantile([1.0, 2.0, 3.0, 4.0], 0.5) == 2.5


def test_recorder_window_is_sliding() -> None:
    rec = Recorder(window_trace_s=10)
    for ts in range(30):
        rec.add_served(_row(ts, 100, 50, 0, 0, 0.1))
    assert rec.window(29.0).requests == 10


def test_report_files_and_verdict(tmp_path: Path) -> None:
    rec = Recorder()
    for i in range(20):
        rec.add_served(_row(i * 10, 1000, 400, 100, 100, 0.2 + 0.01 * i))
        rec.add_point(TimelinePoint(i, i * 10.0, int(i >= 10), rec.window(i * 10.0), agent_ttft_p95_s=0.25))
    rec.add_event(DemoEvent(5, 50.0, "apply", "chunk_tokens 256->512"))
    rec.add_event(DemoEvent(12, 120.0, "drift", "prefix overlap dropped"))
    rec.add_event(DemoEvent(15, 150.0, "rollback", "trial 3 regressed"))
    rec.set_trials([(0, 0.4, "twin"), (1, 0.3, "complete"), (2, 0.5, "rolled_back")])
    rec.verdicts.append(PhaseVerdict(1, "phase 2 (sessions)", 100, 0.6, 0.3, 0.4, 0.7, "twin replay"))
    path = write_report(tmp_path, rec, title_facts={"seed": "7"}, phase_starts=[0.0, 100.0],
                        final_config=DEFAULT_KNOBS.to_dict(), partial=True, baseline_objective_s=0.45)
    text = path.read_text()
    assert "Partial report" in text and "| phase 2 (sessions) | 100 | 600 ms | 300 ms | 2.00x | 0.400 | 0.700 |" in text
    for png in ("ttft_p95.png", "hit_ratios.png", "optuna_history.png"):
        data = (tmp_path / png).read_bytes()
        assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 10_000
    assert verdict_lines([])[0].startswith("No verdict")
    console = Console(width=120, record=True)
    console.print(render_view(rec, knobs=DEFAULT_KNOBS, status="tuning", wall_s=10, duration_s=60,
                              agent_url="http://127.0.0.1:9400/metrics"))
    shown = console.export_text()
    assert "chunk_tokens" in shown and "rolled back" not in shown and "trial 3 regressed" in shown
