"""The `tierpilot` command line. Subcommands live beside the code they drive and load lazily,
so `tierpilot --help` is fast and one broken subsystem cannot take the others down."""
from __future__ import annotations

import importlib
import sys
from typing import Any

import click

from contracts.redact import RedactingStream

# name -> (module, attribute, one-line help)
SUBCOMMANDS: dict[str, tuple[str, str, str]] = {
    "replay": ("simulator.cli", "replay", "Replay a trace or synthetic workload on the digital twin."),
    "tune": ("agent.cli.tune", "tune", "Tune the cache-tier knobs on the digital twin with optuna."),
    "run": ("agent.cli.run", "run", "Run the long-lived agent (scrape, export, drift, tune, apply)."),
    "scrape-once": ("agent.cli.run", "scrape_once", "Scrape targets once and print the unified tier view."),
    "demo": ("emulator.demo.cli", "demo", "Run the whole loop on a built-in emulated cluster."),
    "dashboards": ("dashboards.cli", "dashboards", "Build Grafana dashboards and render panels to PNG."),
    "kv-events": ("agent.kvevents.cli", "kv_events", "Watch vLLM KV-event streams and print block-level signals."),
    "k8s": ("agent.k8s.__main__", "main", "Check, show, apply or roll back knobs on Kubernetes targets by hand."),
}


class LazyGroup(click.Group):
    def main(self, *args: Any, **kwargs: Any) -> Any:
        """Everything any subcommand prints (its tables, warnings, errors, log lines, a traceback)
        reaches the terminal through one redacting formatter (contracts/redact.py): a target URL
        never shows its credentials, whichever path prints it."""
        sys.stdout, sys.stderr = RedactingStream.around(sys.stdout), RedactingStream.around(sys.stderr)
        try:
            return super().main(*args, **kwargs)
        finally:
            sys.stdout.flush()
            sys.stderr.flush()

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(SUBCOMMANDS)

    def get_command(self, ctx: click.Context, name: str) -> click.Command | None:
        if name not in SUBCOMMANDS:
            return None
        module, attr, _ = SUBCOMMANDS[name]
        try:
            return getattr(importlib.import_module(module), attr)
        except (ImportError, AttributeError) as exc:  # pragma: no cover - a packaging bug
            raise click.ClickException(f"subcommand {name!r} is unavailable: {exc}") from exc

    def invoke(self, ctx: click.Context) -> object:
        """A fault of the study storage (database down, corrupt SQLite page, disk full) is one line
        naming the root cause, not a traceback ending in optuna's misleading "invalid data"."""
        try:
            return super().invoke(ctx)
        except (click.exceptions.ClickException, click.exceptions.Exit, click.exceptions.Abort):
            raise
        except Exception as exc:
            from tuners.storage_errors import is_storage_error, one_line

            if is_storage_error(exc):
                raise click.ClickException(f"study storage: {one_line(exc)}") from None
            raise

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        rows = [(name, SUBCOMMANDS[name][2]) for name in self.list_commands(ctx)]
        with formatter.section("Commands"):
            formatter.write_dl(rows)


@click.group(cls=LazyGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="tierpilot")
@click.option("-v", "--verbose", is_flag=True,
              help="Also show the libraries' INFO logs (apscheduler, optuna, aiohttp, kubernetes...).")
def main(verbose: bool) -> None:
    """tierpilot: observability and autotuning for tiered KV caches in LLM serving.

    It watches vLLM (GPU prefix cache), LMCache (CPU offload) and Curvine (shared NVMe) across a
    fleet, exports one unified set of metrics, and tunes the tier settings as the workload shifts.
    """
    from agent.runtime.logs import quiet_libraries

    quiet_libraries(verbose)


if __name__ == "__main__":  # pragma: no cover
    main()
