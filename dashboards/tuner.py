"""The Tuner dashboard: what the autotuner tried, what it applied, and why."""
from __future__ import annotations

import dataclasses

from dashboards.grafana import Annotation, Dashboard, Panel, Query, Variable
from dashboards.promql import eq, selector
from dashboards.settings import BuildSettings
from simulator.knobs import Knobs

KNOB_COLUMNS: tuple[str, ...] = tuple(f.name for f in dataclasses.fields(Knobs))

UID = "tierpilot-tuner"
NS = ("namespace",)

VARIABLES = (Variable("namespace", "namespace", "tierpilot_target_up"),)


def _events(metric: str, *matchers: str) -> str:
    """Steps at which a counter moved: one annotation per change, at the step it happened."""
    return f"sum(increase({metric}{selector(*matchers, scope=NS)}[2m])) > 0"


ANNOTATIONS = (
    Annotation("Applies", _events("tierpilot_actuations_total", eq("result", "applied")), "green",
               "Configuration applied", "The tuner applied a new configuration."),
    Annotation("Rollbacks", _events("tierpilot_actuations_total", eq("result", "rolled_back")), "red",
               "Rolled back", "A trial regressed TTFT and was rolled back to the last good configuration."),
    Annotation("Drift", _events("tierpilot_drift_events_total"), "purple",
               "Workload drift", "The drift detector saw the workload shift; a new tuning phase starts."),
)


def panels(settings: BuildSettings) -> tuple[Panel, ...]:
    s = selector(scope=NS)
    return (
        Panel(
            "Best objective so far", "stat", "s",
            (Query(f"min(tierpilot_tuner_best_objective{s})"),),
            "Lowest objective (TTFT p95 by default, seconds) of any completed trial in the study.",
            width=6, height=5,
        ),
        Panel(
            "Trials", "stat", "short",
            (Query(f"sum by (state) (tierpilot_tuner_trials_total{s})", "{{state}}"),),
            "Trials of the current study by state.",
            width=6, height=5,
        ),
        Panel(
            "Applies and rollbacks (24 h)", "stat", "short",
            (Query(f"sum by (result) (increase(tierpilot_actuations_total{s}[24h]))", "{{result}}"),),
            "Configuration changes sent to the cluster in the last day, by outcome.",
            width=6, height=5, decimals=0,
        ),
        Panel(
            "Drift events (24 h)", "stat", "short",
            (Query(f"sum(increase(tierpilot_drift_events_total{s}[24h]))"),),
            "Workload shifts the drift detector reported in the last day.",
            width=6, height=5, decimals=0,
        ),
        Panel(
            "Trial objective over time", "timeseries", "s",
            (Query(f"max(tierpilot_tuner_trial_objective{s})", "trial objective"),
             Query(f"min(tierpilot_tuner_best_objective{s})", "best so far")),
            "Objective of the latest completed trial (points) against the best objective so far. "
            "Lower is better. Applies, rollbacks and drift are marked as annotations.",
            width=24, draw_points=True, min=0,
        ),
        Panel(
            "Trials over time", "timeseries", "short",
            (Query(f"sum by (state) (tierpilot_tuner_trials_total{s})", "{{state}}"),),
            "Cumulative trials by state (complete, pruned, failed, rolled back...).",
            min=0,
        ),
        Panel(
            "Actuations per hour", "timeseries", "short",
            (Query(f"sum by (result) (increase(tierpilot_actuations_total{s}[1h]))", "{{result}}"),
             Query(f"sum(increase(tierpilot_reapplied_total{s}[1h]))", "re-applied after revert")),
            "Changes per hour by outcome, and patches re-applied after an operator reconcile undid them.",
            min=0,
        ),
        Panel(
            "Current configuration", "table", "none",
            (Query(f"tierpilot_config_info{s}", instant=True, format="table"),),
            "The knob values in force now (labels of tierpilot_config_info).",
            width=24, height=6,
            columns=KNOB_COLUMNS,
        ),
    )


def build(settings: BuildSettings) -> Dashboard:
    return Dashboard(
        uid=UID,
        title="tierpilot / Tuner",
        description="Autotuner trials and objective, the configuration in force, and every apply, "
                    "rollback and workload drift as annotations.",
        panels=panels(settings),
        variables=VARIABLES,
        annotations=ANNOTATIONS,
        time_from="now-24h",
        links=(("tierpilot dashboards", "tierpilot"),),
    )
