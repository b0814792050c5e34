"""Byte-preserving edits of config files kept in ConfigMaps. Pure text in, text out.

Only the lines of the settings we own change; comments, order and every other line stay as they
were, so a rollback that writes the old tokens back restores the file byte for byte.

- flat YAML (LMCache config): top-level `key: value` lines;
- TOML (Curvine cluster config): `key = value` lines inside `[section]`;
- JSON (production-stack router dynamic config): top-level `"key": value` members.

A token is the value's text as it appears in the file (`512`, `"lru"`, `LRU`); `None` = absent.

A key we own that appears more than once is refused (ConfigTextError naming the key and the
lines), for reading and writing alike: the components' readers take the LAST occurrence (LMCache
loads its YAML with `yaml.safe_load`, lmcache/v1/config_base.py; the production-stack router its
dynamic config with `json.load`, src/vllm_router/dynamic_config.py; both keep the last duplicate),
so editing or reporting the first one would tune a configuration that never runs. TOML forbids
duplicate keys (Curvine would not start); they are refused the same way.
"""
from __future__ import annotations

import json
import re
import tomllib
from collections.abc import Mapping
from typing import Any

import yaml


class ConfigTextError(ValueError):
    """The file cannot be edited safely (not parseable, the key is not a scalar line, or the key
    appears more than once)."""


def _duplicate(kind: str, key: str, linenos: list[int], why: str) -> ConfigTextError:
    where = ", ".join(str(n) for n in linenos)
    return ConfigTextError(f"{kind} key {key!r} appears {len(linenos)} times (lines {where}); {why}: remove the "
                           f"duplicates, the agent will not read or edit an ambiguous file")


def _append_line(lines: list[str], line: str) -> None:
    """Append a line, keeping whether the file ends with a newline (so removal restores it)."""
    if not lines or lines[-1].endswith("\n"):
        lines.append(line + "\n")
    else:
        lines[-1] += "\n"
        lines.append(line)


def _delete_line(lines: list[str], i: int) -> None:
    """Delete a line; deleting an unterminated last line leaves the new last line unterminated."""
    removed = lines.pop(i)
    if i == len(lines) and not removed.endswith("\n") and lines:
        lines[-1] = lines[-1].rstrip("\r\n")


# -- flat YAML ----------------------------------------------------------------------------------

_YAML_LINE = re.compile(r"^(?P<key>[A-Za-z0-9_.-]+)[ \t]*:(?P<sp>[ \t]*)(?P<tok>.*?)(?P<tail>[ \t]+#.*)?$")


def _yaml_lines(text: str) -> list[str]:
    return text.splitlines(keepends=True)


def _yaml_find(lines: list[str], key: str) -> int | None:
    found = [i for i, line in enumerate(lines)
             if (m := _YAML_LINE.match(line.rstrip("\r\n"))) and m.group("key") == key]
    if len(found) > 1:
        raise _duplicate("YAML", key, [i + 1 for i in found], "yaml.safe_load (LMCache, the router) reads the last one")
    return found[0] if found else None


_ABSENT = object()


def _yaml_data(text: str) -> dict:
    _check_yaml(text)
    return (yaml.safe_load(text) if text.strip() else None) or {}


def _key_line(text: str, key: str) -> int:
    """1-based line where top-level `key` is written (quoted, tagged, or a merge key), else 1."""
    for n, line in enumerate(text.splitlines(), 1):
        if line[:1] not in ("", " ", "\t", "#") and (key in line or line.startswith("<<")):
            return n
    return 1


def _agrees(text: str, key: str, tok: str | None) -> None:
    """What the line scan found for `key` must be what yaml.safe_load (LMCache's loader) reads:
    a quoted key, an alias, a merge key or a block scalar the scan cannot see or edit is refused
    with its line, never reported as absent or as the alias text."""
    real = _yaml_data(text).get(key, _ABSENT)
    if tok is None and real is _ABSENT:
        return
    if tok is not None and tok != "" and real is not _ABSENT:
        try:
            if yaml_value(tok) == real:
                return
        except yaml.YAMLError:
            pass
    raise ConfigTextError(f"YAML key {key!r} (line {_key_line(text, key)}) is written in a form the editor does "
                          f"not edit (quoted key, alias, merge key or multi-line value): yaml.safe_load reads "
                          f"{'nothing' if real is _ABSENT else repr(real)}; write it as one `{key}: value` line")


def yaml_get(text: str, key: str) -> str | None:
    lines = _yaml_lines(text)
    i = _yaml_find(lines, key)
    tok = None
    if i is not None:
        tok = _YAML_LINE.match(lines[i].rstrip("\r\n")).group("tok")  # type: ignore[union-attr]
        if tok == "":
            raise ConfigTextError(f"YAML key {key!r} (line {i + 1}) is not a scalar on one line")
    _agrees(text, key, tok)
    return tok


def yaml_set(text: str, updates: Mapping[str, str | None]) -> str:
    before = _yaml_data(text)
    for key in updates:
        yaml_get(text, key)  # refuses a key the loader reads differently from the line scan
    lines = _yaml_lines(text)
    for key, tok in updates.items():
        i = _yaml_find(lines, key)
        if i is not None:
            line = lines[i]
            eol = line[len(line.rstrip("\r\n")):]
            m = _YAML_LINE.match(line.rstrip("\r\n"))
            assert m is not None
            if m.group("tok") == "":
                raise ConfigTextError(f"YAML key {key!r} is not a scalar on one line")
            if tok is None:
                _delete_line(lines, i)
            else:
                lines[i] = f"{m.group('key')}:{m.group('sp') or ' '}{tok}{m.group('tail') or ''}{eol}"
        elif tok is not None:
            _append_line(lines, f"{key}: {tok}")
    out = "".join(lines)
    _check_yaml(out)
    _same_meaning(before, _yaml_data(out), {k: _ABSENT if t is None else yaml_value(t) for k, t in updates.items()},
                  out, "yaml.safe_load")
    return out


def _same_meaning(before: dict, after: dict, intended: Mapping[str, Any], out: str, loader: str) -> None:
    """After an edit the loader must read exactly the intended values and every other key as
    before; otherwise the edit is refused (ConfigTextError naming the first differing key)."""
    want = dict(before)
    for k, v in intended.items():
        if v is _ABSENT:
            want.pop(k, None)
        else:
            want[k] = v
    if after != want:
        bad = next(k for k in sorted({*want, *after}, key=str) if want.get(k, _ABSENT) != after.get(k, _ABSENT))
        raise ConfigTextError(f"editing would change what {loader} reads for {bad!r} (line "
                              f"{_key_line(out, str(bad))}): the agent will not apply it")


def _check_yaml(text: str) -> None:
    try:
        data = yaml.safe_load(text) if text.strip() else {}
    except yaml.YAMLError as exc:
        raise ConfigTextError(f"not valid YAML: {exc}") from None
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


# -- TOML -------------------------------------------------------------------------------------

_TOML_SECTION = re.compile(r"^\s*\[(?P<name>[^\[\]]+)\]\s*(#.*)?$")
_TOML_LINE = re.compile(r"^(?P<ind>\s*)(?P<key>[A-Za-z0-9_-]+)(?P<eq>\s*=\s*)(?P<tok>.*?)(?P<tail>\s+#.*)?$")


def _split_dotted(dotted: str) -> tuple[str, str]:
    if "." not in dotted:
        return "", dotted
    section, key = dotted.rsplit(".", 1)
    return section, key


def _toml_scan(lines: list[str], section: str, key: str) -> tuple[int | None, int | None, int | None]:
    """(line index of key, index of the section header, index of the last line of the section)."""
    current = ""
    header = 0 if section == "" else None
    last = None
    found = None
    for i, line in enumerate(lines):
        body = line.rstrip("\r\n")
        m = _TOML_SECTION.match(body)
        if m:
            current = m.group("name").strip()
            if current == section:
                header, last = i, i
            continue
        if current == section:
            if body.strip():
                last = i
            km = _TOML_LINE.match(body)
            if km and km.group("key") == key:
                if found is not None:
                    raise _duplicate("TOML", f"{section}.{key}" if section else key, [found + 1, i + 1],
                                     "duplicate keys are invalid TOML")
                found = i
    return found, header, last


def toml_get(text: str, dotted: str) -> str | None:
    section, key = _split_dotted(dotted)
    lines = text.splitlines(keepends=True)
    i, _, _ = _toml_scan(lines, section, key)
    if i is None:
        return None
    return _TOML_LINE.match(lines[i].rstrip("\r\n")).group("tok")  # type: ignore[union-attr]


def _toml_flat(data: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """Tables flattened to dotted keys (`[cache] size = 1` -> {"cache.size": 1})."""
    out: dict[str, Any] = {}
    for k, v in data.items():
        if isinstance(v, dict):
            out.update(_toml_flat(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = v
    return out


def toml_set(text: str, updates: Mapping[str, str | None]) -> str:
    _check_toml(text)
    before = _toml_flat(tomllib.loads(text))
    lines = text.splitlines(keepends=True)
    for dotted, tok in updates.items():
        section, key = _split_dotted(dotted)
        i, header, last = _toml_scan(lines, section, key)
        if i is not None:
            line = lines[i]
            eol = line[len(line.rstrip("\r\n")):]
            m = _TOML_LINE.match(line.rstrip("\r\n"))
            assert m is not None
            if tok is None:
                _delete_line(lines, i)
            else:
                lines[i] = f"{m.group('ind')}{key}{m.group('eq')}{tok}{m.group('tail') or ''}{eol}"
        elif tok is not None:
            if header is None:
                _append_line(lines, "")
                _append_line(lines, f"[{section}]")
                _append_line(lines, f"{key} = {tok}")
            else:
                at = (last if last is not None else header) + 1
                if at >= len(lines):
                    _append_line(lines, f"{key} = {tok}")
                else:
                    lines.insert(at, f"{key} = {tok}\n")
    out = "".join(lines)
    _check_toml(out)
    _same_meaning(before, _toml_flat(tomllib.loads(out)),
                  {k: _ABSENT if t is None else toml_value(t) for k, t in updates.items()}, out, "tomllib")
    return out


def _check_toml(text: str) -> None:
    try:
        tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigTextError(f"not valid TOML: {exc}") from None


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


# -- JSON (top-level members) -----------------------------------------------------------------

_DECODER = json.JSONDecoder()
_WS = " \t\r\n"


def _skip_ws(text: str, i: int) -> int:
    while i < len(text) and text[i] in _WS:
        i += 1
    return i


def _json_members(text: str) -> tuple[int, int, list[tuple[str, int, int, int]]]:
    """(index of '{', index of '}', [(key, member start, value start, value end)])."""
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ConfigTextError(f"not valid JSON: {exc}") from None
    if not isinstance(data, dict):
        raise ConfigTextError("JSON config must be an object at the top level")
    i = _skip_ws(text, 0)
    open_at = i
    i += 1
    members = []
    while True:
        i = _skip_ws(text, i)
        if text[i] == "}":
            return open_at, i, members
        start = i
        key, i = _DECODER.raw_decode(text, i)
        i = _skip_ws(text, i) + 1  # ':'
        vstart = _skip_ws(text, i)
        _, vend = _DECODER.raw_decode(text, vstart)
        members.append((key, start, vstart, vend))
        i = _skip_ws(text, vend)
        if text[i] == ",":
            i += 1


def _json_unique(text: str, members: list[tuple[str, int, int, int]], key: str) -> int | None:
    """Index of `key`'s member, None when absent; ConfigTextError when it is there twice."""
    found = [n for n, m in enumerate(members) if m[0] == key]
    if len(found) > 1:
        raise _duplicate("JSON", key, [text.count("\n", 0, members[n][1]) + 1 for n in found],
                         "json.load (the production-stack router) reads the last one")
    return found[0] if found else None


def json_get(text: str, key: str) -> str | None:
    _, _, members = _json_members(text)
    idx = _json_unique(text, members, key)
    if idx is None:
        return None
    _, _, vstart, vend = members[idx]
    return text[vstart:vend]


def json_set(text: str, updates: Mapping[str, str | None]) -> str:
    original = text
    for key, tok in updates.items():
        open_at, close_at, members = _json_members(text)
        idx = _json_unique(text, members, key)
        if idx is not None:
            _, start, vstart, vend = members[idx]
            if tok is not None:
                text = text[:vstart] + tok + text[vend:]
            elif len(members) == 1:
                text = text[: open_at + 1] + text[close_at:]
            elif idx < len(members) - 1:  # drop through the start of the next member
                text = text[:start] + text[members[idx + 1][1]:]
            else:  # last member: drop from the end of the previous value
                text = text[: members[idx - 1][3]] + text[vend:]
        elif tok is not None:
            member = f"{json.dumps(key)}: {tok}"
            if members:
                first = members[0][1]
                gap = text[open_at + 1:first]  # the indentation style of the file
                text = text[:first] + member + "," + gap + text[first:]
            else:
                text = text[: open_at + 1] + member + text[open_at + 1:]
    _json_members(text)
    _same_meaning(json.loads(original), json.loads(text),
                  {k: _ABSENT if t is None else json_value(t) for k, t in updates.items()}, text, "json.load")
    return text


def json_token(value: Any) -> str:
    return json.dumps(value)


def json_value(token: str) -> Any:
    return json.loads(token)
