"""`tierpilot tune`: tune the cache-tier knobs on the digital twin with optuna."""
from __future__ import annotations

import logging
import math
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import click

from contracts.output_paths import check_output_dir, check_output_file
from simulator.synthetic import PRESETS
from tuners.objective import DEFAULT_MEMORY_MS_PER_GIB, METRICS, ObjectiveSpec
from tuners.optuna_tuner import SAMPLERS
from tuners.space import SearchSpace
from tuners.space.limits import L2_BACKENDS, DeploymentLimits, TargetAcceptance
from tuners.tune_report import cpu_tier_note, print_comparison, print_pareto, write_best

EPILOG = """\b
Examples:
  tierpilot tune --workload shift --trials 40
  tierpilot tune --workload rag --trials 40 --targets deploy/overlays/production-stack/targets.yaml \\
      --out best.yaml && tierpilot k8s check --targets deploy/overlays/production-stack/targets.yaml \\
      --config best.yaml
  tierpilot tune --trace synthetic_trace.jsonl --max-requests 1500 \\
      --pods 16 --trials 60 --sampler tpe --plot-dir plots --out best.yaml
  tierpilot replay --trace ... --config best.yaml      # replay with the tuned knobs
"""


def _quiet_while_running(ctx: click.Context) -> None:
    """optuna's per-trial INFO lines and the tuner's JSON events stay off the console while the
    command runs; the levels are put back when it ends (an in-process caller keeps its logging)."""
    import optuna

    tuner_log = logging.getLogger("tierpilot.tuner")
    saved = optuna.logging.get_verbosity(), tuner_log.level
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    tuner_log.setLevel(logging.WARNING)

    def restore() -> None:
        optuna.logging.set_verbosity(saved[0])
        tuner_log.setLevel(saved[1])

    ctx.call_on_close(restore)


@click.command(epilog=EPILOG, context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--trace", type=click.Path(exists=True, dir_okay=False, path_type=Path),
              help="Mooncake JSONL trace to replay (block hashes, 512-token blocks).")
@click.option("--workload", "preset", type=click.Choice(sorted(PRESETS)),
              help="Synthetic workload preset instead of a trace: " + "; ".join(f"{k}: {v}" for k, v in PRESETS.items()))
@click.option("--trials", type=click.IntRange(1), required=True, help="Trials to run (added to a resumed study).")
@click.option("--sampler", type=click.Choice(SAMPLERS), default="tpe", show_default=True,
              help="tpe (multivariate TPE), random, or grid (every grid point of the space, in random order).")
@click.option("--storage", default=None,
              help="Optuna storage URL that keeps the study: sqlite:///FILE or "
                   "postgresql+psycopg2://USER@HOST:PORT/DB. An existing study of the same name is resumed "
                   "(and said so) if it was run with the same settings. [default: in memory, not kept]")
@click.option("--study", help="Study name [default: tune-<trace or workload name>].")
@click.option("--new-study", is_flag=True,
              help="If the study exists with other settings, start a new one named <study>-2, -3, ... "
                   "(the old study is kept) instead of stopping with the differences.")
@click.option("--targets", "targets_file", type=click.Path(exists=True, dir_okay=False, path_type=Path),
              help="The deployment's targets YAML (the file `tierpilot k8s` uses): search only the knobs "
                   "its targets own and the values they accept; the other knobs keep the cluster's values.")
@click.option("--seed", type=int, default=0, show_default=True, help="Seed of the sampler and the synthetic workload.")
@click.option("--metric", type=click.Choice(METRICS), default="ttft_p95", show_default=True,
              help="Objective to minimise.")
@click.option("--memory-ms-per-gib", type=click.FloatRange(0), default=DEFAULT_MEMORY_MS_PER_GIB,
              show_default=True,
              help="Exchange rate of the objective: TTFT milliseconds one GiB of fleet CPU memory is worth "
                   "(objective = TTFT + rate x GiB). 0 tunes TTFT alone. See docs/tuner.md.")
@click.option("--multi-objective", is_flag=True,
              help="Also maximise hit ratio and minimise memory cost; report the Pareto front.")
@click.option("--plot-dir", type=click.Path(file_okay=False, path_type=Path),
              help="Write history.png, importances.png (and pareto.png) here.")
@click.option("--out", type=click.Path(dir_okay=False, path_type=Path),
              help="Write the best configuration as YAML (read by `tierpilot replay --config`).")
@click.option("--pods", type=click.IntRange(1), default=4, show_default=True, help="Serving pods in the twin.")
@click.option("--gpu-tokens", type=click.IntRange(0), help="GPU KV capacity per pod in tokens [default: profile].")
@click.option("--l2-tokens", type=click.IntRange(0), help="Shared L2 pool capacity in tokens [default: profile]. "
              "The pool size is fixed; tuning only chooses how it is used.")
@click.option("--model", help="Model (KV bytes per token) [default: the profile's model].")
@click.option("--profile", default=None, help="Hardware profile name or YAML file [default: g6e-l40s].")
@click.option("--node-memory-gib", type=click.FloatRange(0), default=32.0, show_default=True,
              help="Host memory headroom per pod: the upper bound of the CPU buffer.")
@click.option("--cpu-gib-step", type=click.FloatRange(0.25), default=1.0, show_default=True,
              help="Resolution of the CPU buffer dimension.")
@click.option("--cpu-budget-gib", type=click.FloatRange(0), help="Fleet-wide cap on CPU GiB x pods (a constraint).")
@click.option("--l2-backend", type=click.Choice(tuple(L2_BACKENDS)), default="twin", show_default=True,
              help="Which eviction policies and watermarks exist: curvine (lru/lfu + watermarks), "
                   "lmcache (lru/lfu/fifo), twin (all). --targets narrows this further to what the "
                   "deployment's targets accept.")
@click.option("--max-requests", type=click.IntRange(1), help="Replay only the first N requests.")
@click.option("--duration", type=click.FloatRange(0, min_open=True), help="Replay only the first S seconds.")
@click.option("--workers", type=click.IntRange(1), default=1, show_default=True,
              help="Processes sharing the study: this one plus N-1 helpers (needs an RDB --storage; "
                   "PostgreSQL for more than two). They draw from one budget of --trials; see docs/tuner.md.")
@click.option("-q", "--quiet", is_flag=True, help="No progress bar.")
def tune(trace: Path | None, preset: str | None, trials: int, sampler: str, storage: str | None, study: str | None,
         new_study: bool, targets_file: Path | None, seed: int, metric: str, memory_ms_per_gib: float,
         multi_objective: bool, plot_dir: Path | None, out: Path | None, pods: int,
         gpu_tokens: int | None, l2_tokens: int | None, model: str | None, profile: str | None,
         node_memory_gib: float, cpu_gib_step: float, cpu_budget_gib: float | None, l2_backend: str,
         max_requests: int | None, duration: float | None, workers: int, quiet: bool,
         load_targets: Callable[[Path], TargetAcceptance] | None = None) -> None:
    """Tune the cache-tier knobs on the digital twin with optuna (ask/tell, persistent study).

    Each trial replays the workload with one candidate configuration; the objective is the
    replay's TTFT p95 (or p50) plus the fleet's CPU memory at --memory-ms-per-gib. The defaults
    (LMCache: chunk 256, CPU 5 GiB, LRU; round-robin routing) are tried first and printed next to
    the best configuration found. A study is resumed only with the settings it was run with.
    """
    _quiet_while_running(click.get_current_context())
    if (trace is None) == (preset is None):
        raise click.UsageError("give exactly one of --trace PATH or --workload NAME")
    inputs = _search_inputs(
        out=out, plot_dir=plot_dir, targets_file=targets_file, load_targets=load_targets,
        workload_args={"trace": trace, "preset": preset, "seed": seed, "max_requests": max_requests,
                       "duration_s": duration},
        cluster_args=dict(pods=pods, gpu_tokens=gpu_tokens, l2_tokens=l2_tokens, model=model,
                          **({"profile": profile} if profile else {})),
        limit_args={"node_memory_headroom_gib": node_memory_gib, "cpu_gib_step": cpu_gib_step,
                    "cpu_budget_gib": cpu_budget_gib, "l2_backend": l2_backend},
        objective_args={"metric": metric, "multi": multi_objective, "memory_ms_per_gib": memory_ms_per_gib})
    name = study or f"tune-{trace.stem if trace else preset}"
    settings = _study_settings(trace, preset, seed, max_requests, duration, inputs.cluster, inputs.limits, inputs.acc)
    if workers > 1 and storage is None:
        raise click.UsageError("--workers > 1 shares one study between processes: give --storage "
                               "postgresql+psycopg2://... (or sqlite:///FILE for two)")
    name = _study_name(storage, name, settings, inputs.space, inputs.objective, new_study)
    source = trace or preset
    _echo_plan(inputs, source=source, study=name, storage=storage, sampler=sampler, l2_backend=l2_backend,
               targets_file=targets_file)
    if workers > 1:
        if inputs.acc is not None:
            raise click.UsageError("--targets with --workers > 1 is not supported: the workers build the "
                                   "unrestricted space; run --targets with one worker")
        _tune_parallel(workload_spec=inputs.workload_args, cluster_kw=inputs.cluster_args, cluster=inputs.cluster,
                       workload=inputs.workload, limits=inputs.limits, objective=inputs.objective, storage=storage,
                       study=name, trials=trials, workers=workers, sampler=sampler, seed=seed, out=out,
                       settings=settings)
        return
    tuner, result = _run_trials(inputs, trials=trials, storage=storage, study=name, sampler=sampler, seed=seed,
                                settings=settings, quiet=quiet)
    _report_trials(tuner, result, inputs, headroom_gib=node_memory_gib, plot_dir=plot_dir, out=out,
                   study=name, storage=storage, source=source, targets_file=targets_file)


@dataclass(frozen=True)
class _SearchInputs:
    """What `tune` searches on, built from its options before the first trial."""

    workload_args: dict[str, Any]  # load_workload's arguments (and the parallel workers')
    cluster_args: dict[str, Any]  # ClusterSpec's arguments (and the parallel workers')
    workload: Any  # the workload frame
    cluster: Any  # the twin's ClusterSpec
    limits: DeploymentLimits
    objective: ObjectiveSpec
    space: SearchSpace
    acc: TargetAcceptance | None  # what the --targets file accepts
    defaults: Any  # the defaults trial under --targets (Knobs), else None: LMCache's defaults


def _search_inputs(*, out: Path | None, plot_dir: Path | None, targets_file: Path | None,
                   load_targets: Callable[[Path], TargetAcceptance] | None, workload_args: dict[str, Any],
                   cluster_args: dict[str, Any], limit_args: dict[str, Any],
                   objective_args: dict[str, Any]) -> _SearchInputs:
    """Check the output paths, load the workload and build the twin, the limits, the objective and
    the search space; a bad value of any of them is one `Error:` line, before the search."""
    from simulator.cluster import ClusterSpec
    from simulator.models import GIB
    from tuners.offline import load_workload

    try:
        if out is not None:  # before the search, not after it
            check_output_file(out, "--out")
        if plot_dir is not None:
            check_output_dir(plot_dir, "--plot-dir")
        workload = load_workload(**workload_args)
        cluster = ClusterSpec(**cluster_args)
        l2_tokens = cluster_args["l2_tokens"]
        bpt = cluster.model_spec.kv_bytes_per_token
        l2_gib = (l2_tokens * bpt / GIB) if l2_tokens is not None else cluster.hardware.l2_pool_gib
        limits = DeploymentLimits(pods=cluster_args["pods"], l2_pool_gib=max(l2_gib, 1e-9), **limit_args)
        objective = ObjectiveSpec(**objective_args)
        space, acc, defaults = _search_space(limits, targets_file, load_targets)
    except (ValueError, OSError) as exc:  # WorkloadError, ClusterError, CandidateError are ValueErrors
        raise click.ClickException(" ".join(str(exc).split())) from None
    return _SearchInputs(workload_args=workload_args, cluster_args=cluster_args, workload=workload, cluster=cluster,
                         limits=limits, objective=objective, space=space, acc=acc, defaults=defaults)


def _search_space(limits: DeploymentLimits, targets_file: Path | None,
                  load_targets: Callable[[Path], TargetAcceptance] | None,
                  ) -> tuple[SearchSpace, TargetAcceptance | None, Any]:
    """The space `limits` allow, narrowed to what the --targets file accepts when given; with it,
    what the targets accept and the defaults trial on the knobs they own."""
    space = SearchSpace.from_limits(limits)
    if targets_file is None:
        return space, None, None
    if load_targets is None:
        raise click.UsageError("--targets needs the agent's Kubernetes module: run `tierpilot tune`")
    acc = load_targets(targets_file)
    space = space.for_targets(acc)
    if not space.dimensions:
        raise ValueError(f"{targets_file}: its targets own no knob of the search space")
    return space, acc, space.validate(space.fixed.replace(**_tuned_defaults(space)))


def _echo_plan(inputs: _SearchInputs, *, source: Path | str | None, study: str, storage: str | None, sampler: str,
               l2_backend: str, targets_file: Path | None) -> None:
    """What is about to be tuned: the workload, the study and where it is kept, the objective, the scope."""
    objective, acc = inputs.objective, inputs.acc
    where = storage or "memory (not kept; --storage sqlite:///FILE keeps it)"
    click.echo(f"workload: {source} ({inputs.workload.height:,} requests), {inputs.cluster_args['pods']} pods; "
               f"study {study!r} in {where}; sampler {sampler}; objective {', '.join(objective.names)}"
               + (f"; {objective.memory_ms_per_gib:g} ms per GiB" if not objective.multi else ""))
    if acc is None:
        click.echo(f"note: no --targets: the search covers every value of the {l2_backend} backend, not only what a "
                   f"deployment accepts; check best.yaml with `tierpilot k8s check --targets F --config best.yaml`")
    if acc is not None:
        click.echo(f"targets {targets_file}: tuning {', '.join(d.name for d in inputs.space.dimensions)}; "
                   f"fixed: {', '.join(f'{k}={v}' for k, v in acc.fixed.items()) or 'nothing'}")


def _run_trials(inputs: _SearchInputs, *, trials: int, storage: str | None, study: str, sampler: str, seed: int,
                settings: dict[str, Any], quiet: bool) -> tuple[Any, Any]:
    """Run the trials in this process behind a progress bar showing the best value so far;
    returns the tuner and its OfflineResult."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from tuners.offline import tune_on_twin

    metric = inputs.objective.metric
    best_seen = [math.inf]
    with Progress(TextColumn("[bold]tuning"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                  TextColumn("{task.description}"), disable=quiet) as bar:
        task = bar.add_task("", total=trials)

        def on_trial(rec: object) -> None:
            v = getattr(rec, "value", None)
            if v is not None and v < best_seen[0] and getattr(rec, "feasible", True):
                best_seen[0] = v
            desc = f"best {metric} {best_seen[0]:.3f} s" if math.isfinite(best_seen[0]) else ""
            bar.update(task, advance=1, description=desc)

        try:
            return tune_on_twin(inputs.workload, inputs.cluster, inputs.limits, trials=trials,
                                objective=inputs.objective, space=inputs.space, storage=storage, study=study,
                                sampler=sampler, seed=seed, on_trial=on_trial, settings=settings,
                                defaults=inputs.defaults)
        except ValueError as exc:
            raise click.ClickException(str(exc)) from None


def _report_trials(tuner: Any, result: Any, inputs: _SearchInputs, *, headroom_gib: float, plot_dir: Path | None,
                   out: Path | None, study: str, storage: str | None, source: Path | str | None,
                   targets_file: Path | None) -> None:
    """After a search in this process: the best configuration against the defaults, the capacity
    curves at it, the Pareto front (multi-objective); then --out and the --plot-dir plots."""
    from tuners.capacity_report import print_capacity
    from tuners.offline import DEFAULTS

    click.echo(f"{len(result.records)} trials run ({result.replays} replays, {result.replay_seconds:.1f} s); "
               f"study now holds {len(tuner.trials())} trials")
    if result.best is None or result.best_evaluation is None:
        raise click.ClickException("no feasible trial finished; nothing to report")
    default_knobs, objective = inputs.defaults or DEFAULTS, inputs.objective
    print_comparison(result.best.knobs, result.best_evaluation, default_knobs, result.defaults, objective)
    note = cpu_tier_note(result.best.knobs, default_knobs, inputs.cluster)
    if note:
        click.echo(note)
    curve_plots = print_capacity(inputs.workload, inputs.cluster, result.best.knobs, headroom_gib=headroom_gib,
                                 memory_ms_per_gib=objective.memory_ms_per_gib, plot_dir=plot_dir)
    metric = objective.metric
    if objective.multi:
        print_pareto(result.pareto, metric)
    if out is not None:
        write_best(out, result.best.knobs, {
            "study": study, "storage": storage, "trial": result.best.number, "objective": metric,
            f"{metric}_s": result.best_evaluation.metric(metric),
            "defaults_" + f"{metric}_s": result.defaults.metric(metric),
            "workload": str(source), "requests": inputs.workload.height, "pods": inputs.cluster_args["pods"],
            "memory_ms_per_gib": objective.memory_ms_per_gib, "objective_value": result.best.value,
            **({"targets": str(targets_file)} if targets_file else {})})
    if plot_dir is not None:
        from tuners.plots import write_plots

        for path in [*write_plots(tuner.study, plot_dir, objective_names=objective.names), *curve_plots]:
            click.echo(f"wrote {path}")


def _tune_parallel(*, workload_spec: dict, cluster_kw: dict, cluster: object, workload: object, limits: object,
                   objective: ObjectiveSpec, storage: str, study: str, trials: int, workers: int, sampler: str,
                   seed: int, out: Path | None, settings: dict[str, Any]) -> None:
    import os

    from tuners.evaluators import TwinEvaluator
    from tuners.offline import DEFAULTS
    from tuners.parallel import ClusterArgs, WorkloadSpec, parallel_tune

    cores = len(os.sched_getaffinity(0))
    if workers > cores:
        click.echo(f"note: {workers} workers on {cores} cores: at most {cores} trials run at once here; the extra "
                   f"workers add start-up and contention (pods on other nodes do not)", err=True)
    try:
        result = parallel_tune(WorkloadSpec(**workload_spec), ClusterArgs(cluster_kw), limits,  # type: ignore[arg-type]
                               storage=storage, study=study, trials=trials, workers=workers,
                               objective=objective, sampler=sampler, seed=seed, settings=settings, frame=workload)
    except ValueError as exc:
        raise click.ClickException(str(exc)) from None
    for error in result.errors:
        click.echo(f"warning: {error} (the other workers ran its trials)", err=True)
    click.echo(f"{sum(r.trials for r in result.workers)} trials on {len(result.workers)} workers in "
               f"{result.wall_seconds:.1f} s; study now holds {result.trials} trials")
    for r in result.workers:
        click.echo(f"  worker {r.worker}: {r.trials} trials, {r.replay_seconds:.1f} s replaying, "
                   f"{r.storage_seconds:.1f} s in ask/tell, ready {r.startup_seconds:.1f} s after the search began")
    if result.best is None:
        raise click.ClickException("no feasible trial finished; nothing to report")
    evaluator = TwinEvaluator(workload, cluster, limits)  # type: ignore[arg-type]
    best_ev, defaults = evaluator.evaluate(result.best.knobs), evaluator.evaluate(DEFAULTS)
    print_comparison(result.best.knobs, best_ev, DEFAULTS, defaults, objective)
    note = cpu_tier_note(result.best.knobs, DEFAULTS, cluster)
    if note:
        click.echo(note)
    if out is not None:
        metric = objective.metric
        write_best(out, result.best.knobs, {"study": study, "storage": storage, "trial": result.best.number,
                                            "objective": metric, f"{metric}_s": best_ev.metric(metric),
                                            "workers": workers})


def _tuned_defaults(space: SearchSpace) -> dict[str, Any]:
    """The LMCache defaults for the knobs the targets let us tune (the rest stay as the cluster runs)."""
    from tuners.offline import DEFAULTS

    tuned = {k for d in space.dimensions for k in (("l2_high_watermark", "l2_low_watermark")
                                                    if d.name == "l2_watermarks" else (d.name,))}
    return {k: v for k, v in DEFAULTS.to_dict().items() if k in tuned}


def _study_settings(trace: Path | None, preset: str | None, seed: int, max_requests: int | None,
                    duration: float | None, cluster: Any, limits: DeploymentLimits,
                    acc: TargetAcceptance | None) -> dict[str, Any]:
    """What a resumed study must share with this command (JSON-safe)."""
    return {
        "workload": str(trace.resolve() if trace else preset), "seed": seed, "max_requests": max_requests,
        "duration_s": duration, "pods": cluster.pods, "gpu_tokens": cluster.gpu_tokens,
        "l2_tokens": cluster.l2_tokens, "model": cluster.model_spec.name, "profile": cluster.hardware.name,
        "limits": {"node_memory_headroom_gib": limits.node_memory_headroom_gib,
                   "cpu_gib_step": limits.cpu_gib_step, "cpu_budget_gib": limits.cpu_budget_gib,
                   "l2_backend": limits.l2_backend},
        "targets": None if acc is None else {"file": acc.source,
                                             "fixed": {k: v for k, v in sorted(acc.fixed.items())}},
    }


def _study_name(storage: str | None, name: str, settings: dict[str, Any], space: SearchSpace, objective: ObjectiveSpec,
                new_study: bool) -> str:
    """`name`, unless its stored settings differ: then a clear error, or with --new-study a fresh name."""
    from tuners.optuna_tuner import free_study_name, study_settings, study_settings_differences

    if storage is None:  # a study in memory is always new
        return name
    try:
        diffs = study_settings_differences(storage, name, study_settings(settings, space, objective))
        if diffs == []:
            click.echo(f"resuming study {name!r} in {storage} (same settings; pass --study NAME for a new one)")
        if not diffs:
            return name
        if not new_study:
            raise click.ClickException(
                f"study {name!r} in {storage} was run with other settings: {'; '.join(diffs)}. It is not "
                f"resumed: pass --new-study to start a new study (that one is kept), or --study NAME")
        fresh = free_study_name(storage, name)
    except ValueError as exc:
        raise click.ClickException(" ".join(str(exc).split())) from None
    click.echo(f"study {name!r} was run with other settings ({'; '.join(diffs)}); starting {fresh!r}")
    return fresh
