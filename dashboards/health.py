"""The Agent health dashboard: is tierpilot itself seeing the fleet, and who is leading."""
from __future__ import annotations

from dashboards.grafana import Dashboard, Panel, Query, Threshold, Variable
from dashboards.promql import eq, selector
from dashboards.settings import BuildSettings

UID = "tierpilot-agent-health"
RATE = "$__rate_interval"
NS = ("namespace",)

VARIABLES = (
    Variable("namespace", "namespace", "tierpilot_target_up"),
    Variable("role", "role", "tierpilot_target_up", 'namespace=~"$namespace"'),
)
SCOPE = ("namespace", "role")


def _status_stats(settings: BuildSettings) -> tuple[Panel, ...]:
    """Top row: agent scraped, leader count, share of targets up, snapshot age."""
    t = selector(scope=SCOPE)
    ns = selector(scope=NS)
    agent = selector(eq("job", settings.alerts.agent_job), scope=NS)
    return (
        Panel(
            "Agent scraped by Prometheus", "stat", "none",
            (Query(f"min(up{agent})"),),
            "1 when Prometheus can scrape every agent replica (the `up` series of the agent's job).",
            width=6, height=5, thresholds=(Threshold("red"), Threshold("green", 1)),
        ),
        Panel(
            "Leader", "stat", "none",
            (Query(f"sum(tierpilot_leader{ns})"),),
            "Agent replicas holding the Lease. Exactly one should; 0 means nobody actuates.",
            width=6, height=5,
            thresholds=(Threshold("red"), Threshold("green", 1), Threshold("red", 2)),
        ),
        Panel(
            "Targets up", "stat", "percentunit",
            (Query(f"sum(tierpilot_target_up{t}) / count(tierpilot_target_up{t})"),),
            "Share of discovered scrape targets whose last scrape succeeded.",
            width=6, height=5, min=0, max=1,
            thresholds=(Threshold("red"), Threshold("orange", 0.9), Threshold("green", 1)),
        ),
        Panel(
            "Seconds since last scrape cycle", "stat", "s",
            (Query(f"time() - max(tierpilot_snapshot_timestamp_seconds{ns})"),),
            "Age of the snapshot the agent serves (its newest completed scrape cycle). Above a few "
            "scrape intervals the agent is stale.",
            width=6, height=5,
            thresholds=(Threshold("green"), Threshold("red", settings.alerts.agent_stale_seconds)),
        ),
    )


def _scrape_rows() -> tuple[Panel, ...]:
    """Targets up by role, scrape duration, scrape errors and scrape cycle duration."""
    t = selector(scope=SCOPE)
    ns = selector(scope=NS)
    return (
        Panel(
            "Targets up by role", "timeseries", "short",
            (Query(f"sum by (role) (tierpilot_target_up{t})", "{{role}} up"),
             Query(f"count by (role) (tierpilot_target_up{t})", "{{role}} discovered")),
            "Targets whose last scrape succeeded, against those discovered, per role.",
            min=0, decimals=0,
        ),
        Panel(
            "Scrape duration", "timeseries", "s",
            (Query(f"max by (role) (tierpilot_scrape_duration_seconds{t})", "{{role}} (slowest target)"),),
            "Duration of the last scrape of each target, slowest per role.",
            min=0,
        ),
        Panel(
            "Scrape errors by reason", "timeseries", "suffix: /s",
            (Query(f"sum by (reason) (rate(tierpilot_scrape_errors_total{t}[{RATE}]))", "{{reason}}"),),
            "Failed scrapes per second by reason (timeout, http status, body too large, parse error...).",
            min=0,
        ),
        Panel(
            "Scrape cycle duration", "timeseries", "s",
            (Query(f"max(tierpilot_scrape_cycle_duration_seconds{ns})", "full cycle"),),
            "Wall time of the agent's last full cycle: fetch every target, parse, normalise, store.",
            min=0,
        ),
    )


def _kv_stream_and_leader_row() -> tuple[Panel, ...]:
    """KV event streams per pod, and which replica held the Lease."""
    ns = selector(scope=NS)
    return (
        Panel(
            "KV event streams", "timeseries", "suffix: /s",
            (Query(f"sum by (pod) (rate(tierpilot_kv_events_total{ns}[{RATE}]))", "{{pod}} events"),
             Query(f"sum by (pod) (rate(tierpilot_kv_sequence_gaps_total{ns}[{RATE}]))", "{{pod}} gaps"),
             Query(f"sum by (pod) (rate(tierpilot_kv_restarts_total{ns}[{RATE}]))", "{{pod}} restarts")),
            "vLLM KV events applied per second per pod, with sequence gaps and engine restarts seen "
            "on the streams.",
            min=0,
        ),
        Panel(
            "Leader over time", "timeseries", "none",
            (Query(f"max by (identity) (tierpilot_leader{ns})", "{{identity}}"),),
            "Which replica held the Lease. A flapping leader means lease renewals are failing.",
            min=0, max=1, decimals=0,
        ),
    )


def _targets_table() -> tuple[Panel, ...]:
    """Every discovered target and whether its last scrape succeeded."""
    t = selector(scope=SCOPE)
    return (
        Panel(
            "Targets", "table", "none",
            (Query(f"tierpilot_target_up{t}", instant=True, format="table"),),
            "Every discovered target and whether its last scrape succeeded (1) or failed (0).",
            width=24, height=8,
            columns=("target", "role", "Value"),
            column_names=(("Value", "up"),),
        ),
    )


def panels(settings: BuildSettings) -> tuple[Panel, ...]:
    return (
        *_status_stats(settings),
        *_scrape_rows(),
        *_kv_stream_and_leader_row(),
        *_targets_table(),
    )


def build(settings: BuildSettings) -> Dashboard:
    return Dashboard(
        uid=UID,
        title="tierpilot / Agent health",
        description="Scrape targets, scrape duration and errors, staleness and leader election of "
                    "the tierpilot agent itself.",
        panels=panels(settings),
        variables=VARIABLES,
        time_from="now-6h",
        links=(("tierpilot dashboards", "tierpilot"),),
    )
