"""The Tuner dashboard: what the autotuner tried, what it applied, and why."""
from __future__ import annotations

import dataclasses

from contracts.knobs import Knobs
from dashboards.grafana import Annotation, Dashboard, Panel, Query, Variable
from dashboards.promql import eq, selector
from dashboards.settings import BuildSettings

KNOB_COLUMNS: tuple[str, ...] = tuple(f.name for f in dataclasses.fields(Knobs))

UID = "tierpilot-tuner"
NS = ("namespace",)

VARIABLES = (Variable("namespace", "namespace", "tierpilot_target_up"),)


def _events(metric: str, *matchers: str, by: str = "") -> str:
    """Steps at which a counter moved: one annotation per change, at the step it happened."""
    grouping = f" by ({by})" if by else ""
    return f"sum{grouping} (increase({metric}{selector(*matchers, scope=NS)}[2m])) > 0"


ANNOTATIONS = (
    Annotation("Applies", _events("tierpilot_actuations_total", eq("result", "applied")), "green",
               "Configuration applied", "The tuner applied a new configuration."),
    Annotation("Rollbacks", _events("tierpilot_actuations_total", eq("result", "rolled_back")), "red",
               "Rolled back", "A trial regressed TTFT and was rolled back to the last good configuration."),
    Annotation("Drift", _events("tierpilot_drift_events_total", by="signal"), "purple",
               "Workload drift ({{signal}})",
               "The drift detector saw {{signal}} shift; a new tuning phase starts."),
)


def _config_table(title: str, metric: str, description: str) -> Panel:
    return Panel(
        title, "table", "none",
        (Query(f"{metric}{selector(scope=NS)}", instant=True, format="table"),),
        description, width=24, height=5, columns=("workload", *KNOB_COLUMNS),
    )


def _capacity_panel(title: str, tier: str, scope: str, what: str) -> Panel:
    expr = f"max by (capacity_gib) (tierpilot_tier_capacity_hit_ratio{selector(eq('tier', tier), scope=NS)})"
    if tier == "cpu":  # without a tuner, the agent's own curve from the KV events' GPU stores
        expr += f" or max by (capacity_gib) (tierpilot_kv_cpu_capacity_hit_ratio{selector(scope=NS)})"
    return Panel(
        title, "bargauge", "percentunit",
        (Query(expr, "{{capacity_gib}} GiB", instant=True),),
        f"Hit ratio at each size (GiB {scope}) of {what}, over the whole observed history: one bar per "
        "point of the tier's capacity curve (tierpilot_tier_capacity_hit_ratio, LRU; for the CPU without a "
        "tuner, tierpilot_kv_cpu_capacity_hit_ratio from the KV events). Where the bars stop "
        "rising, more memory buys nothing; the size in force is in the Current configuration table.",
        width=12, height=8, min=0, max=1, decimals=3, no_value="no capacity curve yet",
    )


def _status_stats() -> tuple[Panel, ...]:
    """Top row: best objective, completed trials, tuning phase, dry run / trial in flight."""
    s = selector(scope=NS)
    return (
        Panel(
            "Best objective so far", "stat", "s",
            (Query(f"min(tierpilot_tuner_best_objective_seconds{s})"),),
            "Lowest objective (seconds: TTFT p95 plus the fleet CPU memory at tuner.memory_ms_per_gib, "
            "2 ms per GiB by default) of any completed trial in the current "
            "tuning phase. Lower is better.",
            width=6, height=5,
        ),
        Panel(
            "Trials (complete)", "stat", "short",
            (Query(f"sum(tierpilot_tuner_trials_total{selector(eq('state', 'complete'), scope=NS)})"),),
            "Completed trials since the agent started.",
            width=6, height=5, decimals=0,
        ),
        Panel(
            "Tuning phase", "stat", "short",
            (Query(f"max(tierpilot_tuner_phase{s})"),),
            "Tuning phase number; a workload drift starts a new phase (warm-started from the twin).",
            width=6, height=5, decimals=0,
        ),
        Panel(
            "Mode", "stat", "short",
            (Query(f"max(tierpilot_dry_run{s})", "dry run"),
             Query(f"max(tierpilot_tuner_trial_in_flight{s})", "trial in flight")),
            "1 = dry run (proposes, applies nothing); trial in flight = a live trial is applied and "
            "being measured.",
            width=6, height=5, decimals=0,
        ),
    )


def _objective_row() -> tuple[Panel, ...]:
    """Best objective of the current phase over time (full width)."""
    s = selector(scope=NS)
    return (
        Panel(
            "Objective over time", "timeseries", "s",
            (Query(f"min by (workload) (tierpilot_tuner_best_objective_seconds{s})", "best so far ({{workload}})"),),
            "Best objective of the current phase over time: each step down is a trial that beat all "
            "before it; a step up is a new phase after drift. Lower is better. Applies, rollbacks and "
            "drift are marked as annotations.",
            width=24, draw_points=True, min=0,
        ),
    )


def _trial_and_actuation_row() -> tuple[Panel, ...]:
    """Trials by state, and configuration changes per hour."""
    s = selector(scope=NS)
    return (
        Panel(
            "Trials by state", "timeseries", "short",
            (Query(f"sum by (state) (tierpilot_tuner_trials_total{s})", "{{state}}"),),
            "Finished trials by state since the agent started (complete, pruned, failed...).",
            min=0, decimals=0,
        ),
        Panel(
            "Actuations per hour", "timeseries", "short",
            (Query(f"sum by (result) (increase(tierpilot_actuations_total{s}[1h]))", "{{result}}"),
             Query(f"sum(increase(tierpilot_reapplied_total{s}[1h]))", "re-applied after revert")),
            "Configuration changes per hour by result, and patches re-applied after an operator "
            "reconcile undid them.",
            min=0,
        ),
    )


def _guardrail_and_drift_row() -> tuple[Panel, ...]:
    """Changes held back by guardrails, and workload drift events, per hour."""
    s = selector(scope=NS)
    return (
        Panel(
            "Guardrail blocks per hour", "timeseries", "short",
            (Query(f"sum by (reason) (increase(tierpilot_tuner_guardrail_blocks_total{s}[1h]))", "{{reason}}"),),
            "Changes held back by a guardrail (one in flight, cooldown, hourly cap, invalid candidate).",
            min=0,
        ),
        Panel(
            "Drift events per hour", "timeseries", "short",
            (Query(f"sum by (signal) (increase(tierpilot_drift_events_total{s}[1h]))", "{{signal}}"),),
            "Workload change points by the signal that moved.",
            min=0,
        ),
    )


def _shadow_row() -> tuple[Panel, ...]:
    """Shadow-mode plans and proposals, and the shadow tuner's predictions against measurements."""
    s = selector(scope=NS)
    return (
        Panel(
            "Shadow plans and proposals per hour", "timeseries", "short",
            (Query(f"sum by (would) (increase(tierpilot_tuner_shadow_moves_total{s}[1h]))", "shadow: would {{would}}"),
             Query(f"sum by (kind) (increase(tierpilot_tuner_proposals_total{s}[1h]))", "proposal ({{kind}})")),
            "Shadow mode (tuner.mode: shadow): the moves each plan priced, by what a live tuner with tuner.apply "
            "would have done (apply; propose: outside tuner.apply, a restart under hot; decline). Live: moves held "
            "back as proposals (restart: restarts the engines or the L2 master). Apply one with "
            "`tierpilot k8s apply-proposal`.",
            min=0,
        ),
        Panel(
            "Shadow: predicted against measured", "timeseries", "percentunit",
            (Query(f"max(tierpilot_tuner_shadow_measured_gain_ratio{s})", "measured p95 gain"),
             Query(f"max(tierpilot_tuner_shadow_prediction_error_ratio{s})", "measured - predicted"),
             Query(f"max(tierpilot_tuner_proposal_pending{s})", "proposals pending")),
            "Each time the fleet's configuration changed (by anyone), the shadow tuner compared the TTFT p95 "
            "before and after with the gain it had predicted for that change: near 0 = its predictions hold. "
            "Proposals pending: moves the live tuner keeps for a person.",
            draw_points=True,
        ),
    )


def _capacity_row() -> tuple[Panel, ...]:
    """What-if capacity curves of the CPU buffer and the L2 pool."""
    return (
        _capacity_panel("What if the CPU buffer were N GiB", "cpu", "per pod",
                        "LMCache's CPU buffer: the share of the tokens that missed the GPU it would serve"),
        _capacity_panel("What if the L2 pool were N GiB", "l2", "for the fleet",
                        "the shared L2 pool: the share of the tokens that missed GPU and CPU it would serve"),
    )


def _configuration_tables() -> tuple[Panel, ...]:
    """The configuration in force and the one a rollback restores."""
    return (
        _config_table("Current configuration", "tierpilot_config_info",
                      "The knob values in force now (labels of tierpilot_config_info)."),
        _config_table("Last good configuration", "tierpilot_tuner_last_good_info",
                      "The configuration a rollback restores (labels of tierpilot_tuner_last_good_info)."),
    )


def panels(settings: BuildSettings) -> tuple[Panel, ...]:
    return (
        *_status_stats(),
        *_objective_row(),
        *_trial_and_actuation_row(),
        *_guardrail_and_drift_row(),
        *_shadow_row(),
        *_capacity_row(),
        *_configuration_tables(),
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
