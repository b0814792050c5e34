"""Exposition text -> samples. Pure functions, no I/O.

Reads the classic Prometheus text format (0.0.4) and OpenMetrics 1.0 text with one line parser:
both share the sample-line grammar; OpenMetrics adds `# EOF`, `# UNIT`, float timestamps and
exemplars (` # {...} v [ts]` after the value), which are accepted and dropped.

- Names keep their colons (`vllm:prefix_cache_hits_total`).
- `_created` series are ordinary samples here; the mappings simply never ask for them.
- Duplicate families (the same `# TYPE` twice) are accepted; samples are kept in order.
- `NaN`, `+Inf`, `-Inf` parse as floats; judging them is the normaliser's job.

Speed: common lines are split with plain string operations (the full grammar regex is the
fallback for unusual ones), and a caller that only needs some names passes `wanted`: every line's
name is checked and must end in a number, but label sets are only validated and decoded for
wanted names. That keeps the agent's
parse+normalise path several times faster than prometheus_client's parser, which remains the
oracle in the tests.

Strictness follows Prometheus: one malformed line fails the whole payload (`ParseError` names the
line), because a half-read payload would silently skew counters.
"""
from __future__ import annotations

import re
from collections.abc import Container
from dataclasses import dataclass, field

from contracts.tier_model import Sample

# name, optional label block, value, optional timestamp, optional exemplar
_LABEL = r'[a-zA-Z_][a-zA-Z0-9_]*[ \t]*=[ \t]*"(?:[^"\\\n]|\\.)*"'
_LINE = re.compile(
    r"([a-zA-Z_:][a-zA-Z0-9_:]*)"
    r"(?:\{[ \t]*((?:" + _LABEL + r"[ \t]*,?[ \t]*)*)\})?"
    r"[ \t]+([^ \t#]+)"
    r"(?:[ \t]+([-+]?[0-9.eE+-]+))?"
    r"[ \t]*(?:#[ \t]*\{.*)?$"
)
_NAME = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*")
_GOOD_NAMES: set[str] = set()
_LABELS = re.compile(r"[ \t]*(?:" + _LABEL + r"[ \t]*,?[ \t]*)*")
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
    good_names = _GOOD_NAMES  # names already checked against the grammar (shared, bounded)
    if len(good_names) > 100_000:
        good_names.clear()
    lines = 0
    for lineno, line in enumerate(text.split("\n"), 1):
        if not line:
            continue
        if line[0] == "#":
            if line.startswith("# HELP"):
                continue
            _comment(line, lineno, out)
            if out.openmetrics and line.startswith("# EOF"):
                break
            continue
        if line[-1] == "\r":
            line = line[:-1]
            if not line:
                continue
        lines += 1
        brace = line.find("{")
        space = line.find(" ")
        name = line[:brace] if brace != -1 and (space == -1 or brace < space) else line[:space]
        if name not in good_names:
            if _NAME.fullmatch(name) is None:
                if not line.strip():
                    lines -= 1
                    continue
                raise ParseError(lineno, line, f"bad metric name {name!r}" if name else "not a sample line")
            good_names.add(name)
        if wanted is not None and name not in wanted:
            # not needed: check it ends in a number (value, timestamp or exemplar value)
            try:
                float(line[line.rfind(" ") + 1:])
            except ValueError:
                m = _LINE.match(line)
                if m is None:
                    raise ParseError(lineno, line, "not a sample line") from None
                _value(m.group(3), lineno, line)
            continue
        parsed = _split(line)
        if parsed is None:  # unusual spacing, quotes or braces inside values: the full grammar
            m = _LINE.match(line)
            if m is None:
                raise ParseError(lineno, line, "not a sample line")
            parsed = (m.group(1), m.group(2) or "", m.group(3), m.group(4))
        name, block, value_text, ts_text = parsed
        value = _value(value_text, lineno, line)
        if block and _LABELS.fullmatch(block) is None:
            raise ParseError(lineno, line, "bad label set")
        ts = _value(ts_text, lineno, line) if ts_text else None
        sample = Sample(name, parse_labels(block), value, ts)
        group = by_name.get(name)
        if group is None:
            by_name[name] = [sample]
        else:
            group.append(sample)
    out.lines = lines
    return out


def _split(line: str) -> tuple[str, str, str, str | None] | None:
    """Fast split of a common sample line into (name, label block, value, timestamp); None when
    the line needs the full grammar. Raises nothing: validation is the caller's."""
    if "\t" in line:
        return None
    brace = line.find("{")
    space = line.find(" ")
    if brace != -1 and (space == -1 or brace < space):
        close = line.find("}", brace)
        if close == -1:
            return None
        block = line[brace + 1:close]
        if block.count('"') % 2 or "\\" in block:
            return None
        name, rest = line[:brace], line[close + 1:]
    else:
        if space == -1:
            return None
        name, block, rest = line[:space], "", line[space:]
    parts = rest.split()
    if not parts or not rest.startswith(" "):
        return None
    if len(parts) == 1:
        return name, block, parts[0], None
    if parts[1] == "#":  # OpenMetrics exemplar
        return name, block, parts[0], None
    if len(parts) == 2:
        return name, block, parts[0], parts[1]
    if parts[2] == "#":
        return name, block, parts[0], parts[1]
    return None


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
    elif line.startswith(("# EOF", "# UNIT ")):
        out.openmetrics = True
