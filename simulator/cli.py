"""`tierpilot replay`: replay a trace or a synthetic workload on the digital twin."""
from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import click

from contracts.console_tables import count, table, table_console
from contracts.jsonsafe import dumps as json_dumps
from contracts.knobs import (
    CHUNK_TOKEN_CHOICES,
    L2_EVICTION_CHOICES,
    KnobError,
    Knobs,
)
from contracts.output_paths import OutputPathError, check_output_file
from simulator.cluster import ClusterError, ClusterSpec
from simulator.models import GIB, ModelError, get_model, models
from simulator.policies import POLICIES
from simulator.profile import DEFAULT_PROFILE, HardwareProfile, ProfileError, get_profile, profile_names
from simulator.records import WorkloadError
from simulator.router import ROUTERS
from simulator.synthetic import DEFAULT_PRESET, PRESETS

PROGRESS_MIN_REQUESTS = 2000


def _tokens(tokens: int | None, gib: float | None, name: str, model: str) -> int | None:
    if tokens is not None and gib is not None:
        raise click.UsageError(f"give either --{name}-tokens or --{name}-gib, not both")
    if gib is not None:
        return get_model(model).tokens_for_gib(gib)
    return tokens


def _render_table(summary: dict[str, Any], header: str) -> None:

    console = table_console()
    console.print(header)
    rows = []
    for tier in ("gpu", "cpu", "l2"):
        d = summary["tiers"][tier]
        cap = d["capacity_tokens"]
        rows.append((tier.upper(), count(cap) if cap else "off", count(d["lookup_tokens"]), count(d["hit_tokens"]),
                     f"{d['hit_ratio']:.3f}", count(d["evictions"])))
    console.print(table("Tiers (token counts; evictions in chunks)",
                        ("tier", "capacity tok", "lookup tok", "hit tok", "hit ratio", "evicted chunks"), rows))
    miss = summary["miss"]
    prompt = summary["prompt_tokens"] or 1
    rows = [
        ("requests", f"{summary['requests']:,}"),
        ("prompt tokens", f"{summary['prompt_tokens']:,}"),
        ("token hit ratio (all tiers)", f"{summary['hit_ratio']:.4f}"),
        ("workload overlap (max achievable)", f"{summary['overlap']:.4f}"),
        ("TTFT p50 / p95 / p99", (f"{summary['ttft_p50_s']:.3f} / {summary['ttft_p95_s']:.3f} / "
                                 f"{summary['ttft_p99_s']:.3f} s")),
        ("queue delay p95", f"{summary['queue_delay_p95_s']:.3f} s"),
        ("L2 bytes read / written", f"{summary['l2_bytes_read'] / GIB:,.2f} / {summary['l2_bytes_written'] / GIB:,.2f} GiB"),
        ("miss: cold", f"{miss['cold_tokens']:,} ({miss['cold_tokens'] / prompt:.1%})"),
        ("miss: capacity", f"{miss['capacity_tokens']:,} ({miss['capacity_tokens'] / prompt:.1%})"),
        ("miss: routing", f"{miss['routing_tokens']:,} ({miss['routing_tokens'] / prompt:.1%})"),
        ("miss: partial last chunk", f"{miss['tail_tokens']:,} ({miss['tail_tokens'] / prompt:.1%})"),
        ("replay wall time", f"{summary['elapsed_s']:.2f} s"),
    ]
    console.print(table("Summary", ("metric", "value"), rows, text=("metric",), show_header=False))


def _render_curves(curves: Any, cap: dict[str, float]) -> None:

    from simulator.capacity.table import CURVE_COLUMNS, curve_rows

    table_console().print(table("What if each tier held N GiB (hit ratio over the whole run, LRU; * = now)",
                          CURVE_COLUMNS, curve_rows(curves, cap_gib=cap)))


@click.command(context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 110})
@click.option("--trace", "trace", type=click.Path(dir_okay=False, path_type=Path),
              help="Mooncake JSONL trace (timestamp ms, input_length, output_length, hash_ids per 512 tokens).")
@click.option("--workload", type=click.Choice(sorted(PRESETS)), default=None,
              help="Built-in synthetic preset: " + "; ".join(f"{k}: {v}" for k, v in PRESETS.items())
                   + f" [default: {DEFAULT_PRESET} when no --trace].")
@click.option("--seed", type=int, default=0, show_default=True, help="Seed of the synthetic generator.")
@click.option("--duration", "duration_s", type=click.FloatRange(min=0, min_open=True), default=None,
              help="Synthetic workload length in seconds (phases keep their proportions).")
@click.option("--rate", "rate_rps", type=click.FloatRange(min=0, min_open=True), default=None,
              help="Synthetic request rate (requests/s) in every phase.")
@click.option("--pods", type=click.IntRange(1, 1024), default=4, show_default=True, help="Number of vLLM pods.")
@click.option("--gpu-tokens", type=click.IntRange(min=0), help="GPU prefix cache per pod, tokens (0 disables).")
@click.option("--cpu-tokens", type=click.IntRange(min=0), help="LMCache CPU tier per pod, tokens (0 disables).")
@click.option("--l2-tokens", type=click.IntRange(min=0), help="Shared L2 pool, tokens (0 disables).")
@click.option("--gpu-gib", type=click.FloatRange(min=0), help="GPU prefix cache per pod in GiB (uses --model).")
@click.option("--cpu-gib", type=click.FloatRange(min=0), help="LMCache CPU tier per pod in GiB (the cpu_gib knob).")
@click.option("--l2-gib", type=click.FloatRange(min=0), help="Shared L2 pool in GiB (uses --model).")
@click.option("--model", type=click.Choice(list(models())), default=None,
              help="Model for GiB <-> token conversion (KV bytes/token) [default: the profile's model].")
@click.option("--chunk-tokens", type=click.Choice([str(c) for c in CHUNK_TOKEN_CHOICES]), default=None,
              help="LMCache chunk size in tokens [default: 256].")
@click.option("--router", type=click.Choice(tuple(ROUTERS)), default=None, help="Routing strategy [default: roundrobin].")
@click.option("--l2-eviction", type=click.Choice(L2_EVICTION_CHOICES), default=None, help="L2 eviction policy [default: lru].")
@click.option("--cpu-eviction", type=click.Choice(tuple(POLICIES)), default=None, help="CPU eviction policy [default: lru].")
@click.option("--l2-min-prompt-tokens", type=click.IntRange(min=0), default=None,
              help="Prompts shorter than this recompute instead of reading L2 [default: 0].")
@click.option("--profile", default=DEFAULT_PROFILE, show_default=True,
              help=f"Hardware profile: {', '.join(profile_names())}, or a path to a profile YAML.")
@click.option("--config", "config", type=click.Path(dir_okay=False, path_type=Path),
              help="Knobs YAML (the tuner's output format); flags given on the command line override it.")
@click.option("--format", "fmt", type=click.Choice(["table", "json"]), default="table", show_default=True,
              help="table: tables for the terminal; json: one JSON object (the summary).")
@click.option("--json", "as_json", is_flag=True, help="Same as --format json (an alias).")
@click.option("--plot", "plot_path", type=click.Path(dir_okay=False, path_type=Path),
              help="Write a PNG of per-tier hit ratio and TTFT over trace time.")
def replay(trace: Path | None, workload: str | None, seed: int, duration_s: float | None, rate_rps: float | None,
           pods: int, gpu_tokens: int | None, cpu_tokens: int | None, l2_tokens: int | None, gpu_gib: float | None,
           cpu_gib: float | None, l2_gib: float | None, model: str | None, chunk_tokens: str | None,
           router: str | None, l2_eviction: str | None, cpu_eviction: str | None, l2_min_prompt_tokens: int | None,
           profile: str, config: Path | None, fmt: str, as_json: bool, plot_path: Path | None) -> None:
    """Replay a trace or synthetic workload on the digital twin of the tiered KV cache.

    The twin models per-pod GPU (vLLM prefix cache) and CPU (LMCache) tiers, a shared L2 pool,
    a router and a calibrated latency model, and reports hit ratios per tier, TTFT quantiles and
    why tokens missed. With no knob given it uses LMCache's defaults (256-token chunks, 5 GiB CPU,
    LRU) with round-robin routing, the profile's GPU capacity and L2 pool size.

    \b
    Examples:
      tierpilot replay                                  # default synthetic workload ('shift')
      tierpilot replay --workload rag --seed 7 --router prefixaware --format json
      tierpilot replay --trace conversation_trace.jsonl \\
          --pods 8 --chunk-tokens 512 --l2-eviction s3fifo --plot replay.png
      tierpilot replay --pods 1 --cpu-tokens 0 --l2-tokens 0 --chunk-tokens 512 --trace T.jsonl  # pure replay
      tierpilot replay --config best.yaml --workload sessions
    """
    if trace is not None and workload is not None:
        raise click.UsageError("give either --trace or --workload, not both")
    as_json = as_json or fmt == "json"
    setup = _replay_setup(
        trace=trace, workload=workload, seed=seed, duration_s=duration_s, rate_rps=rate_rps, pods=pods,
        gpu_tokens=gpu_tokens, cpu_tokens=cpu_tokens, l2_tokens=l2_tokens, gpu_gib=gpu_gib, cpu_gib=cpu_gib,
        l2_gib=l2_gib, model=model, profile=profile, config=config, plot_path=plot_path,
        overrides={"chunk_tokens": int(chunk_tokens) if chunk_tokens else None, "router": router,
                   "l2_eviction": l2_eviction, "cpu_eviction": cpu_eviction, "cpu_gib": cpu_gib,
                   "l2_min_prompt_tokens": l2_min_prompt_tokens})
    result = _run_with_progress(setup)
    summary, curves, cap = _summary_with_curves(setup, result)
    if plot_path is not None:
        from simulator.plot import plot_replay

        plot_replay(result, plot_path, curves=curves, cap_gib=cap)
    if as_json:
        click.echo(json_dumps(summary, sort_keys=True))
    else:
        _render_table(summary, _table_header(setup, result, pods))
        _render_curves(curves, cap)
    if plot_path is not None and not as_json:
        click.echo(f"plot written to {plot_path}")


@dataclass(frozen=True)
class _ReplaySetup:
    """What one replay runs: the workload and where it came from, the hardware and model, the twin and its knobs."""

    frame: Any  # the workload frame
    source: str  # the trace path, or the synthetic preset and seed
    profile: HardwareProfile
    model: str
    knobs: Knobs
    cluster: ClusterSpec


def _replay_setup(*, trace: Path | None, workload: str | None, seed: int, duration_s: float | None,
                  rate_rps: float | None, pods: int, gpu_tokens: int | None, cpu_tokens: int | None,
                  l2_tokens: int | None, gpu_gib: float | None, cpu_gib: float | None, l2_gib: float | None,
                  model: str | None, profile: str, config: Path | None, plot_path: Path | None,
                  overrides: dict[str, Any]) -> _ReplaySetup:
    """Check --plot, read the profile and --config, apply the knob flags (`overrides`; None: not
    given), size the twin and load the workload; a bad value of any of them is one `Error:` line,
    before any work."""
    try:
        if plot_path is not None:
            check_output_file(plot_path, "--plot")
        prof = get_profile(profile)
        model_name = model or prof.model
        knobs = Knobs.from_yaml_file(config) if config is not None else Knobs()
        if cpu_gib is not None and cpu_tokens is not None:
            raise click.UsageError("give either --cpu-tokens or --cpu-gib, not both")
        knobs = knobs.replace(**{k: v for k, v in overrides.items() if v is not None})
        cluster = ClusterSpec(
            pods=pods, gpu_tokens=_tokens(gpu_tokens, gpu_gib, "gpu", model_name), cpu_tokens=cpu_tokens,
            l2_tokens=_tokens(l2_tokens, l2_gib, "l2", model_name), model=model_name, profile=prof,
        )
        cluster.capacities(knobs)  # impossible capacities fail here, before any work
        frame, source = _load_workload(trace, workload, seed=seed, duration_s=duration_s, rate_rps=rate_rps)
    except (KnobError, ClusterError, ProfileError, ModelError, WorkloadError, OutputPathError) as exc:
        raise click.ClickException(str(exc)) from None
    return _ReplaySetup(frame=frame, source=source, profile=prof, model=model_name, knobs=knobs, cluster=cluster)


def _load_workload(trace: Path | None, workload: str | None, *, seed: int, duration_s: float | None,
                   rate_rps: float | None) -> tuple[Any, str]:
    """The trace's requests, or the synthetic preset's (default: DEFAULT_PRESET); and their source."""
    from simulator.synthetic import synthetic
    from simulator.workload import load_trace

    if trace is not None:
        return load_trace(trace), str(trace)
    preset = workload or DEFAULT_PRESET
    return synthetic(preset, seed=seed, duration_s=duration_s, rate_rps=rate_rps), f"synthetic {preset!r} (seed {seed})"


def _run_with_progress(setup: _ReplaySetup) -> Any:
    """Replay the workload on the twin; a long replay on a terminal shows a progress bar on stderr."""
    from simulator.replay import replay as run_replay

    frame = setup.frame
    progress_cb = None
    bar = None
    if frame.height >= PROGRESS_MIN_REQUESTS and sys.stderr.isatty():
        from rich.console import Console
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

        bar = Progress(TextColumn("replaying"), BarColumn(), MofNCompleteColumn(), TimeRemainingColumn(),
                       console=Console(stderr=True), transient=True)
        task = bar.add_task("replay", total=frame.height)

        def progress_cb(done: int, total: int) -> None:
            bar.update(task, completed=done)

        bar.start()
    try:
        return run_replay(frame, setup.cluster, setup.knobs, progress=progress_cb)
    finally:
        if bar is not None:
            bar.stop()


def _summary_with_curves(setup: _ReplaySetup, result: Any) -> tuple[dict[str, Any], Any, dict[str, float]]:
    """The replay's summary with its capacity curves, workload, profile and model; the curves and
    the memory caps they are drawn against."""
    from simulator.capacity import tier_curves
    from simulator.capacity.table import curves_json

    summary = result.summary()
    curves = tier_curves(setup.frame, setup.cluster, setup.knobs, run=result)
    cap = {"cpu": setup.profile.host_memory_gib}
    summary["capacity_curves"] = curves_json(curves, cap_gib=cap)
    summary["workload"] = setup.source
    summary["profile"] = setup.profile.name
    summary["model"] = setup.model
    return summary, curves, cap


def _table_header(setup: _ReplaySetup, result: Any, pods: int) -> str:
    caps = result.capacities
    return (
        f"[bold]{setup.source}[/bold]: {setup.frame.height:,} requests on {pods} pods, profile {setup.profile.name}, "
        f"model {setup.model} ({caps.kv_bytes_per_token:,} B/token)\n"
        f"knobs: " + ", ".join(f"{k}={v}" for k, v in setup.knobs.to_dict().items())
    )
