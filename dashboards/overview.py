"""The Tiered cache overview dashboard: how each tier serves the fleet, and what users feel."""
from __future__ import annotations

from dashboards.grafana import Dashboard, Panel, Query, Threshold, Variable
from dashboards.promql import eq, selector
from dashboards.settings import BuildSettings

UID = "tierpilot-overview"
RATE = "$__rate_interval"
TIERS = ("gpu", "cpu", "l2")
TOKENS = "suffix: tokens"
MODEL_SCOPE = ("namespace", "model")  # fleet-level KV-event signals carry no pod label
L2_SCOPE = ("namespace", "pod")  # the L2 latency panels filter on namespace and pod, not $model

VARIABLES = (
    Variable("namespace", "namespace", "tierpilot_target_up"),
    Variable("model", "model", "tierpilot_kv_lookup_tokens_total", 'namespace=~"$namespace"'),
    Variable("pod", "pod", "tierpilot_kv_lookup_tokens_total", 'namespace=~"$namespace", model=~"$model"'),
)


def _rate(metric: str, *matchers: str, by: str = "") -> str:
    grouping = f" by ({by})" if by else ""
    return f"sum{grouping} (rate({metric}{selector(*matchers)}[{RATE}]))"


def hit_ratio_by_tier() -> str:
    """Tier-conditional hit ratio of the whole selection: hits over lookups that reached the tier."""
    return (f"{_rate('tierpilot_kv_hit_tokens_total', by='tier')}\n  / "
            f"{_rate('tierpilot_kv_lookup_tokens_total', by='tier')}")


def total_hit_ratio() -> str:
    """The pods' average total hit ratio. The cumulative ratio grows down the tiers, so its maximum
    over the tiers a pod has is the deepest tier present (l2, else cpu, else gpu): no "no data"
    where there is no L2."""
    return f"avg(max by (namespace, pod, model) (tierpilot_kv_cumulative_hit_ratio{selector()}))"


def histogram_quantile(metric: str, quantile: str, *matchers: str, by: str = "",
                       scope: tuple[str, ...] | None = None) -> str:
    """A quantile over the rates of a histogram's buckets, summed over the selection (or per `by`)."""
    sel = selector(*matchers) if scope is None else selector(*matchers, scope=scope)
    grouping = f"{by}, le" if by else "le"
    return f"histogram_quantile({quantile}, sum by ({grouping}) (rate({metric}_bucket{sel}[{RATE}])))"


def _ttft_steps(settings: BuildSettings) -> tuple[Threshold, ...]:
    slo = settings.slo.ttft_seconds
    return (Threshold("green"), Threshold("orange", round(slo * 0.8, 6)), Threshold("red", slo))


def _headline_stats(settings: BuildSettings) -> tuple[Panel, ...]:
    """Top row: total hit ratio, TTFT at the SLO quantile, worst L2 read latency, L2 break-even."""
    slo = settings.slo
    q = slo.ttft_quantile
    l2_q = settings.alerts.l2_latency_quantile
    return (
        Panel(
            "Total hit ratio", "stat", "percentunit",
            (Query(total_hit_ratio()),),
            "Share of prompt tokens served by any tier the pods have (GPU, CPU, L2: the deepest tier's "
            "cumulative ratio), averaged over the selected pods.",
            width=6, height=5, min=0, max=1,
            thresholds=(Threshold("red"), Threshold("orange", 0.2), Threshold("green", 0.5)),
        ),
        Panel(
            f"TTFT p{float(q) * 100:g}", "stat", "s",
            (Query(histogram_quantile("tierpilot_ttft_seconds", q)),),
            f"TTFT at quantile {q} over the selected pods' requests (histogram_quantile over the rates of "
            f"vLLM's buckets); red above the SLO of {slo.ttft_seconds:g} s.",
            width=6, height=5, thresholds=_ttft_steps(settings),
        ),
        Panel(
            f"L2 read p{float(l2_q) * 100:g} (worst pod)", "stat", "s",
            (Query("max by (source) (" + histogram_quantile("tierpilot_l2_io_latency_seconds", l2_q, eq("op", "read"),
                                                            by="pod, source", scope=L2_SCOPE) + ")", "{{source}}"),),
            "Slowest pod's L2 (shared NVMe) read latency, one value per source: curvine_fuse times each "
            "FUSE read (one chunk), lmcache_* each LMCache remote get (a whole request, many chunks), so "
            "the two are never compared. \"no L2 reads\" where the pods have no L2 tier or read nothing "
            "from it.",
            width=6, height=5, no_value="no L2 reads",
            thresholds=(Threshold("green"), Threshold("red", settings.alerts.l2_read_latency_seconds)),
        ),
        Panel(
            "L2 break-even prompt length", "stat", TOKENS,
            (Query(f"min(tierpilot_l2_break_even_prompt_tokens{selector()})"),),
            "Prompt length above which reading a cached prefix from L2 beats recomputing the prefill. "
            "Prompts shorter than this should not read from L2 (knob l2_min_prompt_tokens). \"L2 never "
            "wins\": no L2 tier, or recomputing is faster at every length.",
            width=6, height=5, decimals=0, no_value="L2 never wins",
        ),
    )


def _hit_ratio_row() -> tuple[Panel, ...]:
    """Tier-conditional and cumulative hit ratio per tier over time."""
    return (
        Panel(
            "Hit ratio per tier (tier-conditional)", "timeseries", "percentunit",
            (Query(hit_ratio_by_tier(), "{{tier}}"),),
            "Of the prompt tokens that reached a tier (missed every tier above it), the share it served.",
            min=0, max=1,
        ),
        Panel(
            "Cumulative hit ratio per tier", "timeseries", "percentunit",
            (Query(f"avg by (tier) (tierpilot_kv_cumulative_hit_ratio{selector()})", "{{tier}} and above"),),
            "Share of all prompt tokens served by this tier or one above it (pod average). The L2 line is "
            "the total hit ratio of the cache hierarchy.",
            min=0, max=1,
        ),
    )


def _latency_row(settings: BuildSettings) -> tuple[Panel, ...]:
    """TTFT quantiles against the SLO, and L2 read/write latency."""
    slo = settings.slo
    q = slo.ttft_quantile
    return (
        Panel(
            "TTFT p50 / p95 / p99 against the SLO", "timeseries", "s",
            tuple(Query(histogram_quantile("tierpilot_ttft_seconds", x), f"p{float(x) * 100:g}")
                  for x in ("0.5", "0.95", "0.99")),
            f"Time to first token of the selected pods' requests per quantile (histogram_quantile over "
            f"bucket rates). The red band starts at the SLO: "
            f"p{float(q) * 100:g} <= {slo.ttft_seconds:g} s for {slo.objective:.1%} of the time.",
            min=0, thresholds=_ttft_steps(settings), show_thresholds_as_line=True,
        ),
        Panel(
            "L2 read and write latency", "timeseries", "s",
            (*(Query(histogram_quantile("tierpilot_l2_io_latency_seconds", x, by="op, source", scope=L2_SCOPE),
                     f"{{{{op}}}} p{float(x) * 100:g} ({{{{source}}}})") for x in ("0.5", "0.95", "0.99")),
             Query(f"max by (source) (tierpilot_kv_read_latency_seconds{selector(eq('tier', 'l2'))})",
                   "read, mean per chunk, worst pod ({{source}})")),
            "Shared NVMe pool I/O latency of the selected pods' reads and writes, per op, source and "
            "quantile (histogram_quantile over bucket rates). source curvine_fuse: each FUSE I/O; "
            "lmcache_*: each LMCache remote request (pods without a Curvine FUSE target). vLLM native "
            "tiering exports no read histogram: its line is the mean time per chunk read from the fs tier.",
            min=0,
        ),
    )


def _eviction_and_usage_row() -> tuple[Panel, ...]:
    """Evictions and fill level per tier."""
    return (
        Panel(
            "Evictions per tier", "timeseries", "short",
            (Query(_rate("tierpilot_kv_evicted_chunks_total", by="tier"), "{{tier}} chunks/s"),
             Query(_rate("tierpilot_kv_evicted_files_total", by="tier"), "{{tier}} files/s"),
             Query(_rate("tierpilot_kv_blocks_total", eq("op", "removed"), eq("medium", "CPU")),
                   "cpu blocks/s (KV events)")),
            "Eviction rate per tier and unit, summed over the selected pods: LMCache chunks (CPU, and L2 "
            "in MP mode), Curvine files (L2 pool), and the CPU-tier blocks vLLM's native tiering removes "
            "(its KV events: the engine counts no evictions). Units are never added together.",
            min=0,
        ),
        Panel(
            "Usage per tier", "timeseries", "percentunit",
            (Query(f"max by (tier) (tierpilot_kv_usage_ratio{selector()})", "{{tier}} (fullest pod)"),
             Query(f"avg by (tier) (tierpilot_kv_usage_ratio{selector()})", "{{tier}} (average)")),
            "How full each tier is. A tier pinned near 100% with a rising eviction rate is thrashing.",
            min=0, max=1,
        ),
    )


def _lookup_and_break_even_row() -> tuple[Panel, ...]:
    """Lookup and hit tokens per tier, and the L2 break-even prompt length per model."""
    return (
        Panel(
            "Lookup tokens per tier", "timeseries", "suffix: tokens/s",
            (Query(_rate("tierpilot_kv_lookup_tokens_total", by="tier"), "{{tier}} lookups"),
             Query(_rate("tierpilot_kv_hit_tokens_total", by="tier"), "{{tier}} hits")),
            "Prompt tokens looked up in and served by each tier, per second.",
            min=0,
        ),
        Panel(
            "L2 break-even prompt length per model", "timeseries", TOKENS,
            (Query(f"min by (model) (tierpilot_l2_break_even_prompt_tokens{selector()})", "{{model}}"),),
            "Prompt length above which an L2 read beats recomputing the prefill, from the measured L2 "
            "read latency and prefill throughput.",
            min=0, decimals=0,
        ),
    )


def _kv_event_row() -> tuple[Panel, ...]:
    """Fleet-level signals from the vLLM KV events: misses by cause, prefix overlap, duplicates."""
    return (
        Panel(
            "Misses by cause", "timeseries", "suffix: blocks/s",
            (Query(_rate("tierpilot_kv_misses_total", by="cause"), "{{cause}}"),),
            "GPU blocks that had to be computed, by cause, from the vLLM KV-event streams: cold (never "
            "seen), capacity (evicted from this pod earlier), routing (resident on another pod). An estimate; "
            "see docs/metrics.md.",
            width=8, min=0,
        ),
        Panel(
            "Workload prefix overlap", "timeseries", "percentunit",
            (Query(f"avg by (model) (tierpilot_kv_workload_overlap_ratio{selector(scope=MODEL_SCOPE)})",
                   "{{model}}"),),
            "Share of prompt tokens in blocks seen before anywhere in the fleet. It depends on the workload "
            "only, not on cache settings: a drop here means the prompts changed.",
            width=8, min=0, max=1,
        ),
        Panel(
            "Cross-pod duplicated blocks", "timeseries", "short",
            (Query(f"sum by (model) (tierpilot_kv_duplicated_blocks{selector(scope=MODEL_SCOPE)})",
                   "{{model}}"),),
            "KV blocks resident on more than one pod's GPU or CPU: capacity the routing wastes.",
            width=8, min=0, decimals=0,
        ),
    )


def _pod_table(settings: BuildSettings) -> tuple[Panel, ...]:
    """One row per pod: hit ratios, TTFT and usage."""
    q = settings.slo.ttft_quantile
    return (
        Panel(
            "Pods", "table", "percentunit",
            tuple(Query(expr, instant=True, format="table") for expr in _pod_table_queries(settings)),
            "One row per pod: hit ratio per tier, the total (cumulative) hit ratio, TTFT and tier usage.",
            width=24, height=9,
            columns=("pod", "model", "Value #A", "Value #B", "Value #C", "Value #D", "Value #E",
                     "Value #F", "Value #G"),
            column_names=(("Value #A", "GPU hit"), ("Value #B", "CPU hit"), ("Value #C", "L2 hit"),
                          ("Value #D", "Cumulative hit"), ("Value #E", f"TTFT p{float(q) * 100:g}"),
                          ("Value #F", "GPU usage"), ("Value #G", "CPU usage")),
            column_units=((f"TTFT p{float(q) * 100:g}", "s"),),
        ),
    )


def panels(settings: BuildSettings) -> tuple[Panel, ...]:
    return (
        *_headline_stats(settings),
        *_hit_ratio_row(),
        *_latency_row(settings),
        *_eviction_and_usage_row(),
        *_lookup_and_break_even_row(),
        *_kv_event_row(),
        *_pod_table(settings),
    )


def _pod_table_queries(settings: BuildSettings) -> tuple[str, ...]:
    q = settings.slo.ttft_quantile
    return (
        *(f"max by (pod, model) (tierpilot_kv_hit_ratio{selector(eq('tier', t))})" for t in TIERS),
        f"max by (pod, model) (tierpilot_kv_cumulative_hit_ratio{selector()})",
        f"max by (pod, model) ({histogram_quantile('tierpilot_ttft_seconds', q, by='pod, model')})",
        f"max by (pod, model) (tierpilot_kv_usage_ratio{selector(eq('tier', 'gpu'))})",
        f"max by (pod, model) (tierpilot_kv_usage_ratio{selector(eq('tier', 'cpu'))})",
    )


def build(settings: BuildSettings) -> Dashboard:
    return Dashboard(
        uid=UID,
        title="tierpilot / Tiered cache overview",
        description="Per-tier and cumulative KV-cache hit ratios, TTFT against the SLO, L2 latency, "
                    "evictions and usage across GPU (vLLM), CPU (LMCache) and the shared L2 pool (Curvine).",
        panels=panels(settings),
        variables=VARIABLES,
        links=(("tierpilot dashboards", "tierpilot"),),
    )
