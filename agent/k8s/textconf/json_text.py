"""JSON edited in place, member by member, and checked with `json.load`: the production-stack
router's dynamic config (top-level `"key": value` members) and vLLM's `--kv-transfer-config`
(members of nested objects, reached by a path of keys: `json_path_get`, `json_path_set`)."""
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


def _colon(text: str, members: list[tuple[str, int, int, int]]) -> str:
    """The text between key and value of the first member (`: `, or `:` in compact JSON)."""
    if not members:
        return ": "
    _, start, vstart, _ = members[0]
    _, key_end = _DECODER.raw_decode(text, start)
    return text[key_end:vstart]


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
            member = f"{json.dumps(key)}{_colon(text, members)}{tok}"
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


def _object_span(text: str, path: tuple[str, ...]) -> tuple[int, int]:
    """(start, end) of the object text at `path` (the whole text for ()); ConfigTextError when a
    step is absent or not an object."""
    start, end = 0, len(text)
    for depth, key in enumerate(path):
        sub = text[start:end]
        _, _, members = _members(sub)
        idx = _unique(sub, members, key)
        where = "/".join(path[: depth + 1])
        if idx is None:
            raise ConfigTextError(f"{where} is absent; the agent does not create it")
        _, _, vstart, vend = members[idx]
        if not sub[vstart:vend].lstrip().startswith("{"):
            raise ConfigTextError(f"{where} is not a JSON object")
        start, end = start + vstart, start + vend
    return start, end


def json_path_get(text: str, path: tuple[str, ...]) -> str | None:
    """The value token of the member at `path` (its last key inside the objects named before it)."""
    start, end = _object_span(text, path[:-1])
    return json_get(text[start:end], path[-1])


def json_path_set(text: str, updates: Mapping[tuple[str, ...], str | None]) -> str:
    """`text` with the members at the given paths set to their tokens (None removes one); every
    other member, nested or not, keeps its text. The parent objects must exist."""
    original = text
    for path, tok in updates.items():
        start, end = _object_span(text, path[:-1])
        text = text[:start] + json_set(text[start:end], {path[-1]: tok}) + text[end:]
    want = json.loads(original)
    for path, tok in updates.items():
        parent = want
        for key in path[:-1]:
            parent = parent[key]
        if tok is None:
            parent.pop(path[-1], None)
        else:
            parent[path[-1]] = json_value(tok)
    if json.loads(text) != want:
        raise ConfigTextError("editing would change what json.load reads beyond the intended keys: the agent "
                              "will not apply it")
    return text
