"""The capacity curves as points (for the exporter) and as a text table (CLI, 80 columns)."""
from __future__ import annotations

from collections.abc import Mapping

from simulator.capacity.curves import TIERS, TierCurve

BAR_WIDTH = 30


def curve_points(curves: Mapping[str, TierCurve], *, cap_gib: Mapping[str, float] | None = None,
                 points: int = 9) -> dict[str, list[tuple[float, float]]]:
    """Per tier, (capacity GiB, hit ratio) at the tier's default grid (capped per tier by `cap_gib`)."""
    caps = cap_gib or {}
    return {t: curves[t].grid(curves[t].default_grid(points, caps.get(t))) for t in TIERS if t in curves}


def curve_rows(curves: Mapping[str, TierCurve], *, cap_gib: Mapping[str, float] | None = None,
               points: int = 9, tiers: tuple[str, ...] = ("cpu", "l2", "gpu")) -> list[tuple[str, ...]]:
    """(tier, GiB with * at the size in force, scope, hit ratio, share of prompt tokens) rows."""
    caps = cap_gib or {}
    rows = []
    for tier in tiers:
        curve = curves.get(tier)
        if curve is None:
            continue
        now = round(curve.current_gib, 2)
        for gib in curve.default_grid(points, caps.get(tier)):
            mark = "*" if abs(gib - now) < 1e-9 else ""
            rows.append((tier.upper(), f"{gib:.2f}{mark}", "pod" if curve.per_pod else "fleet",
                         f"{curve.hit_ratio(gib):.3f}", f"{curve.prompt_share(gib):.1%}"))
    return rows


CURVE_COLUMNS: tuple[str, ...] = ("tier", "GiB", "per", "hit ratio", "of prompt")


def curves_json(curves: Mapping[str, TierCurve], *, cap_gib: Mapping[str, float] | None = None,
                points: int = 9) -> dict[str, dict]:
    """The curves for `--format json`: per tier, its size in force, useful maximum and points."""
    return {t: {"current_gib": c.current_gib, "max_useful_gib": c.max_useful_gib, "per_pod": c.per_pod,
                "sample_rate": c.sample_rate,
                "points": [{"capacity_gib": g, "hit_ratio": r, "prompt_share": c.prompt_share(g)}
                           for g, r in c.grid(c.default_grid(points, (cap_gib or {}).get(t)))]}
            for t, c in curves.items()}


def curve_table(curves: Mapping[str, TierCurve], *, cap_gib: Mapping[str, float] | None = None,
                points: int = 9, tiers: tuple[str, ...] = ("cpu", "l2", "gpu")) -> list[str]:
    """Lines of text, at most 80 columns: per tier, hit ratio and share of prompt tokens by size."""
    caps = cap_gib or {}
    lines = ["Capacity curves over the whole run (LRU; * = the size in force)",
             f"{'tier':<5}{'GiB':>9}  {'hit ratio':>9}  {'of prompt':>9}"]
    for tier in tiers:
        curve = curves.get(tier)
        if curve is None:
            continue
        scope = "per pod" if curve.per_pod else "fleet"
        now = round(curve.current_gib, 2)
        for gib in curve.default_grid(points, caps.get(tier)):
            ratio = curve.hit_ratio(gib)
            bar = "#" * round(ratio * BAR_WIDTH)
            mark = "*" if abs(gib - now) < 1e-9 else " "
            lines.append(f"{tier:<5}{gib:>8.2f}{mark}  {ratio:>9.3f}  {curve.prompt_share(gib):>8.1%}  {bar}".rstrip())
        lines.append(f"{'':<5}({scope}; every reuse hits from {curve.max_useful_gib:.1f} GiB"
                     + (", sampled" if curve.sample_rate < 1 else "") + ")")
    return lines
