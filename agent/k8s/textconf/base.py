"""What the three editors share: the error, line appends and deletes that keep the file's last
newline (or its absence), and the check that an edit changed only what it meant to."""
from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

ABSENT: Any = object()  # a key the loader does not read


class ConfigTextError(ValueError):
    """The file cannot be edited safely (not parseable, the key is not a scalar line, the key is
    written in a form the loader reads differently, or it appears more than once)."""


def duplicate(kind: str, key: str, linenos: list[int], why: str) -> ConfigTextError:
    where = ", ".join(str(n) for n in linenos)
    return ConfigTextError(f"{kind} key {key!r} appears {len(linenos)} times (lines {where}); {why}: remove the "
                           f"duplicates, the agent will not read or edit an ambiguous file")


def append_line(lines: list[str], line: str) -> None:
    """Append a line, keeping whether the file ends with a newline (so removal restores it)."""
    if not lines or lines[-1].endswith("\n"):
        lines.append(line + "\n")
    else:
        lines[-1] += "\n"
        lines.append(line)


def delete_line(lines: list[str], i: int) -> None:
    """Delete a line; deleting an unterminated last line leaves the new last line unterminated."""
    removed = lines.pop(i)
    if i == len(lines) and not removed.endswith("\n") and lines:
        lines[-1] = lines[-1].rstrip("\r\n")


def same_meaning(before: dict, after: dict, intended: Mapping[str, Any], loader: str,
                 line_of: Callable[[str], int]) -> None:
    """After an edit the loader must read exactly the intended values and every other key as
    before; otherwise the edit is refused (ConfigTextError naming the first differing key and the
    line `line_of` finds for it in the edited text)."""
    want = dict(before)
    for k, v in intended.items():
        if v is ABSENT:
            want.pop(k, None)
        else:
            want[k] = v
    if after != want:
        bad = next(k for k in sorted({*want, *after}, key=str) if want.get(k, ABSENT) != after.get(k, ABSENT))
        raise ConfigTextError(f"editing would change what {loader} reads for {bad!r} (line "
                              f"{line_of(str(bad))}): the agent will not apply it")
