"""The emulated demo's outcome (`DemoResult`), assembled once the run has stopped: the per-phase
verdicts, the headline scorecard (tuned vs held vs hindsight), the agent's accuracy, the capacity
curves and report.md (`emulator.demo.report.write_report`)."""
from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from agent.settings.tuner import TunerSection
from contracts.knobs import Knobs
from emulator.cluster.paced_clock import PacedClock
from emulator.cluster.timeline import DemoEvent, PhaseVerdict, Recorder
from emulator.demo.accuracy import AccuracyMeter, report_lines
from emulator.demo.deployment import TUNER_FILE, overrides_lines
from emulator.demo.report import prediction_line, write_report
from emulator.demo.scorecard import PLAN_NOTE, action_counts, demo_scorecard, plan_lines
from emulator.demo.settings import DemoSettings
from emulator.demo.workload import DemoWorkload, phase_verdicts
from simulator.capacity.curves import TierCurve
from simulator.cluster import ClusterSpec as TwinClusterSpec
from tuners.payoff import PhaseScore, answer_line, scorecard_lines

log = logging.getLogger("tierpilot.demo")


@dataclasses.dataclass
class DemoResult:
    report_path: Path
    verdicts: list[PhaseVerdict]
    events: list[DemoEvent]
    interrupted: bool
    final_knobs: Knobs
    agent_url: str
    requests_served: int
    scores: list[PhaseScore] = dataclasses.field(default_factory=list)  # the headline: tuned vs held vs hindsight
    prediction_errors: list[float] = dataclasses.field(default_factory=list)  # twin p95 error per live window

    def count(self, kind: str) -> int:
        return sum(1 for e in self.events if e.kind == kind)


def demo_outcome(s: DemoSettings, *, scale: float, tuner: TunerSection, recorder: Recorder, workload: DemoWorkload,
                 twin_cluster: TwinClusterSpec, tuned: list[Knobs], interrupted: bool,
                 prediction_errors: Sequence[tuple[float, float]], planner: Any, accuracy: AccuracyMeter,
                 paced: PacedClock, served: int, agent_url: str,
                 capacity_curves: Callable[[], Mapping[str, TierCurve] | None]) -> DemoResult:
    """Judge the stopped run and write its report. `tuned`: the configuration tierpilot stood
    behind at the end of each phase (the last one: at the end of the run); `capacity_curves`
    republishes the curves over everything served (None before traffic)."""
    final = tuned[-1]
    reached = max((r.phase for r in recorder.served()), default=-1)
    verdicts = phase_verdicts(workload, twin_cluster, tuned[: reached + 1])
    recorder.verdicts.extend(verdicts)
    actions = action_counts(workload.phase_starts_s, list(recorder.events), list(recorder.disturbances), s.pods)
    errors = [e for _t, e in prediction_errors]
    scores: list[PhaseScore] = []
    headline = ["Interrupted: no verdict (it needs the whole run)."]
    if not interrupted:
        scores, method = demo_scorecard(workload, twin_cluster, recorder.served(), tuned[: reached + 1], actions)
        headline = [answer_line(scores), "", *scorecard_lines(scores), "", f"Method: {method}"]
    headline += ["", prediction_line(errors)]
    plans = list(planner.history) if planner is not None else []
    if plans:
        headline += ["", "### Every move the planner priced", "", PLAN_NOTE, "", *plan_lines(plans)]
    default_p95 = next((v.default_ttft_p95_s for v in verdicts if v.phase == 1), None)
    facts = {"pods": str(s.pods), "seed": str(s.seed), "duration": f"{s.duration_s:g} s wall",
             "time scale": f"{scale:g} cluster-seconds per second",
             "workload": f"{workload.frame.height} requests; " + "; ".join(workload.labels),
             "requests served": str(served), "agent export": agent_url,
             "dry run": str(s.dry_run),
             "paced clock": (f"the cluster waited {paced.held_back_s:.0f} wall s in all for its control loop "
                             "and its plans (a busy machine slows the run rather than skipping control steps)"),
             "tuner.apply": f"{tuner.apply} (restart-requiring changes allowed: the demo measures "
                            "restart scenarios)",
             "tuner settings": f"the chart's defaults plus {TUNER_FILE.name}: " + "; ".join(overrides_lines())}
    margin = (2 * 0.5 + s.pods * s.restart_downtime_s) * scale  # scrapes + the rollout
    sections = report_lines(accuracy.samples, list(recorder.disturbances), window_s=tuner.drift.window_s,
                            margin_s=margin)
    try:
        curves = capacity_curves()
    except Exception:  # the report goes out without its curve rather than not at all
        log.exception("capacity curves failed")
        curves = None
    path = write_report(s.report_dir, recorder, title_facts=facts, phase_starts=workload.phase_starts_s,
                        final_config=final.to_dict(), partial=interrupted, baseline_objective_s=default_p95,
                        sections=sections, headline=headline, capacity_curves=curves,
                        host_memory_gib=twin_cluster.hardware.host_memory_gib)
    return DemoResult(path, verdicts, list(recorder.events), interrupted, final, agent_url, served, scores, errors)
