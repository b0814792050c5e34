"""PromQL helpers: label selectors for the template variables, template expansion (what Grafana
does before it sends a query), and metric-name extraction for the catalogue check. Pure functions."""
from __future__ import annotations

import re
from collections.abc import Mapping

# Template variables every dashboard offers, in the order they filter.
SCOPE_VARIABLES: tuple[str, ...] = ("namespace", "model", "pod")

KEYWORDS = frozenset({
    "by", "without", "on", "ignoring", "group_left", "group_right", "bool", "and", "or", "unless",
    "offset", "atan2", "inf", "nan", "start", "end",
})
_STRING = re.compile(r'"(?:[^"\\]|\\.)*"|\'(?:[^\'\\]|\\.)*\'')
_BRACES = re.compile(r"\{[^{}]*\}")
_BRACKETS = re.compile(r"\[[^\[\]]*\]")
_IDENT = re.compile(r"[A-Za-z_:][A-Za-z0-9_:]*")
_GROUPING = re.compile(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^()]*\)")
_VARIABLE = re.compile(r"\$\{(\w+)(?::\w+)?\}|\$(\w+)")


def selector(*matchers: str, scope: tuple[str, ...] = SCOPE_VARIABLES) -> str:
    """`{namespace=~"$namespace", model=~"$model", pod=~"$pod", <matchers>}` for the given scope."""
    parts = [f'{name}=~"${name}"' for name in scope] + list(matchers)
    return "{" + ", ".join(parts) + "}"


def eq(label: str, value: str) -> str:
    """An equality matcher, `label="value"`."""
    return f'{label}="{value}"'


def expand(expr: str, variables: Mapping[str, str]) -> str:
    """Replace `$name` and `${name}` as Grafana would. Unknown variables are an error, so a typo in a
    dashboard cannot reach Prometheus as a literal `$typo`."""

    def sub(m: re.Match[str]) -> str:
        name = m.group(1) or m.group(2)
        if name not in variables:
            raise KeyError(f"unknown template variable ${name} in {expr!r}; known: {sorted(variables)}")
        return variables[name]

    return _VARIABLE.sub(sub, expr)


def metric_names(expr: str) -> set[str]:
    """Names of the series an expression selects (functions, keywords and labels excluded).

    Works by elimination on a tokenised copy: strings, label matchers, range/offset brackets and
    grouping clauses go first; an identifier followed by `(` is a function; what remains are names.
    """
    text = _STRING.sub('""', expr)
    text = _BRACES.sub(" ", text)
    text = _BRACKETS.sub(" ", text)
    text = _GROUPING.sub(" ", text)
    names: set[str] = set()
    for m in _IDENT.finditer(text):
        word = m.group(0)
        rest = text[m.end():].lstrip()
        if rest.startswith("("):
            continue  # a function call
        if word.lower() in KEYWORDS:
            continue
        before = text[: m.start()]
        if before.endswith("$") or re.search(r"[0-9.]$", before):
            continue  # a template variable or part of a number/duration such as 1e3 or 5m
        names.add(word)
    return names
