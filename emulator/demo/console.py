"""The demo's live console view (rich): tier hit ratios, TTFT p95, current configuration and
the latest tuner events, redrawn from the `Recorder` a few times a second."""
from __future__ import annotations

import contextlib
import logging
import math
from collections.abc import Callable, Iterator

from rich import box
from rich.console import Console, Group
from rich.table import Table
from rich.text import Text

from contracts.knobs import Knobs
from emulator.cluster.timeline import TIERS, Recorder

EVENT_COLOURS = {"drift": "yellow", "apply": "green", "rollback": "red", "trial": "cyan", "phase": "magenta",
                 "keep": "green", "error": "bold red", "info": "white"}


STATE_LABELS = {"improved": "kept as the last good configuration", "told": "measured, not better",
                "rolled_back": "regressed, rolled back", "drift": ""}  # a drift event's kind says it


def event_text(state: str, trial: int | None, message: str) -> str:
    """The text of a tuner event (its kind is printed before it): `trial 3: regressed, rolled back:
    p95 +41%`, or for a drift alarm only what moved (`prompt_tokens_mean down`)."""
    label = STATE_LABELS.get(state, state.replace("_", " "))
    head = (f"trial {trial}: " if trial is not None else "") + label
    return f"{head}: {message}" if head and message else head or message


def _pct(v: float | None) -> str:
    return "  -  " if v is None or not math.isfinite(v) else f"{v * 100:5.1f}%"


def _ms(v: float | None) -> str:
    return "-" if v is None or not math.isfinite(v) else f"{v * 1000:.0f} ms"


def render_view(recorder: Recorder, *, knobs: Knobs, status: str, wall_s: float, duration_s: float,
                agent_url: str, max_events: int = 8) -> Group:
    """One frame of the console view (pure: recorder state in, renderables out)."""
    point = recorder.timeline[-1] if recorder.timeline else None
    head = Text.assemble(("tierpilot demo", "bold"), f"  {status}  ",
                         (f"{wall_s:4.0f}/{duration_s:.0f} s", "dim"),
                         (f"  cluster {point.trace_s / 60:4.1f} min" if point else "", "dim"),
                         (f"  phase {point.phase + 1}" if point else "", "magenta"),
                         (f"  {agent_url}", "dim"))
    # Like with like: the agent's values are per pod over its window, averaged over pods here, so
    # "truth" is the same aggregate of each pod's truth over the same window; "fleet" is the
    # token-weighted fleet truth over the recorder's (longer) sliding window.
    tiers = Table(title="KV-cache tiers (mean over pods, agent window)", expand=True, box=box.SIMPLE_HEAD,
                  padding=(0, 1))
    tiers.add_column("signal", no_wrap=True)
    tiers.add_column("truth", justify="right")
    tiers.add_column("agent", justify="right")
    tiers.add_column("fleet", justify="right", style="dim")
    if point:
        like = point.truth_like_agent
        for tier in TIERS:
            tiers.add_row(f"{tier.upper()} hit ratio", _pct(like.get(tier)),
                          _pct(point.agent_tier_hit_ratios.get(tier)), _pct(point.stats.hit_ratio[tier]))
        tiers.add_row("cumulative hit", _pct(like.get("cumulative")), _pct(point.agent_cumulative_hit_ratio),
                      _pct(point.stats.cumulative_hit_ratio))
        tiers.add_row("TTFT p95", _ms(like.get("ttft_p95")), _ms(point.agent_ttft_p95_s),
                      _ms(point.stats.ttft_p95_s))
        tiers.add_row("TTFT p50", "", "", _ms(point.stats.ttft_p50_s))
    config = Table(title="current configuration", expand=True, show_header=False, box=box.SIMPLE,
                   padding=(0, 1))
    config.add_column("knob", no_wrap=True)
    config.add_column("value", justify="right", min_width=10, no_wrap=True)
    for k, v in knobs.to_dict().items():
        config.add_row(k, str(v))
    events = Table(title="latest tuner events", expand=True, show_header=False, box=box.SIMPLE, padding=(0, 1))
    events.add_column("t", justify="right", style="dim", min_width=8, no_wrap=True)
    events.add_column("kind", min_width=8, no_wrap=True)
    events.add_column("event", no_wrap=True, overflow="ellipsis", ratio=1)
    for ev in recorder.latest_events(max_events):
        events.add_row(f"{ev.trace_s / 60:.1f} min", Text(ev.kind, style=EVENT_COLOURS.get(ev.kind, "white")),
                       ev.message)
    grid = Table.grid(expand=True)
    grid.add_column(ratio=1)
    grid.add_column(ratio=1)
    grid.add_row(tiers, config)
    return Group(head, grid, events)


ViewFn = Callable[[], Group]


def endpoint_lines(cluster, publishers) -> list[str]:
    """Every emulated endpoint, so that it can be scraped by hand (`tierpilot scrape-once`)."""
    lines = []
    for name, pod in cluster.pods.items():
        pub = publishers[name]
        lines.append(f"  {name}: vLLM+LMCache {pod.vllm_endpoint.url}  Curvine FUSE {pod.fuse_endpoint.url}  "
                     f"KV events {pub.endpoint} (replay {pub.replay_endpoint})")
    lines.append(f"  curvine-master: {cluster.master_endpoint.url}")
    return lines


def progress_line(wall_s: float, duration_s: float, phase: int, label: str, served: int, status: str) -> str:
    """One progress line for runs without the live view."""
    return f"[{wall_s:5.0f} s / {duration_s:g} s] phase {phase + 1} ({label}): {served} requests served; {status}"


@contextlib.contextmanager
def logs_above_live_view(console: Console) -> Iterator[None]:
    """While the live view runs, log records go through the view's console (printed above the
    view, which redraws below them) instead of raw stderr writes that tear it apart."""
    from rich.logging import RichHandler

    root = logging.getLogger()
    saved = root.handlers[:]
    handler = RichHandler(console=console, show_path=False, show_time=False, markup=False)
    handler.setLevel(min((h.level for h in saved), default=logging.WARNING) or logging.WARNING)
    root.handlers = [handler]
    try:
        yield
    finally:
        root.handlers = saved


class Renderable:
    """A view redrawn from `fn` on every refresh of rich's Live."""

    def __init__(self, fn: Callable[[], Group]) -> None:
        self.fn = fn

    def __rich__(self) -> Group:
        return self.fn()
