"""Terminal tables that fit 80 columns without garbling: every command prints through these.

Numbers, units and identifiers (a tier, a source name, a percentage) are never split or cut:
their columns are as wide as their longest cell and their header's longest word. Only the columns
named as free text (URLs, notes, pod names) fold, and they take what width is left. Large counts
are abbreviated (`2.99M`) so that they stay short; the exact values are in `--format json`.
"""
from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

WIDTH = 80
TEXT_MIN = 16  # a folding column keeps at least this many characters (or its longest cell)
PIPE_WIDTH = 4096  # output that is not a terminal (a pipe, a file) is not folded to fit a screen


def table_console(stderr: bool = False) -> Any:
    """The rich Console tables print to: the terminal's width (or COLUMNS when set); when the
    output is a pipe or a file and COLUMNS is unset, wide enough that no row is folded."""
    from rich.console import Console

    console = Console(stderr=stderr)
    if not console.is_terminal and not os.environ.get("COLUMNS"):
        console = Console(stderr=stderr, width=PIPE_WIDTH)
    return console


def count(v: float | None) -> str:
    """A count in at most 7 characters: exact with thousands separators below 100,000, then
    abbreviated with k, M, G, T (three significant digits)."""
    if v is None:
        return "-"
    a = abs(v)
    if a < 100_000:
        return f"{v:,.0f}"
    for div, unit in ((1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k")):
        if a >= div:
            x = v / div
            return f"{x:.3g}{unit}" if abs(x) < 1000 else f"{x:,.0f}{unit}"
    return f"{v:,.0f}"  # pragma: no cover - unreachable


def pct(v: float | None) -> str:
    return "-" if v is None else f"{v:.1%}"


def _widths(columns: Sequence[str], rows: Sequence[Sequence[str]], text: Sequence[str], budget: int) -> list[int]:
    """Column widths (without padding) that fit `budget`: numeric/identifier columns first lose
    their header's one-line width (the header wraps between words), then text columns shrink to
    TEXT_MIN, then below it to their header's longest word. A cell of a non-text column never
    gets less than its own length."""
    natural, floor, soft = [], [], []
    for i, col in enumerate(columns):
        longest = max((len(line) for r in rows for line in str(r[i]).splitlines()), default=0)
        word = max((len(w) for w in col.split()), default=0)
        if col in text:
            natural.append(max(longest, len(col)))
            soft.append(max(word, min(longest, TEXT_MIN)))
            floor.append(max(word, 4))
        else:
            natural.append(max(longest, len(col)))
            soft.append(max(longest, word))
            floor.append(max(longest, word))
    widths = list(natural)
    fixed = [i for i, c in enumerate(columns) if c not in text]
    flex = [i for i, c in enumerate(columns) if c in text]
    for i in sorted(fixed, key=lambda i: soft[i] - natural[i]):  # largest saving first
        if sum(widths) <= budget:
            return widths
        widths[i] = max(soft[i], natural[i] - (sum(widths) - budget))
    for lows in (soft, floor):
        while sum(widths) > budget:
            over = [i for i in flex if widths[i] > lows[i]]
            if not over:
                break
            widest = max(over, key=lambda i: widths[i])
            widths[widest] -= 1
    return widths


def table(title: str | None, columns: Sequence[str], rows: Sequence[Sequence[str]], *,
          text: Sequence[str] = (), left: Sequence[str] = (), show_header: bool = True,
          width: int | None = None) -> Any:
    """A rich Table whose cells are never split, except in the `text` columns (which fold), laid
    out for `width` columns [default: table_console's: the terminal's, COLUMNS included; unfolded
    when piped].
    `left`: further columns aligned left (text columns are; numbers are right-aligned)."""
    from rich import box
    from rich.table import Table

    width = width or table_console().width
    rows = [tuple(map(str, r)) for r in rows]
    # SIMPLE_HEAD without edge padding: 1 space each side, 2 between columns plus the divider
    widths = _widths(columns, rows, text, width - (3 * len(columns) - 1))
    t = Table(title=title, box=box.SIMPLE_HEAD, pad_edge=False, title_justify="left", show_header=show_header)
    for i, col in enumerate(columns):
        t.add_column(col, overflow="fold", width=widths[i],
                     justify="left" if col in text or col in left or i == 0 else "right")
    for r in rows:
        t.add_row(*r)
    return t
