"""tierpilot's alert rules, declared once. `tierpilot dashboards build` renders them to the plain
rules file `dashboards/alerts/tierpilot.rules.yaml` and to the PrometheusRule in `deploy/`.

Every alert's `runbook` is an anchor of `docs/runbooks.md` (a test checks that it exists).
"""
from __future__ import annotations

from dashboards.rulefile import Alert, Group, Record
from dashboards.settings import AlertSettings, BuildSettings, SloSettings

# (long window, short window, burn-rate factor) pairs of the multi-window, multi-burn-rate recipe
# (Google SRE workbook, ch. 5): a page spends 2% of a 30-day budget in 1 h or 5% in 6 h; a ticket
# spends 10% in 3 days... scaled to the configured period.
FAST_BURN: tuple[tuple[str, str, float], ...] = (("1h", "5m", 14.4), ("6h", "30m", 6.0))
SLOW_BURN: tuple[tuple[str, str, float], ...] = (("1d", "2h", 3.0), ("3d", "6h", 1.0))
WINDOWS: tuple[str, ...] = ("5m", "30m", "1h", "2h", "6h", "1d", "3d")

SLO_ERROR = "namespace_model:tierpilot_ttft_slo_errors:ratio"
TOTAL_HIT = "namespace_model:tierpilot_kv_total_hit_ratio:avg"


def _budget_window(name: str) -> str:
    return f"{SLO_ERROR}_avg{name}"


def ttft_quantile_expr(quantile: str, by: str = "namespace, model", window: str = "5m") -> str:
    """The TTFT quantile of every pod of a model together: histogram_quantile over the rates of the
    per-pod buckets (vLLM's own bounds), so it aggregates across pods and over time."""
    return (f"histogram_quantile(\n    {quantile},\n    sum by ({by}, le) "
            f"(rate(tierpilot_ttft_seconds_bucket[{window}]))\n  )")


def slo_records(slo: SloSettings) -> tuple[Record, ...]:
    # A 5-minute slice is bad when the model's quantile over the slice's requests is above the
    # target; a slice without requests gives NaN, and NaN > bool x is 0: idle is not bad.
    now = Record(SLO_ERROR, f"(\n  {ttft_quantile_expr(slo.ttft_quantile)}\n  > bool {slo.ttft_seconds:g}\n)")
    return (now, *(Record(_budget_window(w), f"avg_over_time({SLO_ERROR}[{w}])") for w in WINDOWS))


def _burn_expr(pairs: tuple[tuple[str, str, float], ...], budget: float) -> str:
    clauses = []
    for long, short, factor in pairs:
        threshold = round(factor * budget, 6)
        clauses.append(f"(\n  {_budget_window(long)} > {threshold:g}\n  and\n"
                       f"  {_budget_window(short)} > {threshold:g}\n)")
    return "\nor\n".join(clauses)


def slo_alerts(slo: SloSettings) -> tuple[Alert, ...]:
    target = f"p{float(slo.ttft_quantile) * 100:g} TTFT <= {slo.ttft_seconds:g}s"
    budget = slo.error_budget
    return (
        Alert(
            "TierpilotTTFTBudgetBurnFast", _burn_expr(FAST_BURN, budget), "critical",
            "TTFT SLO error budget of {{ $labels.model }} is burning fast",
            f"Model {{{{ $labels.model }}}} in {{{{ $labels.namespace }}}} missed its SLO ({target} in "
            f"{slo.objective:.2%} of time slices) in {{{{ $value | humanizePercentage }}}} of 5-minute slices "
            f"over the last hour or six: {FAST_BURN[-1][2]:g}x or more the sustainable burn rate, so the "
            f"{slo.period_days}-day error budget lasts days, not weeks.",
            "tierpilotttftbudgetburnfast", for_="2m",
        ),
        Alert(
            "TierpilotTTFTBudgetBurnSlow", _burn_expr(SLOW_BURN, budget), "warning",
            "TTFT SLO error budget of {{ $labels.model }} is burning",
            f"Model {{{{ $labels.model }}}} in {{{{ $labels.namespace }}}} missed its SLO ({target} in "
            f"{slo.objective:.2%} of time slices) in {{{{ $value | humanizePercentage }}}} of 5-minute slices "
            f"over the last day or three: at this rate the {slo.period_days}-day error budget runs out "
            "before the period ends.",
            "tierpilotttftbudgetburnslow", for_="15m",
        ),
    )


def cache_records() -> tuple[Record, ...]:
    # The cumulative hit ratio grows down the tiers, so its max over tiers is the pod's total hit
    # ratio whatever tiers the pod has.
    return (Record(TOTAL_HIT, "avg by (namespace, model) (\n  max by (namespace, model, pod) "
                              "(tierpilot_kv_cumulative_hit_ratio)\n)"),)


def cache_alerts(a: AlertSettings) -> tuple[Alert, ...]:
    baseline = f"avg_over_time({TOTAL_HIT}[1h] offset 10m)"
    # Evictions are counted per unit (LMCache chunks, Curvine files): each unit is compared with its
    # own baseline and tagged with a `unit` label, never added to the other. The baseline is the
    # mean 5-minute rate over 6 hours ending an hour ago: a storm does not dilute its own baseline
    # while it lasts, and a young series is not compared with a 6-hour rate() that its few samples
    # would make near zero.
    def storm(unit: str) -> str:
        now = f"sum by (namespace, pod, tier) (rate(tierpilot_kv_evicted_{unit}_total[5m]))"
        before = f"avg_over_time(\n      {now}[6h:5m] offset 1h\n    )"
        return (f'label_replace(\n  (\n    {now}\n    > {a.eviction_storm_factor:g} * {before}\n  )\n'
                f'  and\n  {now} > {a.eviction_storm_min_per_second:g},\n  "unit", "{unit}", "", ""\n)')

    def l2(op: str, limit: float) -> str:
        return (f'histogram_quantile(\n  {a.l2_latency_quantile},\n  sum by (namespace, pod, op, source, le) '
                f'(rate(tierpilot_l2_io_latency_seconds_bucket{{op="{op}"}}[5m]))\n) > {limit:g}')

    # vLLM native tiering has no per-read histogram: the mean time per chunk its fs tier read
    native = (f'label_replace(\n  max by (namespace, pod, source) (tierpilot_kv_read_latency_seconds{{tier="l2"}}),\n'
              f'  "op", "read", "", ""\n) > {a.l2_read_latency_seconds:g}')
    q = a.l2_latency_quantile
    return (
        Alert(
            "TierpilotHitRatioCollapse",
            f"avg_over_time({TOTAL_HIT}[10m])\n  < {a.hit_ratio_drop_fraction:g} * {baseline}\n"
            f"and\n{baseline} > {a.hit_ratio_min_baseline:g}",
            "warning",
            "KV-cache hit ratio of {{ $labels.model }} collapsed",
            "The total (cumulative) KV-cache hit ratio of model {{ $labels.model }} in "
            "{{ $labels.namespace }} fell to {{ $value | humanizePercentage }} over the last 10 minutes, "
            f"below {a.hit_ratio_drop_fraction:.0%} of its own average over the hour before.",
            "tierpilothitratiocollapse", for_="10m",
        ),
        Alert(
            "TierpilotL2LatencyHigh",
            f"{l2('read', a.l2_read_latency_seconds)}\nor\n{l2('write', a.l2_write_latency_seconds)}\nor\n{native}",
            "warning",
            "L2 {{ $labels.op }} latency is high on {{ $labels.pod }}",
            f"The p{float(q) * 100:g} L2 (shared NVMe pool) {{{{ $labels.op }}}} latency on "
            "{{ $labels.pod }} (source {{ $labels.source }}; vllm_tiering: the mean per chunk) is "
            "{{ $value | humanizeDuration }} (limits: read "
            f"{a.l2_read_latency_seconds:g}s, write {a.l2_write_latency_seconds:g}s). Slow L2 reads can "
            "make a cache hit slower than recomputing the prefill.",
            "tierpilotl2latencyhigh", for_="10m",
        ),
        Alert(
            "TierpilotEvictionStorm",
            f"{storm('chunks')}\nor\n{storm('files')}",
            "warning",
            "Eviction storm in the {{ $labels.tier }} tier of {{ $labels.pod }}",
            "The {{ $labels.tier }} tier of {{ $labels.pod }} evicts {{ $value | humanize }} {{ $labels.unit }}/s, "
            f"more than {a.eviction_storm_factor:g}x its rate over the 6 hours before the last hour: the tier is "
            "thrashing and cached prefixes are evicted before they are reused.",
            "tierpilotevictionstorm", for_="10m",
        ),
    )


def agent_alerts(a: AlertSettings) -> tuple[Alert, ...]:
    job = f'job="{a.agent_job}"'
    return (
        Alert(
            "TierpilotScrapeTargetsDown",
            "count by (namespace, role) (tierpilot_target_up == 0) > 0",
            "warning",
            "{{ $value }} tierpilot {{ $labels.role }} target(s) down",
            "The agent in {{ $labels.namespace }} cannot scrape {{ $value }} of its {{ $labels.role }} "
            "targets. Their tier metrics are missing, and the tuner measures on partial data.",
            "tierpilotscrapetargetsdown", for_="5m",
        ),
        Alert(
            "TierpilotTunerRollbackStorm",
            'sum by (namespace) (increase(tierpilot_actuations_total{result="rolled_back"}[1h]))\n'
            f"  >= {a.rollback_storm_count}",
            "warning",
            "tierpilot rolled back {{ $value | humanize }} configurations in an hour",
            "The tuner in {{ $labels.namespace }} rolled back {{ $value | humanize }} trials within one "
            "hour. Each rollback restarts pods and costs cache warmth; the tuner is probing a space "
            "that keeps regressing, or its measurements are too noisy to judge.",
            "tierpilottunerrollbackstorm", for_="0m",
        ),
        Alert(
            "TierpilotAgentDown",
            f"up{{{job}}} == 0\nor\nabsent(up{{{job}}})",
            "critical",
            "tierpilot agent is not being scraped",
            f"Prometheus cannot scrape the tierpilot agent (job {a.agent_job}): no tier metrics, no "
            "drift detection and no tuning are visible, and the SLO alerts go blind.",
            "tierpilotagentdown", for_="5m",
        ),
        Alert(
            "TierpilotAgentStale",
            f"time() - max by (namespace) (tierpilot_snapshot_timestamp_seconds)\n"
            f"  > {a.agent_stale_seconds}",
            "warning",
            "tierpilot agent has not completed a scrape cycle for {{ $value | humanizeDuration }}",
            "The agent in {{ $labels.namespace }} still answers Prometheus, but its last completed "
            "scrape cycle is {{ $value | humanizeDuration }} old: its scheduler is stuck or every cycle "
            "fails. The exported tier metrics are frozen.",
            "tierpilotagentstale", for_="2m",
        ),
        Alert(
            "TierpilotNoLeader",
            "sum by (namespace) (tierpilot_leader) < 1",
            "warning",
            "No tierpilot replica holds the leader Lease",
            "No agent replica in {{ $labels.namespace }} is leader, so nothing tunes or actuates "
            "(observability still works).",
            "tierpilotnoleader", for_="5m",
        ),
        Alert(
            "TierpilotSplitBrain",
            "sum by (namespace) (tierpilot_leader) > 1",
            "critical",
            "{{ $value }} tierpilot replicas believe they are leader",
            "More than one agent replica in {{ $labels.namespace }} reports leadership; two tuners may "
            "patch the same objects.",
            "tierpilotsplitbrain", for_="2m",
        ),
    )


def groups(settings: BuildSettings) -> tuple[Group, ...]:
    return (
        Group("tierpilot-ttft-slo", slo_records(settings.slo) + slo_alerts(settings.slo)),
        Group("tierpilot-cache", cache_records() + cache_alerts(settings.alerts)),
        Group("tierpilot-agent", agent_alerts(settings.alerts)),
    )
