"""TOML (the Curvine cluster config): `key = value` lines inside `[section]`, read as a TOML 1.0
parser (`tomllib`) reads them.

The line scan knows tables (`[a.b]`, quoted or spaced names too), arrays of tables (`[[a]]`, whose
keys it never edits), multi-line strings (whose lines are not keys) and comments after a value
(`"a # b" # c` is the string `a # b`). What it finds for a key must be what tomllib reads; a key
written where the scan cannot edit it (a quoted or dotted key, an inline table, a multi-line
value, a key under an array of tables) is refused with its line, never reported as absent."""
from __future__ import annotations

import json
import re
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from agent.k8s.textconf.base import ABSENT, ConfigTextError, append_line, delete_line, duplicate, same_meaning

_TABLE = re.compile(r"^\s*\[(?P<name>[^\[\]]+)\]\s*(#.*)?$")
_ARRAY_TABLE = re.compile(r"^\s*\[\[(?P<name>[^\[\]]+)\]\]\s*(#.*)?$")
_KEY_LINE = re.compile(r"^(?P<ind>\s*)(?P<key>[A-Za-z0-9_-]+)(?P<eq>\s*=\s*)(?P<rest>.*)$")
_NOT_EDITABLE = "\0"  # the scan's section name under an array of tables


@dataclass(frozen=True, slots=True)
class KeyLine:
    """One `key = value` line: indentation, key, ` = `, the value's token, what follows it."""

    ind: str
    key: str
    eq: str
    tok: str
    tail: str


def parse_key_line(body: str) -> KeyLine | None:
    """The parts of a bare-key line (None for any other line). The token ends where the value
    does: at the first `#` after which the rest is a comment and before which TOML reads a value;
    a value that parses nowhere (the start of a multi-line one) keeps the whole rest."""
    m = _KEY_LINE.match(body)
    if m is None:
        return None
    rest = m.group("rest")
    tok, tail = rest.rstrip(), rest[len(rest.rstrip()):]
    for at in [i for i, c in enumerate(rest) if c == "#"]:
        cand = rest[:at].rstrip()
        if cand and _parses(cand):
            tok, tail = cand, rest[len(cand):]
            break
    else:
        if not _parses(tok):
            tok, tail = rest, ""
    return KeyLine(m.group("ind"), m.group("key"), m.group("eq"), tok, tail)


def _parses(tok: str) -> bool:
    try:
        tomllib.loads(f"v = {tok}")
    except tomllib.TOMLDecodeError:
        return False
    return True


def _table_name(raw: str) -> str:
    """`a . "b"` -> `a.b` (TOML's own reading of a table name)."""
    try:
        data = tomllib.loads(f"[{raw}]")
    except tomllib.TOMLDecodeError:
        return raw.strip()
    parts = []
    while isinstance(data, dict) and len(data) == 1:
        k, data = next(iter(data.items()))
        parts.append(k)
    return ".".join(parts)


def _split_dotted(dotted: str) -> tuple[str, str]:
    if "." not in dotted:
        return "", dotted
    section, key = dotted.rsplit(".", 1)
    return section, key


def _multiline_opens(line: str, delim: str | None) -> str | None:
    """The multi-line string delimiter open after `line` (`delim`: the one open before it)."""
    if delim is not None:
        return None if line.count(delim) % 2 else delim
    for d in ('"""', "'''"):
        if d in line and line.count(d) % 2:
            return d
    return None


def _scan(lines: list[str], section: str, key: str) -> tuple[int | None, int | None, int | None]:
    """(line index of key, index of the section header, index of the last line of the section)."""
    current = ""
    header = 0 if section == "" else None
    last = None
    found = None
    delim: str | None = None
    for i, line in enumerate(lines):
        body = line.rstrip("\r\n")
        inside = delim is not None
        delim = _multiline_opens(body, delim)
        if not inside:
            if m := _ARRAY_TABLE.match(body):
                current = _NOT_EDITABLE
                continue
            if m := _TABLE.match(body):
                current = _table_name(m.group("name"))
                if current == section:
                    header, last = i, i
                continue
        if current != section:
            continue
        if body.strip():
            last = i
        kl = None if inside else parse_key_line(body)
        if kl is not None and kl.key == key:
            if found is not None:
                raise duplicate("TOML", f"{section}.{key}" if section else key, [found + 1, i + 1],
                                "duplicate keys are invalid TOML")
            found = i
    return found, header, last


def toml_flat(data: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """Tables flattened to dotted keys (`[cache] size = 1` -> {"cache.size": 1})."""
    out: dict[str, Any] = {}
    for k, v in data.items():
        if isinstance(v, dict):
            out.update(toml_flat(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = v
    return out


def _data(text: str) -> dict[str, Any]:
    try:
        return toml_flat(tomllib.loads(text))
    except tomllib.TOMLDecodeError as exc:
        raise ConfigTextError(f"not valid TOML: {exc}") from None


def key_line(text: str, dotted: str) -> int:
    """1-based line where `dotted`'s last part is written as a key (bare, quoted, dotted or in an
    inline table), else the line of its table, else 1."""
    section, key = _split_dotted(dotted)
    pattern = re.compile(r"(^|[\s.{,])[\"']?" + re.escape(key) + r"[\"']?\s*=")
    lines = text.splitlines()
    for n, line in enumerate(lines, 1):
        if pattern.search(line):
            return n
    for n, line in enumerate(lines, 1):
        if section and section.split(".")[0] in line:
            return n
    return 1


def _array_table(text: str, section: str) -> int | None:
    """The line of the `[[table]]` header `section` lies in (None when it lies in no array)."""
    data: Any = tomllib.loads(text)
    parts = section.split(".") if section else []
    for n in range(1, len(parts) + 1):
        if not isinstance(data, dict) or parts[n - 1] not in data:
            return None
        data = data[parts[n - 1]]
        if isinstance(data, list):
            prefix = ".".join(parts[:n])
            for no, line in enumerate(text.splitlines(), 1):
                if (m := _ARRAY_TABLE.match(line)) and _table_name(m.group("name")) == prefix:
                    return no
            return 1
    return None


def _agrees(text: str, dotted: str, line: int | None, tok: str | None) -> None:
    real = _data(text).get(dotted, ABSENT)
    section, _ = _split_dotted(dotted)
    if (array_at := _array_table(text, section)) is not None:
        raise ConfigTextError(f"TOML key {dotted!r} (line {array_at}) lies under an array of tables ([[...]]): "
                              f"the editor edits keys of plain [tables] only")
    if tok is None and real is ABSENT:
        return
    if tok is not None and real is not ABSENT and _parses(tok) and toml_value(tok) == real:
        return
    where = line if line is not None else key_line(text, dotted)
    raise ConfigTextError(f"TOML key {dotted!r} (line {where}) is written in a form the editor does not edit "
                          f"(quoted or dotted key, inline table, multi-line value, array of tables): tomllib reads "
                          f"{'nothing' if real is ABSENT else repr(real)}; write it as one `key = value` line "
                          f"under its [table]")


def toml_get(text: str, dotted: str) -> str | None:
    section, key = _split_dotted(dotted)
    lines = text.splitlines(keepends=True)
    i, _, _ = _scan(lines, section, key)
    tok = None
    if i is not None:
        kl = parse_key_line(lines[i].rstrip("\r\n"))
        assert kl is not None
        tok = kl.tok
    _agrees(text, dotted, None if i is None else i + 1, tok)
    return tok


def toml_set(text: str, updates: Mapping[str, str | None]) -> str:
    before = _data(text)
    for dotted in updates:
        toml_get(text, dotted)  # refuses a key tomllib reads differently from the line scan
    lines = text.splitlines(keepends=True)
    for dotted, tok in updates.items():
        section, key = _split_dotted(dotted)
        i, header, last = _scan(lines, section, key)
        if i is not None:
            line = lines[i]
            eol = line[len(line.rstrip("\r\n")):]
            kl = parse_key_line(line.rstrip("\r\n"))
            assert kl is not None
            if tok is None:
                delete_line(lines, i)
            else:
                lines[i] = f"{kl.ind}{kl.key}{kl.eq}{tok}{kl.tail}{eol}"
        elif tok is not None:
            if header is None:
                append_line(lines, "")
                append_line(lines, f"[{section}]")
                append_line(lines, f"{key} = {tok}")
            else:
                at = (last if last is not None else header) + 1
                if at >= len(lines):
                    append_line(lines, f"{key} = {tok}")
                else:
                    lines.insert(at, f"{key} = {tok}\n")
    out = "".join(lines)
    same_meaning(before, _data(out), {k: ABSENT if t is None else toml_value(t) for k, t in updates.items()},
                 "tomllib", lambda k: key_line(out, k))
    return out


def toml_token(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    return json.dumps(str(value))


def toml_value(token: str) -> Any:
    try:
        return tomllib.loads(f"v = {token}")["v"]
    except tomllib.TOMLDecodeError as exc:
        raise ConfigTextError(f"not a TOML value: {token!r} ({exc})") from None
