"""`tierpilot tune`: the capacity curves of the tuned configuration and the sizes they suggest."""
from __future__ import annotations

from pathlib import Path

import polars as pl

from contracts.knobs import Knobs
from simulator.capacity import TierCurve, capacity_candidates, steady_state, tier_curves
from simulator.capacity.table import CURVE_COLUMNS, curve_rows
from simulator.cluster import ClusterSpec


def capacity_lines(curves: dict[str, TierCurve], *, headroom_gib: float, memory_ms_per_gib: float,
                   profile: object = None) -> list[str]:
    """One line per CPU candidate size: hit ratio, mean TTFT saved per request and its memory."""
    cpu = curves["cpu"]
    lines = [(f"CPU buffer sizes from the curve (up to {headroom_gib:g} GiB per pod; memory at "
              f"{memory_ms_per_gib:g} ms/GiB)"),
             "  against the size in force, steady state over the whole workload: mean TTFT per",
             "  request, fleet memory, net gain = TTFT saved - memory price (> 0: worth it)"]
    for gib in capacity_candidates(cpu, memory_ms_per_gib=memory_ms_per_gib, headroom_gib=headroom_gib,
                                   profile=profile):  # type: ignore[arg-type]
        est = steady_state(cpu, gib, profile)  # type: ignore[arg-type]
        lines.append(f"  {gib:6.2f} GiB: hit {est.hit_ratio:.3f}, TTFT {-est.ttft_saving_s * 1000:+.0f} ms, "
                     f"memory {est.memory_delta_gib:+.0f} GiB, net gain "
                     f"{est.net_gain_s(memory_ms_per_gib) * 1000:+.0f} ms")
    return lines


def print_capacity(workload: pl.DataFrame, cluster: ClusterSpec, knobs: Knobs, *, headroom_gib: float,
                   memory_ms_per_gib: float, plot_dir: Path | None = None) -> list[Path]:
    """Print the curves at `knobs` (80-column table) and the CPU candidates; plot them into
    `plot_dir` when given. Returns the files written."""
    from contracts.console_tables import table, table_console

    curves = tier_curves(workload, cluster, knobs)
    console = table_console()
    cap = {"cpu": headroom_gib}
    console.print(table(f"What if each tier held N GiB, at the best configuration (chunk {knobs.chunk_tokens}; "
                        "hit ratio over the whole workload, LRU; * = its size)", CURVE_COLUMNS,
                        curve_rows(curves, cap_gib=cap)))
    for line in capacity_lines(curves, headroom_gib=headroom_gib, memory_ms_per_gib=memory_ms_per_gib,
                               profile=cluster.hardware):
        console.print(line, highlight=False)
    if plot_dir is None:
        return []
    from simulator.capacity.plot import plot_curves

    Path(plot_dir).mkdir(parents=True, exist_ok=True)
    cands = {"cpu": capacity_candidates(curves["cpu"], memory_ms_per_gib=memory_ms_per_gib,
                                        headroom_gib=headroom_gib, profile=cluster.hardware)}
    return [plot_curves(curves, Path(plot_dir) / "capacity_curves.png", cap_gib=cap, candidates=cands)]
