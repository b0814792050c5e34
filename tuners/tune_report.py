"""What `tierpilot tune` prints and writes once a search has run: the best configuration against
the defaults, why the CPU tier may score nothing, the Pareto front, and the best configuration as YAML."""
from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import click

from contracts.output_paths import write_output
from tuners.objective import Evaluation, ObjectiveSpec


def knob_line(k: object) -> str:
    d = k.to_dict()  # type: ignore[attr-defined]
    return " ".join(f"{key}={value}" for key, value in d.items())


def cpu_tier_note(best: Any, defaults: Any, cluster: Any) -> str | None:
    """Why the CPU tier shows (almost) no hits when the search drops it: in the twin, as in LMCache's
    write-through store, every chunk the GPU stores goes to the CPU buffer too, both kept by
    recency; a CPU buffer no larger than the GPU prefix cache holds only chunks the GPU still
    has, and the CPU is looked up only after the GPU prefix missed. None when it does not apply."""
    if best.cpu_gib > 0 or defaults.cpu_gib <= 0 or defaults.cpu_eviction != "lru":
        return None
    caps = cluster.capacities(defaults)
    if caps.cpu_tokens > caps.gpu_tokens:
        return None
    return (f"note: cpu_gib {defaults.cpu_gib:g} -> 0: a {defaults.cpu_gib:g} GiB CPU buffer holds "
            f"{caps.cpu_tokens:,} tokens per pod, no more than the GPU prefix cache's {caps.gpu_tokens:,}. "
            f"Every chunk the GPU stores is written to the CPU buffer too (LMCache write-through) and both "
            f"evict the least recently used, so the chunks it keeps are still on the GPU and a lookup that misses the GPU misses it too: "
            f"the CPU tier scores 0 hits and its memory buys nothing. A CPU buffer pays only beyond "
            f"{caps.gpu_tokens * caps.kv_bytes_per_token / 2**30:,.1f} GiB (the GPU pool's size).")


def print_comparison(best_knobs: object, best: Evaluation, default_knobs: object, defaults: Evaluation,
                     objective: ObjectiveSpec) -> None:
    from contracts.console_tables import table, table_console

    out = []
    rows = [
        ("TTFT p95 (s)", defaults.ttft_p95_s, best.ttft_p95_s, "{:.3f}"),
        ("TTFT p50 (s)", defaults.ttft_p50_s, best.ttft_p50_s, "{:.3f}"),
        ("hit ratio", defaults.hit_ratio, best.hit_ratio, "{:.3f}"),
        ("CPU memory (GiB, fleet)", defaults.memory_gib, best.memory_gib, "{:.1f}"),
    ]
    if not objective.multi:
        rows.append((f"objective (s, {objective.memory_ms_per_gib:g} ms/GiB)", objective.values(defaults)[0],
                     objective.values(best)[0], "{:.3f}"))
    for label, a, b, fmt in rows:
        out.append((label, fmt.format(a), fmt.format(b), f"{b / a:.2f}x" if a else "-"))
    dk, bk = default_knobs.to_dict(), best_knobs.to_dict()  # type: ignore[attr-defined]
    for key in dk:
        out.append((key, str(dk[key]), str(bk[key]), "" if dk[key] == bk[key] else "*"))
    table_console().print(table("best configuration vs defaults (twin replay)", ("", "defaults", "best", "change"), out,
                          text=("",)))


def print_pareto(pareto: list[Any], metric: str) -> None:
    """The first 15 configurations of a multi-objective study's Pareto front, one a line."""
    click.echo(f"\nPareto front ({len(pareto)} configurations):")
    for rec in pareto[:15]:
        ttft, hit, mem = rec.values or (math.nan,) * 3
        click.echo(f"  #{rec.number:<4} {metric} {ttft:8.3f} s  hit {hit:6.3f}  memory {mem:7.1f} GiB  "
                   f"{knob_line(rec.knobs)}")


def write_best(out: Path, knobs: Any, meta: dict[str, Any]) -> None:
    """The best configuration as YAML (read by `tierpilot replay --config`), `meta` saying how it was found."""
    from tuners.offline import best_yaml

    write_output(out, best_yaml(knobs, meta))
    click.echo(f"wrote {out}")
