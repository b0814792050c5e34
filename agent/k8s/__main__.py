"""`python -m agent.k8s`: operate the Kubernetes actuator by hand (same code path as the agent).

    python -m agent.k8s check   deploy/overlays/plain-vllm/targets.yaml
    python -m agent.k8s check   --targets deploy/overlays/plain-vllm/targets.yaml --config best.yaml
    python -m agent.k8s current deploy/overlays/plain-vllm/targets.yaml
    python -m agent.k8s diff    deploy/overlays/plain-vllm/targets.yaml best.yaml
    python -m agent.k8s apply   deploy/overlays/plain-vllm/targets.yaml best.yaml --dry-run
    python -m agent.k8s rollback deploy/overlays/plain-vllm/targets.yaml
    python -m agent.k8s apply-proposal deploy/overlays/plain-vllm/targets.yaml --agent http://127.0.0.1:9400
"""
from __future__ import annotations

import sys
from pathlib import Path

import click
import yaml

from agent.k8s.actuator import KubernetesActuator
from agent.k8s.mapping import load_mappings
from agent.k8s.rbac import required_rules
from agent.k8s.settings import ActuationConfigError, load_settings
from contracts.actuator import ActuationError
from contracts.knobs import KnobError, Knobs

TARGETS = click.argument("targets", type=click.Path(exists=True, dir_okay=False, path_type=Path))


def _actuator(targets: Path, dry_run: bool = False) -> KubernetesActuator:
    from agent.k8s.wiring import build_actuator, load_api_client

    cluster = _cluster_options()
    overrides: dict = {"dry_run": True} if dry_run else {}
    if cluster.get("namespace"):
        overrides["namespace"] = cluster["namespace"]
    settings = load_settings(targets, **overrides)
    return build_actuator(load_api_client(cluster.get("kubeconfig"), context=cluster.get("context")), settings,
                          on_progress=lambda m: click.echo(f"  {m}", err=True))


def _cluster_options() -> dict:
    """--kubeconfig, -n/--namespace and --context, given before or after the subcommand (after wins)."""
    ctx = click.get_current_context()
    merged = dict((ctx.parent.obj if ctx.parent is not None else None) or {})
    merged.update({k: v for k, v in (ctx.obj or {}).items() if v is not None})
    return merged


KUBECONFIG_HELP = "Kubeconfig file [default: in-cluster service account, else $KUBECONFIG or ~/.kube/config]."
NAMESPACE_HELP = "Namespace of the targets that name none [default: the targets file's `namespace`]."
CONTEXT_HELP = "Kubeconfig context to use [default: its current-context]."


def cluster_options(fn):
    """The cluster options on a subcommand too, so `tierpilot k8s current --kubeconfig X` works."""
    def keep(ctx: click.Context, param: click.Parameter, value: object) -> object:
        if value is not None:
            ctx.ensure_object(dict)[param.name] = value
        return value

    for option in reversed((
        click.option("--kubeconfig", type=click.Path(exists=True, dir_okay=False), expose_value=False,
                     callback=keep, help=KUBECONFIG_HELP),
        click.option("-n", "--namespace", expose_value=False, callback=keep, help=NAMESPACE_HELP),
        click.option("--context", expose_value=False, callback=keep, help=CONTEXT_HELP),
    )):
        fn = option(fn)
    return fn


def one_line(exc: BaseException) -> str:
    """The error as one line (API errors and kubeconfig problems can span many)."""
    text = " ".join(str(exc).split()) or type(exc).__name__
    return text if len(text) <= 400 else text[:397] + "..."


class _OneLineErrors(click.Group):
    """Every known failure of a subcommand is `Error: <one line>` and exit 1, never a traceback,
    also when run as `tierpilot k8s` (where `run()` below is not the entry point)."""

    def invoke(self, ctx: click.Context) -> object:
        from agent.k8s.wiring import KubeconfigError

        try:
            return super().invoke(ctx)
        except (ActuationError, ActuationConfigError, KnobError, KubeconfigError) as exc:
            raise click.ClickException(one_line(exc)) from None


@click.group(cls=_OneLineErrors, context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--kubeconfig", type=click.Path(exists=True, dir_okay=False), default=None, help=KUBECONFIG_HELP)
@click.option("-n", "--namespace", default=None, help=NAMESPACE_HELP)
@click.option("--context", default=None, help=CONTEXT_HELP)
@click.pass_context
def main(ctx: click.Context, kubeconfig: str | None, namespace: str | None, context: str | None) -> None:
    """Apply tuned KV-cache knobs to a cluster: vLLM Deployment env, LMCache / router / Curvine
    ConfigMaps, HyperPod InferenceEndpointConfig. TARGETS is the actuator's targets YAML (see
    docs/deploy.md). Uses the in-cluster service account, or your kubeconfig. The cluster options
    (--kubeconfig, -n/--namespace, --context) go before or after the subcommand.

    \b
    Examples:
      tierpilot k8s check deploy/overlays/plain-vllm/targets.yaml --config best.yaml
      tierpilot k8s current deploy/overlays/plain-vllm/targets.yaml --kubeconfig ~/.kube/prod -n llm
      tierpilot k8s diff deploy/overlays/plain-vllm/targets.yaml best.yaml --context prod
      tierpilot k8s apply deploy/overlays/plain-vllm/targets.yaml best.yaml --dry-run
      tierpilot k8s apply-proposal deploy/overlays/plain-vllm/targets.yaml --agent http://127.0.0.1:9400
    """
    ctx.ensure_object(dict).update(kubeconfig=kubeconfig, namespace=namespace, context=context)


FILE = click.Path(exists=True, dir_okay=False, path_type=Path)


@main.command()
@click.argument("targets_arg", metavar="[TARGETS]", required=False, type=FILE)
@click.option("--targets", "targets_opt", type=FILE, help="The targets YAML (same as the TARGETS argument).")
@click.option("--config", type=FILE,
              help="A knobs YAML (e.g. the tuner's best.yaml) to validate against the targets, offline: "
                   "each value a target cannot express is listed with the reason; exit 1 if any.")
@click.option("--apply", "apply_scope", type=click.Choice(["none", "hot", "all"]), default="all", show_default=True,
              help="The Role rules for a tuner with this tuner.apply (hot: patch only on the router's targets; "
                   "none: get only, as in shadow mode).")
def check(targets_arg: Path | None, targets_opt: Path | None, config: Path | None, apply_scope: str) -> None:
    """Validate TARGETS offline; print the tunable knobs, the values they accept and the Role rules
    they need. With --config, say whether `apply` would accept that configuration."""
    from agent.k8s.offline import acceptance, refusals

    if (targets_arg is None) == (targets_opt is None):
        raise click.UsageError("give the targets file once: TARGETS or --targets FILE")
    targets = targets_arg or targets_opt
    assert targets is not None
    settings = load_settings(targets)
    maps = load_mappings()
    if config is not None:
        knobs = Knobs.from_yaml_file(config)
        refused = refusals(settings, maps, knobs)
        for line in refused:
            click.echo(f"refused: {line}")
        if refused:
            raise click.ClickException(f"{config}: {len(refused)} value(s) the targets in {targets} refuse")
        click.echo(f"{config}: every value is accepted by the targets in {targets}")
        return
    for t in settings.targets:
        m = maps[t.kind]
        click.echo(f"{t.kind:18s} {settings.ns(t)}/{t.name}: {', '.join(t.knobs or m.knobs)} ({m.takes_effect})")
    acc = acceptance(settings, maps)
    for knob, values in acc.accepts.items():
        click.echo(f"  {knob}: {', '.join(map(str, values)) if values is not None else 'any number'}")
    click.echo(yaml.safe_dump({"rules": required_rules(settings, writes=apply_scope)}, sort_keys=False), nl=False)


@main.command()
@TARGETS
@cluster_options
def current(targets: Path) -> None:
    """Print the knobs the targets run now, as a config YAML."""
    act = _actuator(targets)
    click.echo(act.current().to_yaml(), nl=False)
    good = act.last_good()
    click.echo(f"# last good: {good.to_dict() if good else 'none marked'}", err=True)


@main.command()
@TARGETS
@click.argument("config", type=click.Path(exists=True, dir_okay=False, path_type=Path))
@cluster_options
def diff(targets: Path, config: Path) -> None:
    """Show what `apply TARGETS CONFIG` would change, changing nothing: each knob whose value
    differs from what the targets run now, the objects it is written to and whether they restart."""
    knobs = Knobs.from_yaml_file(config)
    act = _actuator(targets)
    _print_diff(act, knobs, str(config), "; `apply` makes the change, `apply --dry-run` validates it server-side")


def _print_diff(act: KubernetesActuator, knobs: Knobs, source: str, then: str = "") -> tuple[int, int]:
    """Print the refusals and each knob that would change with its objects (`diff`'s lines);
    (knobs that would change (0 after a `no change` line), values refused)."""
    from agent.k8s.offline import refusals

    refused = refusals(act.settings, load_mappings(), knobs)
    for line in refused:
        click.echo(f"refused: {line}")
    changes = act.current().diff(knobs)
    if not changes:
        click.echo(f"no change: the targets already run every value of {source}")
        return 0, len(refused)
    for knob, (now, new) in changes.items():
        click.echo(f"{knob}: {now} -> {new}")
        for t in act.active:
            if knob in t.knobs:
                click.echo(f"  {t.where} (takes effect by {t.mapping.takes_effect})")
    click.echo(f"{len(changes)} knob(s) would change{then}")
    return len(changes), len(refused)


@main.command()
@TARGETS
@click.argument("config", type=click.Path(exists=True, dir_okay=False, path_type=Path))
@cluster_options
@click.option("--dry-run", is_flag=True, help="Server-side dry-run: validate everything, store nothing.")
@click.option("--mark-good", is_flag=True, help="After a successful rollout, record CONFIG as the last good one.")
def apply(targets: Path, config: Path, dry_run: bool, mark_good: bool) -> None:
    """Apply CONFIG (a knobs YAML, e.g. the tuner's best.yaml) and wait for the rollout."""
    act = _actuator(targets, dry_run)
    result = act.apply(Knobs.from_yaml_file(config), dry_run=dry_run)
    click.echo(result.message)
    for name in result.restarted:
        click.echo(f"  restarts {name}")
    if mark_good and not result.dry_run:  # applied, or already running
        act.mark_good(result.knobs)


@main.command("apply-proposal")
@TARGETS
@click.argument("proposal_id", metavar="[ID]", required=False)
@click.option("--agent", "agent_url", default=None, metavar="URL",
              help="The agent's base URL; its /proposals is read [default: http://127.0.0.1:9400].")
@click.option("--file", "file", type=FILE, default=None,
              help="A proposals file the agent writes (tuner.proposals_file), instead of --agent.")
@cluster_options
@click.option("--dry-run", is_flag=True, help="Server-side dry-run: validate everything, store nothing.")
@click.option("--yes", is_flag=True, help="Apply without asking (the diff is printed first either way).")
@click.option("--diff", "diff_only", is_flag=True, help="Print the proposal and its diff, change nothing.")
def apply_proposal(targets: Path, proposal_id: str | None, agent_url: str | None, file: Path | None,
                   dry_run: bool, yes: bool, diff_only: bool) -> None:
    """Apply a change the tuner proposed but did not make (tuner.apply: a restart-requiring move
    under `hot`, or any move under `none`). ID is the proposal's id or a unique prefix [default: the
    newest]. Prints the proposal's plan line and the diff, refuses if the cluster no longer runs
    the configuration the proposal was made from, then applies it through the actuator and waits
    for the rollout (pods restart).

    \b
    Examples:
      tierpilot k8s apply-proposal deploy/overlays/plain-vllm/targets.yaml --agent http://127.0.0.1:9400
      tierpilot k8s apply-proposal targets.yaml 3f9c0e1a2b --file /var/lib/tierpilot/proposals.json --yes
      tierpilot k8s apply-proposal targets.yaml --agent http://127.0.0.1:9400 --diff
    """
    from tuners.proposals import load_proposals, pick

    if agent_url is not None and file is not None:
        raise click.UsageError("give --agent URL or --file PATH, not both")
    source, doc = _proposals_doc(agent_url, file)
    try:
        chosen = pick(load_proposals(doc, source=source), proposal_id, source=source)
    except ValueError as exc:
        raise click.ClickException(str(exc)) from None
    click.echo(chosen.describe())
    act = _actuator(targets, dry_run)
    running = act.current()
    if running != chosen.current and running != chosen.knobs:
        moved = ", ".join(f"{k} {a} -> {b}" for k, (a, b) in chosen.current.diff(running).items())
        raise click.ClickException(f"proposal {chosen.id} was made from another configuration: the cluster has "
                                   f"changed since ({moved}); wait for the agent's next plan")
    changes, refused = _print_diff(act, chosen.knobs, f"proposal {chosen.id}")
    if refused:
        raise click.ClickException(f"proposal {chosen.id}: {refused} value(s) the targets refuse")
    if not changes or diff_only:
        return
    if not (yes or dry_run) and not click.confirm("apply it now (the listed objects roll)?", default=False):
        raise click.ClickException("not applied")
    result = act.apply(chosen.knobs, dry_run=dry_run)
    click.echo(result.message)
    for name in result.restarted:
        click.echo(f"  restarts {name}")


def _proposals_doc(agent_url: str | None, file: Path | None) -> tuple[str, object]:
    """(where it came from, the parsed JSON) of the agent's /proposals or a proposals file."""
    import json
    import urllib.error
    import urllib.request

    if file is not None:
        try:
            return str(file), json.loads(file.read_text())
        except (OSError, ValueError) as exc:
            raise click.ClickException(f"{file}: cannot read proposals: {exc}") from None
    url = (agent_url or "http://127.0.0.1:9400").rstrip("/")
    url = url if url.endswith("/proposals") else url + "/proposals"
    try:
        with urllib.request.urlopen(url, timeout=10) as resp:
            return url, json.loads(resp.read())
    except (urllib.error.URLError, OSError, ValueError) as exc:
        reason = getattr(exc, "reason", exc)
        raise click.ClickException(f"{url}: cannot read proposals: {reason}") from None


@main.command()
@TARGETS
@cluster_options
def rollback(targets: Path) -> None:
    """Restore the last good configuration exactly."""
    click.echo(_actuator(targets).rollback().message)


def run() -> int:
    try:
        main.main(standalone_mode=False)
    except click.ClickException as exc:
        exc.show()
        return exc.exit_code
    return 0


if __name__ == "__main__":
    sys.exit(run())
