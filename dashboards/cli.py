"""`tierpilot dashboards`: build the Grafana JSON and alert rules, or draw the overview as PNGs."""
from __future__ import annotations

import re
import time
from pathlib import Path

import click

from dashboards.settings import BuildSettings, SloSettings

_DURATION = re.compile(r"^(\d+)([smhd])$")
_SECONDS = {"s": 1, "m": 60, "h": 3600, "d": 86400}


def parse_duration(text: str) -> int:
    m = _DURATION.match(text.strip())
    if not m:
        raise click.BadParameter(f"{text!r} is not a duration such as 90s, 30m, 6h or 2d")
    return int(m.group(1)) * _SECONDS[m.group(2)]


@click.group()
def dashboards() -> None:
    """Grafana dashboards, Prometheus alert rules and PNG renderings of the tierpilot metrics.

    Dashboards and rules are declared in Python (dashboards/*.py) and rendered to committed files:
    dashboards/json/*.json (import into Grafana), dashboards/alerts/tierpilot.rules.yaml (plain
    Prometheus), deploy/prometheusrule/prometheusrule.yaml (Prometheus Operator) and the Helm
    chart's copies in deploy/helm/tierpilot/files/.
    """


@dashboards.command()
@click.option("--root", type=click.Path(file_okay=False, path_type=Path), default=None,
              help="Repository root to write under [default: this checkout].")
@click.option("--check", is_flag=True,
              help="Write nothing; exit 1 if any committed file differs from what the source renders.")
@click.option("--ttft-slo", type=float, default=None,
              help="TTFT target in seconds for the SLO quantile [default: 1.0].")
@click.option("--slo-objective", type=float, default=None,
              help="Share of good time slices promised [default: 0.99].")
@click.option("--runbook-base-url", default=None,
              help="URL where docs/runbooks.md is served; each alert links to an anchor in it.")
def build(root: Path | None, check: bool, ttft_slo: float | None, slo_objective: float | None,
          runbook_base_url: str | None) -> None:
    """Render dashboard JSON, the rules file and the PrometheusRule from the Python source."""
    from pydantic import ValidationError

    from dashboards import build as builder

    try:
        slo_changes = {k: v for k, v in (("ttft_seconds", ttft_slo), ("objective", slo_objective))
                       if v is not None}
        changes: dict[str, object] = {"slo": SloSettings(**slo_changes)}
        if runbook_base_url:
            changes["runbook_base_url"] = runbook_base_url
        settings = BuildSettings(**changes)
    except ValidationError as exc:  # one line per field, never pydantic's multi-line report
        raise click.UsageError("; ".join(f"{'.'.join(map(str, e['loc']))}: {e['msg']}"
                                         for e in exc.errors())) from None
    root = root or builder.REPO_ROOT
    if check:
        drift = builder.check(root, settings)
        for d in drift:
            click.echo(f"DRIFT {d.path}: {d.reason}", err=True)
        if drift:
            raise click.exceptions.Exit(1)
        click.echo(f"all {len(builder.render_all(settings))} generated files match the source")
        return
    from contracts.output_paths import OutputPathError, check_output_dir

    try:
        check_output_dir(root, "--root")
        written = builder.write(root, settings)
    except (OutputPathError, OSError) as exc:
        raise click.ClickException(f"--root {root}: {exc.strerror}: {exc.filename}"
                                   if isinstance(exc, OSError) and exc.strerror else str(exc)) from None
    for path in written:
        click.echo(f"wrote {root / path}")


@dashboards.command()
@click.option("--out", "out_dir", required=True, type=click.Path(file_okay=False, path_type=Path),
              help="Directory for the PNG files (created if missing).")
@click.option("--prometheus", "prometheus_url", default="http://127.0.0.1:9090", show_default=True,
              help="Base URL of a Prometheus that scrapes the tierpilot agent.")
@click.option("--since", default="1h", show_default=True, help="How far back to draw, e.g. 30m, 6h, 2d.")
@click.option("--end", "end_ts", type=float, default=None, help="End of the window, unix seconds [default: now].")
@click.option("--step", type=float, default=None, help="Query resolution in seconds [default: ~240 points].")
@click.option("--scrape-interval", type=float, default=15.0, show_default=True,
              help="Prometheus scrape interval of the agent; sets $__rate_interval as Grafana does.")
@click.option("--select", "selection", multiple=True, metavar="VAR=REGEX",
              help="Narrow a template variable (namespace, model, pod), e.g. --select model=llama.*")
def render(out_dir: Path, prometheus_url: str, since: str, end_ts: float | None, step: float | None,
           scrape_interval: float, selection: tuple[str, ...]) -> None:
    """Draw the Tiered cache overview panels as PNGs from a running Prometheus (query_range API).

    Writes one PNG per panel and a sheet with all of them (tierpilot-overview.png). Panels whose
    query fails or returns nothing are drawn as "no data" and listed at the end.
    """
    from dashboards import overview
    from dashboards.render import draw_dashboard, fetch_dashboard, without_data

    chosen: dict[str, str] = {}
    for item in selection:
        name, sep, value = item.partition("=")
        if not sep or name not in ("namespace", "model", "pod"):
            raise click.BadParameter(f"{item!r}: expected namespace=, model= or pod= followed by a regex",
                                     param_hint="--select")
        chosen[name] = value
    from contracts.output_paths import OutputPathError, check_output_dir

    try:
        check_output_dir(out_dir, "--out")
    except OutputPathError as exc:
        raise click.ClickException(str(exc)) from None
    end = end_ts or time.time()
    start = end - parse_duration(since)
    click.echo(f"querying {prometheus_url} for {since} ending {time.strftime('%H:%M:%S', time.localtime(end))}")
    from dashboards.source import PrometheusSource, SourceError

    source = PrometheusSource(prometheus_url)
    try:
        source.query_range("vector(1)", end - 60, end, 60)
    except SourceError as exc:
        raise click.ClickException(str(exc)) from exc
    dashboard = overview.build(BuildSettings())
    data = fetch_dashboard(dashboard, source, start, end, step=step, scrape_interval=scrape_interval,
                           selection=chosen)
    for p in draw_dashboard(dashboard, data, out_dir, start, end):
        click.echo(f"wrote {p}")
    empty = without_data(data)
    if empty:
        click.echo(f"{len(empty)} of {len(data)} panels have no data:")
        for title, why in empty:
            click.echo(f"  {title}: {' '.join(why.split())}")
    else:
        click.echo(f"all {len(data)} panels have data")
