"""`tierpilot demo`: the click command (thin: builds `DemoSettings`, runs `emulator.demo.loop`)."""
from __future__ import annotations

import logging
import sys
from pathlib import Path

import click

from emulator.demo.settings import DemoSettings, DemoSettingsError


@click.command("demo")
@click.option("--engine", type=click.Choice(["emulated", "vllm"]), default="emulated", show_default=True,
              help="emulated: the twin-driven cluster; vllm: real vLLM CPU engines behind the real vllm-router "
                   "(needs `make engine`; see docs/demo.md).")
@click.option("--duration", type=float, default=None,
              help="Wall-clock seconds to run; the two-phase workload is paced to fill it (>= 20) [default: 180]. "
                   "With --engine vllm: seconds of the request stream sent to both fleets [default: 210].")
@click.option("--pods", type=int, default=4, show_default=True, help="Emulated vLLM pods (1-16).")
@click.option("--trace", type=click.Path(exists=True, dir_okay=False, path_type=Path), default=None,
              help="A Mooncake JSONL trace to use as the shifted second phase [default: built-in "
                   "multi-turn sessions after a shared-prompt/RAG first phase].")
@click.option("--seed", type=int, default=7, show_default=True, help="Seed of the workload and the samplers.")
@click.option("--report-dir", type=click.Path(file_okay=False, path_type=Path), default=Path("demo-report"),
              show_default=True, help="Where report.md and the PNG charts are written.")
@click.option("--dry-run", is_flag=True, help="The tuner proposes configurations but applies none.")
@click.option("--time-scale", type=float, default=None,
              help="Emulated cluster seconds per wall-clock second [default: 20].")
@click.option("--agent-port", type=int, default=9400, show_default=True,
              help="Port of the agent's /metrics on 127.0.0.1 (a free port is used if it is taken).")
@click.option("--inject-regression", is_flag=True,
              help="Put a known-bad configuration first in the tuner's queue (the first live trial), "
                   "to show the guardrails rolling it back.")
@click.option("--no-live", is_flag=True,
              help="No live console view: progress lines instead (for logs and CI; always so when stdout "
                   "is not a terminal).")
@click.option("--pods-port", type=int, default=0, show_default=True,
              help="0: the emulated endpoints take free ports. Else fixed ports from PORT: pod i's vLLM "
                   "/metrics on PORT+i, its Curvine FUSE /metrics on PORT+PODS+i, the Curvine master on "
                   "PORT+2*PODS. The demo prints every endpoint when it starts.")
@click.option("-v", "--verbose", is_flag=True, help="Log the tuner's structured events to stderr.")
def demo(engine: str, duration: float | None, pods: int, trace: Path | None, seed: int, report_dir: Path, dry_run: bool,
         time_scale: float | None, agent_port: int, inject_regression: bool, no_live: bool, pods_port: int,
         verbose: bool) -> None:
    """Run the whole tierpilot loop on an emulated cluster, on 127.0.0.1 only.

    Emulated vLLM 0.33 pods (with in-process LMCache) and a Curvine pool, driven by the digital
    twin, serve the real /metrics formats and KV-event streams. The agent discovers and scrapes
    them and exports its unified metrics on 127.0.0.1:9400/metrics; when the workload shifts it
    detects the drift, plans on the twin (every change priced with its restart cost) and applies
    only what pays, through the guardrails, rolling back any change that regresses. At the end it
    writes REPORT_DIR/report.md with charts and prints the verdict: every request as served vs the
    defaults held vs per-phase hindsight, per phase and whole run. Ctrl-C stops cleanly and still
    writes the (partial) report.

    With --engine vllm the loop runs on real vLLM CPU engines with vLLM's native CPU and fs tiers,
    described as Deployments in an emulated Kubernetes API whose kubelet runs them, behind the real
    vllm-router: the same request stream goes over HTTP to two identical fleets at once, one tuned
    by `tierpilot run` (it patches the engines' Deployments, and the kubelet restarts them with the
    new tier settings), one with the defaults held; report.md has the verdict against the noise
    floor measured before the first change.

    \b
    Examples:
      tierpilot demo --duration 60 --report-dir demo-report
      tierpilot demo --duration 120 --no-live --pods-port 8000 &    # then scrape 127.0.0.1:8000
      tierpilot demo --inject-regression --dry-run
      tierpilot demo --engine vllm --report-dir demo-vllm      # about 7 minutes on an idle machine
    """
    logging.basicConfig(level=logging.INFO if verbose else logging.WARNING, stream=sys.stderr,
                        format="%(asctime)s %(name)s %(message)s")
    import optuna

    # optuna announces every in-memory study at INFO; the demo reports trials itself
    optuna.logging.set_verbosity(optuna.logging.INFO if verbose else optuna.logging.WARNING)
    if engine == "vllm":
        _engine_demo(duration, seed, report_dir, dry_run, agent_port)
        return
    duration = 180.0 if duration is None else duration
    try:
        settings = DemoSettings(duration_s=duration, pods=pods, trace=trace, seed=seed, report_dir=report_dir,
                                dry_run=dry_run, time_scale=time_scale, agent_port=agent_port,
                                inject_regression=inject_regression,
                                live_view=wants_live_view(no_live, sys.stdout), pods_port=pods_port)
    except DemoSettingsError as exc:
        raise click.ClickException(str(exc)) from None
    from agent.runtime.process import configure_process
    from emulator.demo.loop import run_demo

    configure_process()  # the agent runs in this process: set it up as `tierpilot run` does
    try:
        run_demo(settings)
    except DemoSettingsError as exc:  # e.g. a --pods-port that is taken
        raise click.ClickException(str(exc)) from None


def wants_live_view(no_live: bool, stdout: object) -> bool:
    """The live view redraws a terminal; piped or redirected, it would print cut-down frames
    ("58…"), so progress lines are printed instead."""
    isatty = getattr(stdout, "isatty", None)
    return not no_live and bool(isatty and isatty())


def _engine_demo(duration: float | None, seed: int, report_dir: Path, dry_run: bool, agent_port: int) -> None:
    from emulator.demo.engine_run import EngineDemoSettings, run_engine_demo

    try:
        stream = {} if duration is None else {"stream_s": duration}
        settings = EngineDemoSettings(seed=seed, report_dir=report_dir, dry_run=dry_run, agent_port=agent_port,
                                      **stream)
    except ValueError as exc:
        raise click.ClickException(str(exc)) from None
    try:
        run_engine_demo(settings, progress=click.echo)
    except KeyboardInterrupt:
        raise click.ClickException("interrupted: the engines and the routers were stopped") from None
    except RuntimeError as exc:
        raise click.ClickException(str(exc)) from None
