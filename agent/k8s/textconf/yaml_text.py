"""Flat YAML (the LMCache config file): top-level `key: value` lines, read as `yaml.safe_load`
(LMCache's loader) reads them. A key the line scan would misread (a quoted key, an alias, a merge
key, a block scalar) is refused with its line."""
from __future__ import annotations

import json
import re
from collections.abc import Mapping
from typing import Any

import yaml

from agent.k8s.textconf.base import ABSENT, ConfigTextError, append_line, delete_line, duplicate, same_meaning

_YAML_LINE = re.compile(r"^(?P<key>[A-Za-z0-9_.-]+)[ \t]*:(?P<sp>[ \t]*)(?P<tok>.*?)(?P<tail>[ \t]+#.*)?$")


def _lines(text: str) -> list[str]:
    return text.splitlines(keepends=True)


def _find(lines: list[str], key: str) -> int | None:
    found = [i for i, line in enumerate(lines)
             if (m := _YAML_LINE.match(line.rstrip("\r\n"))) and m.group("key") == key]
    if len(found) > 1:
        raise duplicate("YAML", key, [i + 1 for i in found], "yaml.safe_load (LMCache, the router) reads the last one")
    return found[0] if found else None


def _data(text: str) -> dict:
    _check(text)
    return (yaml.safe_load(text) if text.strip() else None) or {}


def key_line(text: str, key: str) -> int:
    """1-based line where top-level `key` is written (quoted, tagged, or a merge key), else 1."""
    for n, line in enumerate(text.splitlines(), 1):
        if line[:1] not in ("", " ", "\t", "#") and (key in line or line.startswith("<<")):
            return n
    return 1


def _agrees(text: str, key: str, tok: str | None) -> None:
    """What the line scan found for `key` must be what yaml.safe_load (LMCache's loader) reads:
    a quoted key, an alias, a merge key or a block scalar the scan cannot see or edit is refused
    with its line, never reported as absent or as the alias text."""
    real = _data(text).get(key, ABSENT)
    if tok is None and real is ABSENT:
        return
    if tok is not None and tok != "" and real is not ABSENT:
        try:
            if yaml_value(tok) == real:
                return
        except yaml.YAMLError:
            pass
    raise ConfigTextError(f"YAML key {key!r} (line {key_line(text, key)}) is written in a form the editor does "
                          f"not edit (quoted key, alias, merge key or multi-line value): yaml.safe_load reads "
                          f"{'nothing' if real is ABSENT else repr(real)}; write it as one `{key}: value` line")


def yaml_get(text: str, key: str) -> str | None:
    lines = _lines(text)
    i = _find(lines, key)
    tok = None
    if i is not None:
        tok = _YAML_LINE.match(lines[i].rstrip("\r\n")).group("tok")  # type: ignore[union-attr]
        if tok == "":
            raise ConfigTextError(f"YAML key {key!r} (line {i + 1}) is not a scalar on one line")
    _agrees(text, key, tok)
    return tok


def yaml_set(text: str, updates: Mapping[str, str | None]) -> str:
    before = _data(text)
    for key in updates:
        yaml_get(text, key)  # refuses a key the loader reads differently from the line scan
    lines = _lines(text)
    for key, tok in updates.items():
        i = _find(lines, key)
        if i is not None:
            line = lines[i]
            eol = line[len(line.rstrip("\r\n")):]
            m = _YAML_LINE.match(line.rstrip("\r\n"))
            assert m is not None
            if m.group("tok") == "":
                raise ConfigTextError(f"YAML key {key!r} is not a scalar on one line")
            if tok is None:
                delete_line(lines, i)
            else:
                lines[i] = f"{m.group('key')}:{m.group('sp') or ' '}{tok}{m.group('tail') or ''}{eol}"
        elif tok is not None:
            append_line(lines, f"{key}: {tok}")
    out = "".join(lines)
    _check(out)
    same_meaning(before, _data(out), {k: ABSENT if t is None else yaml_value(t) for k, t in updates.items()},
                 "yaml.safe_load", lambda k: key_line(out, k))
    return out


def _check(text: str) -> None:
    try:
        data = yaml.safe_load(text) if text.strip() else {}
    except yaml.YAMLError as exc:
        raise ConfigTextError(f"not valid YAML: {' '.join(str(exc).split())}") from None
    if data is not None and not isinstance(data, dict):
        raise ConfigTextError("YAML config must be a mapping at the top level")


def yaml_token(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    s = str(value)
    # Quote only when YAML would read the bare text as something other than this string.
    return s if yaml.safe_load(s) == s and s.strip() == s else json.dumps(s)


def yaml_value(token: str) -> Any:
    return yaml.safe_load(token)
