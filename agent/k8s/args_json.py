"""Settings inside a JSON-valued flag of one container (vLLM's `--kv-transfer-config`). Pure.

A key is the flag and a path of object keys inside its JSON, joined by `/`:
`--kv-transfer-config/kv_connector_extra_config/cpu_bytes_to_use`. A key without `/` is a plain
flag (`--block-size`), read as the `args` store reads it. The token of a JSON key is its value's
text as written in the flag (`5368709120`, `"arc"`); None = absent. Both `--flag '{...}'` (two
elements) and `--flag={...}` are read and rewritten in the form found; an edit changes only the
members it owns (every other key, known or not, keeps its text), and the parent objects must
already be there: the agent tunes a configured connector, it does not configure one.
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from agent.k8s import textconf
from agent.k8s.args_store import ArgsError, args_plan, args_read


def split_key(key: str) -> tuple[str, tuple[str, ...]]:
    """(`--flag`, the key path inside its JSON; () for a plain flag)."""
    flag, _, rest = key.partition("/")
    return flag, tuple(rest.split("/")) if rest else ()


def _flags(keys: Sequence[str]) -> list[str]:
    return list(dict.fromkeys(split_key(k)[0] for k in keys))


def args_json_read(obj: Mapping[str, Any], ci: int, keys: Sequence[str], where: str) -> dict[str, str | None]:
    flags = args_read(obj, ci, _flags(keys), where)
    out: dict[str, str | None] = {}
    for key in keys:
        flag, path = split_key(key)
        text = flags[flag]
        if not path or text is None:
            out[key] = text
            continue
        try:
            out[key] = textconf.json_path_get(text, path)
        except textconf.ConfigTextError as exc:
            raise ArgsError(f"{where}: {flag}: {exc}") from None
    return out


def args_json_plan(obj: Mapping[str, Any], ci: int, tokens: Mapping[str, str | None], where: str
                   ) -> list[dict[str, Any]]:
    """The `args` patch that writes `tokens` into their flags' JSON (plain flags as they are)."""
    flags = args_read(obj, ci, _flags(list(tokens)), where)
    new: dict[str, str | None] = {}
    edits: dict[str, dict[tuple[str, ...], str | None]] = {}
    for key, tok in tokens.items():
        flag, path = split_key(key)
        if path:
            edits.setdefault(flag, {})[path] = tok
        else:
            new[flag] = tok
    for flag, updates in edits.items():
        text = flags[flag]
        if text is None:
            if all(t is None for t in updates.values()):
                continue
            raise ArgsError(f"{where}: {flag} is not in args; the agent edits that flag's JSON, it does not "
                            f"create it")
        try:
            new[flag] = textconf.json_path_set(text, updates)
        except textconf.ConfigTextError as exc:
            raise ArgsError(f"{where}: {flag}: {exc}") from None
    return args_plan(obj, ci, new, where)
