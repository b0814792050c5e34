"""`tierpilot run` (the long-lived agent) and `tierpilot scrape-once` (one scrape, printed)."""
from __future__ import annotations

import logging
import sys
from pathlib import Path
from urllib.parse import urlsplit

import click

from agent.settings import SettingsError, load_settings
from contracts.console_tables import count, pct, table, table_console
from contracts.redact import redact_url
from contracts.tier_model import AUTO_ROLE, ROLES, Snapshot, Target, TierView


def _settings(config: Path | None, **overrides):
    try:
        return load_settings(config, **overrides)
    except SettingsError as exc:
        raise click.ClickException(" ".join(str(exc).split())) from None


@click.command("run")
@click.option("--config", "-c", type=click.Path(path_type=Path, dir_okay=False), default=None,
              help="Agent YAML config (sections: scrape, store, server, otel, tiers, targets, kv_events, "
                   "tuner, actuation, dry_run; see docs/agent.md). Every key can be overridden by "
                   "TIERPILOT_<SECTION>__<KEY> environment variables (e.g. TIERPILOT_SCRAPE__INTERVAL_S=5, "
                   "TIERPILOT_TUNER__ENABLED=true).")
@click.option("--dry-run", is_flag=True, default=False,
              help="Global dry-run: the tuner proposes, validates, logs and counts changes, and every "
                   "Kubernetes write is a server-side dry-run; nothing is changed. Same as dry_run: true "
                   "or TIERPILOT_DRY_RUN=true.")
@click.option("--host", default=None, help="Address for /metrics [default: from config, 0.0.0.0].")
@click.option("--port", type=int, default=None, help="Port for /metrics [default: from config, 9400].")
@click.option("--check-config", is_flag=True,
              help="Validate the config (and everything built from it: targets, actuation, KV events) "
                   "without starting anything; exit 0 if valid, else 1 with a one-line reason.")
def run(config: Path | None, dry_run: bool, host: str | None, port: int | None, check_config: bool) -> None:
    """Run the whole agent until SIGTERM or Ctrl-C.

    Always: discover targets (static list, targets file, Kubernetes label selectors), scrape them
    on a schedule, keep a rolling window of the unified tier model, serve it on /metrics and push
    it over OTLP when `otel.endpoint` is set.

    With `kv_events.enabled`: subscribe to every vLLM pod's KV-event stream (endpoints from the
    config or from tierpilot.io/kv-events-* pod annotations) and export the workload overlap,
    duplication and miss attribution.

    With `tuner.enabled`: detect workload drift, warm-start from the digital twin, and tune the
    cache tiers live through the guardrails (cooldown, hourly cap, statistical rollback) and the
    Kubernetes actuator (targets from `actuation.targets_file` or $TIERPILOT_K8S_TARGETS). Only
    the replica holding the Lease acts; a standby scrapes and exports only.

    The config is validated before anything starts; a bad key is one error naming it.

    \b
    Examples:
      tierpilot run --config agent.yaml --check-config   # validate, start nothing
      tierpilot run --config agent.yaml --dry-run --port 9401
    """
    server = {}
    if host is not None:
        server["host"] = host
    if port is not None:
        server["port"] = port
    settings = _settings(config)
    overrides: dict = {}
    if server:
        overrides["server"] = {**settings.server.model_dump(), **server}
    if dry_run:
        overrides["dry_run"] = True
    if overrides:
        settings = _settings(config, **overrides)
    logging.basicConfig(level=settings.log_level, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    from agent.runtime.assembly import build_runtime
    from agent.runtime.process import configure_process, freeze_startup

    configure_process()  # the allocator and the garbage collector (agent/runtime/process.py)
    try:
        runtime = build_runtime(settings)
    except (ValueError, OSError) as exc:
        raise click.ClickException(" ".join(str(exc).split())) from None
    freeze_startup()
    if not has_target_source(settings):  # the same warning whether checking or running
        click.echo("warning: no targets configured (targets.static, targets.file, targets.kubernetes.enabled "
                   "or source: prometheus); the agent serves only its own health metrics", err=True)
    if check_config:
        click.echo(f"{config or 'the built-in defaults'}: valid (" + ", ".join(_banner_parts(settings, runtime))
                   + ")")
        return
    from agent.runtime.lifecycle import AgentStartError

    try:  # the banner only once the port is ours
        runtime.run_forever(on_started=lambda: click.echo(
            "tierpilot agent: " + ", ".join(_banner_parts(settings, runtime)), err=True))
    except AgentStartError as exc:
        raise click.ClickException(str(exc)) from None
    click.echo("tierpilot agent stopped", err=True)


def _banner_parts(settings, runtime) -> list[str]:
    parts = [f"/metrics on {settings.server.host or '0.0.0.0'}:{settings.server.port}",
             f"scraping every {settings.scrape.interval_s:g}s"]
    if runtime.kv is not None:
        parts.append("KV events on")
    if runtime.tuning is not None:
        t = settings.tuner
        if t.mode == "shadow":
            mode = f" (SHADOW: plans as apply {t.apply} would, applies nothing)"
        elif settings.dry_run or runtime.actuator.settings.dry_run:
            mode = " (DRY-RUN)"
        else:
            mode = f" (apply: {t.apply})"
        parts.append(f"tuning every {t.step_interval_s:g}s" + mode
                     + (", leader election on" if runtime.elector is not None else ""))
    return parts


def has_target_source(settings) -> bool:
    """Whether anything can ever give the agent a target to read."""
    t = settings.targets
    return bool(t.static or t.file or t.kubernetes.enabled or settings.source == "prometheus")


def parse_target(spec: str) -> Target:
    """`URL`, `ROLE=URL` or `ROLE/POD=URL`; the pod defaults to the URL's host:port. Without a
    role (or with `auto`) the first scrape detects it from the payload."""
    role, pod, url = AUTO_ROLE, "", spec
    head, sep, tail = spec.partition("=")
    if sep and "://" not in head:
        url = tail
        role, _, pod = head.partition("/")
    if role not in (*ROLES, AUTO_ROLE):
        raise click.BadParameter(f"unknown role {role!r} in {spec!r}; valid: {', '.join((*ROLES, AUTO_ROLE))}")
    try:
        parts = urlsplit(url)
    except ValueError as exc:
        raise click.BadParameter(f"{redact_url(url)!r} is not a URL: {exc}") from None
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise click.BadParameter(f"{redact_url(url)!r} is not an http(s) URL")
    if not parts.path:
        url = url.rstrip("/") + "/metrics"
    # the default pod name is host:port, never the userinfo (read from the redacted URL, which
    # also hides a password whose raw "/" or "?" ends urlsplit's netloc early)
    host_port = urlsplit(redact_url(url)).netloc.rpartition("@")[2]
    return Target(url=url, role=role, pod=pod or host_port)  # type: ignore[arg-type]


def parse_selectors(specs: tuple[str, ...]) -> dict[str, str]:
    """`ROLE=MATCHER` (repeatable) -> {role: matcher}."""
    out: dict[str, str] = {}
    for spec in specs:
        role, sep, matcher = spec.partition("=")
        if not sep or not matcher.strip():
            raise click.BadParameter(f"{spec!r}: expected ROLE=MATCHER, e.g. vllm='job=\"vllm\"'")
        if role not in ROLES:
            raise click.BadParameter(f"unknown role {role!r} in {spec!r}; valid: {', '.join(ROLES)}")
        out[role] = matcher.strip()
    return out


@click.command("scrape-once")
@click.option("--target", "-t", "targets", multiple=True, metavar="[ROLE[/POD]=]URL",
              help="A /metrics URL; repeat for several. Prefix with a role (vllm, lmcache, curvine-master, "
                   "curvine-worker, curvine-fuse, router; default: detected from the payload) and optionally a "
                   "pod name, e.g. curvine-fuse/vllm-0=http://10.0.0.5:9003/metrics.")
@click.option("--format", "fmt", type=click.Choice(["table", "json", "prometheus"]), default="table",
              show_default=True, help="prometheus prints exactly what the agent's /metrics would serve.")
@click.option("--json", "as_json", is_flag=True, help="Same as --format json (an alias).")
@click.option("--config", "-c", type=click.Path(path_type=Path, dir_okay=False), default=None,
              help="Optional agent config (timeouts, KV bytes per token, extra mappings).")
@click.option("--timeout", type=float, default=None, help="Per-target (or per-query) timeout in seconds.")
@click.option("--from-prometheus", "prom_url", metavar="URL", default=None,
              help="Read the series from this Prometheus-compatible query API (Prometheus, Thanos, Mimir, "
                   "VictoriaMetrics; the prefix before /api/v1) instead of scraping: lifetime totals, and "
                   "ratios and quantiles over the config's store.window_s (or the part of it Prometheus "
                   "holds; the table says which). Pods come from the `pod` label (else `instance`).")
@click.option("--selector", "selectors", multiple=True, metavar="ROLE=MATCHER",
              help='With --from-prometheus: the series of ROLE, e.g. vllm=\'job="vllm"\'; repeat per role. '
                   "Default: every series, role from the `job` label or the metric name.")
def scrape_once(targets: tuple[str, ...], fmt: str, as_json: bool, config: Path | None, timeout: float | None,
                prom_url: str | None, selectors: tuple[str, ...]) -> None:
    """Scrape the targets once (or read them from Prometheus) and print the unified tier view.

    With a single scrape, ratios come from the counters' lifetime totals. A target given without a
    role gets the one its payload shows (vLLM, LMCache in-process or MP, Curvine master/worker/FUSE,
    production-stack or vllm-project router); a target that yields no mapped series is reported
    with a warning on stderr naming what was seen. Exits 1 when no target answered, or when none
    fed a signal.

    \b
    Examples:
      tierpilot scrape-once --target vllm/pod-a=http://127.0.0.1:8000/metrics --format table
      tierpilot scrape-once -t http://10.0.0.5:8000/metrics -t curvine-fuse/pod-a=http://10.0.0.5:9003/metrics
      tierpilot scrape-once --from-prometheus http://prometheus:9090 --selector vllm='job="vllm"' --format json
    """
    from agent.collect.discovery import StaticTargets
    from agent.runtime.app import Agent
    from agent.runtime.payloads import snapshot_json

    if as_json:
        fmt = "json"
    if not targets and not prom_url:
        raise click.UsageError("give --target URL (repeatable) or --from-prometheus URL")
    if targets and prom_url:
        raise click.UsageError("--target and --from-prometheus exclude each other")
    if selectors and not prom_url:
        raise click.UsageError("--selector needs --from-prometheus")
    parsed = [parse_target(t) for t in targets]
    settings = _settings(config)
    if timeout is not None:
        settings = _settings(config, scrape={**settings.scrape.model_dump(), "timeout_s": timeout})
    if prom_url:
        prom = {**settings.prometheus.model_dump(exclude_none=True), "url": prom_url, "backfill": True,
                "roles": parse_selectors(selectors)}
        if timeout is not None:
            prom["timeout_s"] = timeout
        settings = _settings(config, scrape=settings.scrape.model_dump(), source="prometheus", prometheus=prom)
    agent = Agent(settings, StaticTargets(parsed))
    snap = agent.scrape_now()
    if fmt == "json":
        click.echo(snapshot_json(snap))
    elif fmt == "prometheus":
        click.echo(agent.metrics_text(), nl=False)
    else:
        render_table(snap, window=stored_span(agent.store.frame()["ts"]) if prom_url else None)
    for st in snap.targets:
        for reason, detail in st.warnings:
            click.echo(f"warning: {st.target.key} ({st.target.role}): {reason}: {detail}", err=True)
    if not any(st.up for st in snap.targets):
        if prom_url:
            why = next((st.detail or st.reason for st in snap.targets if st.reason), "no series")
            click.echo(f"error: {redact_url(prom_url)}: {why}", err=True)
        sys.exit(1)
    if not prom_url and not any(st.up and not any(r == "no_mapped_series" for r, _ in st.warnings)
                                for st in snap.targets):
        click.echo("error: no target fed a tierpilot signal (see the warnings above); check the URLs and roles",
                   err=True)
        sys.exit(1)


def stored_span(ts) -> str | None:
    """What the window store's ratios are over, from its sample times: "the last 287 s", or None
    when it holds one instant (ratios then come from lifetime totals)."""
    if ts.len() == 0:
        return None
    span = float(ts.max() - ts.min())
    return f"the last {span:.0f} s" if span >= 1 else None


def _evicted(t: TierView) -> str:
    """Evictions with their unit, one unit a line; unlike units side by side, never added."""
    parts = [f"{count(v)} {unit}" for unit, v in (("chunks", t.evicted_chunks), ("files", t.evicted_files))
             if v is not None]
    if t.evicted_bytes is not None:
        parts.append(f"{t.evicted_bytes / 2**30:,.1f} GiB")
    return "\n".join(parts) or "-"


def render_table(snap: Snapshot, *, window: str | None = None, console: object = None) -> None:
    """The unified view as tables that fit the terminal (80 columns: numbers and names whole, only
    URLs, notes and pod names fold; contracts/console_tables.py).
    Tables without rows are left out. `window`: what ratios and quantiles are over ("the last 300 s");
    None for a single scrape, where they come from lifetime totals."""
    ratios = f"ratios over {window}" if window else "one scrape: ratios from lifetime totals"
    quantiles = f"over {window}" if window else "one scrape: from lifetime buckets"

    out = console if console is not None else table_console()
    target_rows = []
    for st in snap.targets:
        note = st.reason + (f" ({st.detail})" if st.detail else "")
        note = "; ".join([note] * bool(note) + [reason for reason, _ in st.warnings])
        target_rows.append((st.target.key, st.target.role, st.target.pod, "yes" if st.up else "NO",
                            f"{st.duration_s:.3f}", note or "-"))
    tables = [table("Targets (last attempt)", ("target", "role", "pod", "up", "time (s)", "note"), target_rows,
                    text=("target", "pod", "note"), left=("role", "up"))]
    groups: dict[tuple[str, str], list[TierView]] = {}
    for t in snap.tiers:
        groups.setdefault((t.pod, t.model), []).append(t)
    for (pod, model), views in groups.items():
        rows = [(t.tier, t.source, count(t.lookup_tokens), count(t.hit_tokens), pct(t.hit_ratio),
                 pct(t.cumulative_hit_ratio), _evicted(t), pct(t.usage_ratio)) for t in views]
        tables.append(table(f"Tiers of {pod}{f' ({model})' if model else ''}: token counts are lifetime "
                            f"totals; {ratios}",
                            ("tier", "source", "lookup tok", "hit tok", "hit ratio", "cumul.", "evicted", "usage"),
                            rows, left=("source",)))
    pod_rows = []
    for p in snap.pods:
        q = p.ttft_quantiles
        pod_rows.append((p.pod + (f"\n{p.model}" if p.model else ""), count(p.prompt_tokens), count(p.requests),
                         *(f"{q[x] * 1000:.1f}" if x in q else "-" for x in (0.5, 0.95, 0.99)),
                         count(p.l2_break_even_tokens)))
    tables.append(table(f"Traffic (lifetime totals) and TTFT ({quantiles})",
                        ("pod / model", "prompt tok", "requests", "TTFT p50 (ms)", "p95 (ms)", "p99 (ms)",
                         "L2 break-even tok"), pod_rows, text=("pod / model",)))
    io_rows = [(x.pod, x.op, *(f"{x.quantiles[q] * 1000:.2f}" if q in x.quantiles else "-"
                               for q in (0.5, 0.95, 0.99))) for x in snap.l2_io]
    tables.append(table(f"L2 I/O latency ({quantiles})", ("pod", "op", "p50 (ms)", "p95 (ms)", "p99 (ms)"), io_rows,
                        text=("pod",), left=("op",)))
    read_rows = [(t.pod, t.tier, t.source, f"{t.read_seconds:,.2f}", f"{t.read_latency_seconds * 1000:.2f}")
                 for t in snap.tiers if t.read_seconds is not None and t.read_latency_seconds is not None]
    tables.append(table(f"Tier reads into the tier above: time is a lifetime total, per chunk the mean "
                        f"{f'over {window}' if window else 'of the lifetime totals'}",
                        ("pod", "tier", "source", "time (s)", "per chunk (ms)"), read_rows,
                        text=("pod",), left=("tier", "source")))
    for t in tables:
        if t.row_count:
            out.print(t)  # type: ignore[attr-defined]
