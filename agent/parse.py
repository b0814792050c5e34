"""Exposition text -> samples. Pure functions, no I/O.

Reads the classic Prometheus text format (0.0.4) and OpenMetrics 1.0 text with one line parser:
both share the sample-line grammar; OpenMetrics adds `# EOF`, `# UNIT`, float timestamps and
exemplars (` # {...} v [ts]` after the value), which are accepted and dropped.

- Names keep their colons (`vllm:prefix_cache_hits_total`).
- `_created` series are ordinary samples here; the mappings simply never ask for them.
- Duplicate families (the same `# TYPE` twice) are accepted; samples are kept in order.
- `NaN`, `+Inf`, `-Inf` parse as floats; judging them is the normaliser's job.

Speed: a caller that only needs some names passes `wanted`. Every line is still fully checked
against the grammar, but labels are only decoded for wanted names. That keeps the agent's
parse+normalise path several times faster than prometheus_client's parser, which remains the
oracle in the tests.

Strictness follows Prometheus: one malformed line fails the whole payload (`ParseError` names the
line), because a half-read payload would silently skew counters.
"""
from __future__ import annotations

import re
from collections.abc import Container
from dataclasses import dataclass, field

from agent.model import Sample

# name, optional label block, value, optional timestamp, optional exemplar
_LABEL = r'[a-zA-Z_][a-zA-Z0-9_]*[ \t]*=[ \t]*"(?:[^"\\\n]|\\.)*"'
_LINE = re.compile(
    r"([a-zA-Z_:][a-zA-Z0-9_:]*)"
    r"(?:\{[ \t]*((?:" + _LABEL + r"[ \t]*,?[ \t]*)*)\})?"
    r"[ \t]+([^ \t#]+)"
    r"(?:[ \t]+([-+]?[0-9.eE+-]+))?"
    r"[ \t]*(?:#[ \t]*\{.*)?$"
)
_LABEL_PAIR = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)[ \t]*=[ \t]*"((?:[^"\\\n]|\\.)*)"')
_METRIC_TYPES = frozenset(
    {"counter", "gauge", "histogram", "summary", "untyped", "unknown", "info", "stateset", "gaugehistogram"}
)
_ESCAPES = {"\\\\": "\\", '\\"': '"', "\\n": "\n"}
_ESCAPE = re.compile(r'\\[\\"n]')


class ParseError(ValueError):
    """The payload is not valid exposition text. `line` is 1-based."""

    def __init__(self, line: int, text: str, why: str) -> None:
        shown = text if len(text) <= 120 else text[:117] + "..."
        super().__init__(f"line {line}: {why}: {shown!r}")
        self.line = line
        self.why = why


@dataclass(slots=True)
class Payload:
    """The parsed content of one /metrics response."""

    by_name: dict[str, list[Sample]] = field(default_factory=dict)
    types: dict[str, str] = field(default_factory=dict)  # family name -> declared type
    lines: int = 0  # sample lines seen (wanted or not)
    openmetrics: bool = False

    @property
    def samples(self) -> list[Sample]:
        return [s for group in self.by_name.values() for s in group]

    def __len__(self) -> int:
        return sum(len(group) for group in self.by_name.values())


def unescape(value: str) -> str:
    return _ESCAPE.sub(lambda m: _ESCAPES[m.group(0)], value) if "\\" in value else value


def parse_labels(block: str) -> dict[str, str]:
    """`a="1",b="x\\"y"` -> {'a': '1', 'b': 'x"y'}."""
    if not block:
        return {}
    if "\\" not in block:
        return dict(_LABEL_PAIR.findall(block))
    return {k: unescape(v) for k, v in _LABEL_PAIR.findall(block)}


def parse_value(text: str) -> float:
    """Exposition float: accepts NaN, +Inf, -Inf (any case) and Go-style numbers."""
    return float(text)


def parse(text: str, wanted: Container[str] | None = None) -> Payload:
    """Parse exposition text. Only samples whose name is in `wanted` are kept (all if None).

    Raises ParseError on the first malformed line."""
    out = Payload()
    by_name = out.by_name
    match = _LINE.match
    lines = 0
    for lineno, line in enumerate(text.split("\n"), 1):
        if not line:
            continue
        if line[0] == "#":
            _comment(line, lineno, out)
            if out.openmetrics and line.startswith("# EOF"):
                break
            continue
        if line[-1] == "\r":
            line = line[:-1]
            if not line:
                continue
        m = match(line)
        if m is None:
            if not line.strip():
                continue
            raise ParseError(lineno, line, "not a sample line")
        lines += 1
        name = m.group(1)
        if wanted is not None and name not in wanted:
            # still validate the value so garbage after a valid-looking name is caught
            _value(m.group(3), lineno, line)
            continue
        value = _value(m.group(3), lineno, line)
        ts_text = m.group(4)
        ts = float(ts_text) if ts_text else None
        sample = Sample(name, parse_labels(m.group(2) or ""), value, ts)
        group = by_name.get(name)
        if group is None:
            by_name[name] = [sample]
        else:
            group.append(sample)
    out.lines = lines
    return out


def _value(text: str, lineno: int, line: str) -> float:
    try:
        return float(text)
    except ValueError:
        raise ParseError(lineno, line, f"bad value {text!r}") from None


def _comment(line: str, lineno: int, out: Payload) -> None:
    if line.startswith("# TYPE "):
        parts = line.split()
        if len(parts) != 4 or parts[3] not in _METRIC_TYPES:
            raise ParseError(lineno, line, "bad TYPE line")
        out.types[parts[2]] = parts[3]
    elif line.startswith("# EOF"):
        out.openmetrics = True
    elif line.startswith("# UNIT "):
        out.openmetrics = True
