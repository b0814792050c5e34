"""Command-line flags of one container in a Deployment (`spec.template.spec.containers[i].args`).

For components configured by flags at start: the LMCache MP server (`--chunk-size`,
`--l1-size-gb`, `--eviction-policy`) and vllm-project/router (`--policy`, `--router-temperature`,
`--kv-penalty-host`, `--kv-penalty-external`). A token is the flag's value as written; both
`--flag value` and `--flag=value` are read, and a value is replaced in the form it was found.
A new flag is appended as two elements; an absent flag (token None) means the component default.
Changing `args` changes the pod template, so the Deployment rolls. Pure functions.
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from agent.k8s.patches import op_add, op_remove, op_replace, op_test, resolve, resource_version_guard


class ArgsError(ValueError):
    """The container's command line cannot be read or changed safely (names the object and flag)."""


def _find(args: Sequence[str], flag: str, where: str) -> tuple[int, bool] | None:
    """(index of the value element, whether it is `--flag=value`), or None when absent."""
    found = None
    for i, arg in enumerate(args):
        if arg == flag:
            if i + 1 >= len(args) or args[i + 1].startswith("--"):
                raise ArgsError(f"{where}: {flag} has no value in args")
            hit = (i + 1, False)
        elif arg.startswith(flag + "="):
            hit = (i, True)
        else:
            continue
        if found is not None:
            raise ArgsError(f"{where}: {flag} is given twice in args; refusing to guess which one wins")
        found = hit
    return found


def _args(obj: Mapping[str, Any], ci: int, keys: Sequence[str], where: str) -> list[str]:
    base = f"/spec/template/spec/containers/{ci}"
    command = resolve(obj, f"{base}/command", None) or []
    for flag in keys:
        if any(c == flag or str(c).startswith(flag + "=") for c in command):
            raise ArgsError(f"{where}: {flag} is set in `command`; move the flags to `args` to let them be managed")
    args = resolve(obj, f"{base}/args", None)
    return [str(a) for a in args] if args is not None else []


def args_read(obj: Mapping[str, Any], ci: int, keys: Sequence[str], where: str) -> dict[str, str | None]:
    args = _args(obj, ci, keys, where)
    out: dict[str, str | None] = {}
    for flag in keys:
        hit = _find(args, flag, where)
        if hit is None:
            out[flag] = None
        else:
            i, inline = hit
            out[flag] = args[i].split("=", 1)[1] if inline else args[i]
    return out


def args_plan(obj: Mapping[str, Any], ci: int, tokens: Mapping[str, str | None], where: str
              ) -> list[dict[str, Any]]:
    base = f"/spec/template/spec/containers/{ci}"
    args = _args(obj, ci, list(tokens), where)
    current = args_read(obj, ci, list(tokens), where)
    changes = {k: v for k, v in tokens.items() if current[k] != v}
    if not changes:
        return []
    if resolve(obj, f"{base}/args", None) is None:
        entries = [x for flag, tok in changes.items() if tok is not None for x in (flag, tok)]
        return resource_version_guard(obj) + ([op_add(f"{base}/args", entries)] if entries else [])
    ops: list[dict[str, Any]] = [op_test(f"{base}/args", args)]
    removes: list[int] = []
    appends: list[str] = []
    for flag, tok in changes.items():
        hit = _find(args, flag, where)
        if hit is None:
            appends += [flag, tok] if tok is not None else []
            continue
        i, inline = hit
        if tok is None:
            removes += [i] if inline else [i - 1, i]
        else:
            ops.append(op_replace(f"{base}/args/{i}", f"{flag}={tok}" if inline else tok))
    ops += [op_remove(f"{base}/args/{j}") for j in sorted(removes, reverse=True)]
    ops += [op_add(f"{base}/args/-", x) for x in appends]
    return ops
