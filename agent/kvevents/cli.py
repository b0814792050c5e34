"""`tierpilot kv-events`: watch vLLM KV-event streams and print block-level signals live."""
from __future__ import annotations

import time
import urllib.request
from typing import Any

import click
from prometheus_client.parser import text_string_to_metric_families
from pydantic import ValidationError
from rich.table import Table

from agent.kvevents.index import CAUSES
from agent.kvevents.manager import KvEventManager
from agent.kvevents.reach import unreachable
from agent.kvevents.settings import EndpointSpec, KvEventsSettings, SettingsError, one_line
from agent.kvevents.signals import KvSnapshot
from contracts.console_tables import count, table, table_console
from contracts.jsonsafe import dumps as json_dumps


def _pairs(values: tuple[str, ...], option: str) -> dict[str, str]:
    out = {}
    for v in values:
        pod, sep, addr = v.partition("=")
        if not sep or not pod or not addr:
            raise click.BadParameter(f"expected POD=ADDRESS, got {v!r}", param_hint=option)
        out[pod] = addr
    return out


def scrape_prompt_tokens(url: str, timeout: float = 2.0) -> float | None:
    """`vllm:prompt_tokens_total` summed over its series, from a vLLM /metrics URL."""
    with urllib.request.urlopen(url, timeout=timeout) as resp:
        text = resp.read(8 << 20).decode("utf-8", "replace")
    total = None
    for fam in text_string_to_metric_families(text):
        if fam.name == "vllm:prompt_tokens":
            for s in fam.samples:
                if s.name == "vllm:prompt_tokens_total":
                    total = (total or 0.0) + s.value
    return total


def _pct(part: float, whole: float) -> str:
    return f"{100.0 * part / whole:.1f}%" if whole else "-"


def render(snap: KvSnapshot, width: int | None = None) -> list[Table]:
    """Tables of one snapshot that fit the terminal (80 columns: counts abbreviated, never split):
    the streams' health per pod, the missed tokens' causes per pod, and one row per model."""
    streams = [(e.engine.key, count(e.stream.messages), count(sum(e.stored_blocks.values())),
                count(sum(e.removed_blocks.values())), count(e.stream.gaps), count(e.stream.lost_messages),
                count(e.stream.restarts), count(sum(e.stream.rejected.values()))) for e in snap.engines]
    causes = []
    for e in snap.engines:
        misses = sum(e.miss_tokens.values())
        causes.append((e.engine.key, *(_pct(e.miss_tokens[c], misses) for c in CAUSES),
                       count(e.external_hit_blocks),
                       "\n".join(f"{k}={count(v)}" for k, v in sorted(e.resident_blocks.items())) or "-"))
    models = [(m.model, "-" if m.overlap is None else f"{m.overlap.ratio:.3f}",
               "-" if m.overlap is None else count(m.overlap.prompt_tokens), count(m.duplicated_blocks),
               count(m.resident_hashes)) for m in snap.models]
    return [
        table("KV-event streams (messages; blocks stored and removed)",
              ("pod", "msgs", "stored", "removed", "gaps", "lost", "restarts", "rejected"), streams,
              text=("pod",), width=width),
        table("Missed tokens by cause (share of each pod's misses); LMCache hits and resident blocks",
              ("pod", *CAUSES, "ext hit blocks", "resident blocks"), causes, text=("pod",),
              left=("resident blocks",), width=width),
        table("Fleet (per model)", ("model", "overlap", "prompt tok (window)", "dup. blocks", "resident hashes"),
              models, text=("model",), width=width),
    ]


def snapshot_json(snap: KvSnapshot) -> dict[str, Any]:
    return {
        "taken_at": snap.taken_at,
        "engines": [{
            "pod": e.engine.pod, "model": e.engine.model, "dp_rank": e.engine.dp_rank,
            "messages": e.stream.messages, "gaps": e.stream.gaps, "lost": e.stream.lost_messages,
            "replayed": e.stream.replayed_messages, "restarts": e.stream.restarts,
            "rejected": dict(e.stream.rejected), "miss_tokens": dict(e.miss_tokens),
            "external_hit_tokens": e.external_hit_tokens, "resident_blocks": dict(e.resident_blocks),
        } for e in snap.engines],
        "models": [{
            "model": m.model, "duplicated_blocks": m.duplicated_blocks, "resident_hashes": m.resident_hashes,
            "overlap": None if m.overlap is None else m.overlap.ratio,
        } for m in snap.models],
    }


OPTION_OF = {"endpoint": "--endpoint", "replay_endpoint": "--replay", "model": "--model", "topic": "--topic",
             "dp_size": "--dp-size", "pod": "--endpoint"}


def option_errors(exc: ValidationError) -> str:
    """An endpoint built from the options, refused: one line per problem, named by its option."""
    parts = []
    for err in exc.errors():
        field = str(err["loc"][0]) if err["loc"] else ""
        msg = err["msg"].removeprefix("Value error, ")
        parts.append(f"{OPTION_OF.get(field, field)}: {msg}")
    return "; ".join(parts) or one_line(exc)


@click.command("kv-events")
@click.option("--endpoint", "endpoints", multiple=True, metavar="POD=tcp://HOST:PORT",
              help="A pod's KV-event PUB address (vLLM --kv-events-config endpoint). Repeatable.")
@click.option("--replay", "replays", multiple=True, metavar="POD=tcp://HOST:PORT",
              help="The pod's replay ROUTER address, used to catch up after a sequence gap.")
@click.option("--model", default="default", show_default=True, help="Model label for --endpoint pods.")
@click.option("--topic", default="", help="Topic prefix to subscribe to [default: all topics].")
@click.option("--dp-size", default=1, show_default=True, type=click.IntRange(1, 256),
              help="Data-parallel ranks per pod; rank r publishes on port + r.")
@click.option("--config", "config_path", type=click.Path(exists=True, dir_okay=False),
              help="YAML with KV-event settings (top-level or under `kv_events:`); see docs/kv-events.md.")
@click.option("--metrics", "metrics_urls", multiple=True, metavar="POD=http://HOST:PORT/metrics",
              help="The pod's vLLM /metrics, scraped for vllm:prompt_tokens_total so the overlap "
                   "signal can be computed.")
@click.option("--interval", default=5.0, show_default=True, type=click.FloatRange(0.1),
              help="Seconds between printed reports.")
@click.option("--duration", default=0.0, show_default=True, type=click.FloatRange(0.0),
              help="Stop after this many seconds (0: run until interrupted).")
@click.option("--format", "fmt", type=click.Choice(["table", "json"]), default="table", show_default=True,
              help="table: tables for the terminal; json: one JSON object per report.")
@click.option("--json", "as_json", is_flag=True, help="Same as --format json (an alias).")
def kv_events(endpoints: tuple[str, ...], replays: tuple[str, ...], model: str, topic: str, dp_size: int,
              config_path: str | None, metrics_urls: tuple[str, ...], interval: float, duration: float,
              fmt: str, as_json: bool) -> None:
    """Watch vLLM KV-event streams and print block-level workload signals.

    The agent connects to each pod's ZMQ PUB socket (it never binds), reads both payload encodings
    (positional arrays up to vLLM 0.23, maps from 0.24), tracks sequence numbers (gaps are replayed
    through --replay when given; a sequence drop means the engine restarted), and keeps a fleet block
    index. Each report shows, per pod, the split of missed tokens into cold (never seen in the fleet),
    capacity (evicted from this pod before) and routing (resident on another pod), external hits from
    LMCache, gaps, restarts and skipped input; and per model the workload overlap (needs --metrics),
    the blocks duplicated across pods and the resident hashes.

    Example: tierpilot kv-events --endpoint pod-a=tcp://10.0.0.5:5557 --replay pod-a=tcp://10.0.0.5:5558
    """
    as_json = as_json or fmt == "json"
    try:
        settings = KvEventsSettings.from_yaml(config_path) if config_path else KvEventsSettings()
        replay_map = _pairs(replays, "--replay")
        extra = [EndpointSpec(pod=pod, model=model, endpoint=addr, replay_endpoint=replay_map.get(pod),
                              topic=topic, dp_size=dp_size)
                 for pod, addr in _pairs(endpoints, "--endpoint").items()]
    except ValidationError as exc:  # an --endpoint/--replay value: one line naming the option
        raise click.ClickException(option_errors(exc)) from None
    except (SettingsError, ValueError) as exc:
        raise click.ClickException(" ".join(str(exc).split())) from None
    specs = (*settings.endpoints, *extra)
    if not specs:
        raise click.UsageError("no endpoints: give --endpoint POD=tcp://HOST:PORT or --config FILE")
    settings = settings.model_copy(update={"endpoints": specs})
    dead = [(s.pod, address, why) for s in specs for _, address, _ in s.engines()
            if (why := unreachable(address)) is not None]
    if dead and len(dead) == sum(len(s.engines()) for s in specs):
        raise click.ClickException(
            "no KV-event publisher answers: " + ", ".join(f"{pod} {addr} ({why})" for pod, addr, why in dead)
            + "; check the address against vLLM's --kv-events-config endpoint and that the engine runs")
    metrics = _pairs(metrics_urls, "--metrics")
    model_of = {s.pod: s.model for s in specs}
    console = table_console()
    manager = KvEventManager(settings)
    manager.start()
    console.print(f"watching {len(specs)} pod(s): " + ", ".join(f"{s.pod}={s.endpoint}" for s in specs))
    for pod, addr, why in dead:
        console.print(f"[yellow]warning: {pod}: nothing answers at {addr} ({why})[/yellow]")
    started = time.monotonic()
    try:
        while True:
            time.sleep(interval)
            for pod, url in metrics.items():
                try:
                    total = scrape_prompt_tokens(url)
                except OSError as exc:
                    console.print(f"[yellow]{pod}: cannot scrape {url}: {exc}[/yellow]")
                    continue
                if total is not None:
                    manager.observe_prompt_tokens(pod, model_of.get(pod, model), total)
            snap = manager.snapshot()
            if as_json:
                click.echo(json_dumps(snapshot_json(snap)))
            else:
                for table in render(snap):
                    console.print(table)
            if duration and time.monotonic() - started >= duration:
                break
    except KeyboardInterrupt:
        pass
    finally:
        manager.stop()
