"""JSON (the production-stack router's dynamic config): top-level `"key": value` members, edited
in place and checked with `json.load`, the router's loader."""
from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from agent.k8s.textconf.base import ABSENT, ConfigTextError, duplicate, same_meaning

_DECODER = json.JSONDecoder()
_WS = " \t\r\n"


def _skip_ws(text: str, i: int) -> int:
    while i < len(text) and text[i] in _WS:
        i += 1
    return i


def _members(text: str) -> tuple[int, int, list[tuple[str, int, int, int]]]:
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


def _unique(text: str, members: list[tuple[str, int, int, int]], key: str) -> int | None:
    """Index of `key`'s member, None when absent; ConfigTextError when it is there twice."""
    found = [n for n, m in enumerate(members) if m[0] == key]
    if len(found) > 1:
        raise duplicate("JSON", key, [text.count("\n", 0, members[n][1]) + 1 for n in found],
                        "json.load (the production-stack router) reads the last one")
    return found[0] if found else None


def _key_line(text: str, key: str) -> int:
    at = text.find(json.dumps(key))
    return text.count("\n", 0, at) + 1 if at >= 0 else 1


def json_get(text: str, key: str) -> str | None:
    _, _, members = _members(text)
    idx = _unique(text, members, key)
    if idx is None:
        return None
    _, _, vstart, vend = members[idx]
    return text[vstart:vend]


def json_set(text: str, updates: Mapping[str, str | None]) -> str:
    original = text
    for key, tok in updates.items():
        open_at, close_at, members = _members(text)
        idx = _unique(text, members, key)
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
    _members(text)
    out = text
    same_meaning(json.loads(original), json.loads(out),
                 {k: ABSENT if t is None else json_value(t) for k, t in updates.items()}, "json.load",
                 lambda k: _key_line(out, k))
    return out


def json_token(value: Any) -> str:
    return json.dumps(value)


def json_value(token: str) -> Any:
    return json.loads(token)
