"""Exposition text -> samples. Pure functions, no I/O.

Reads the classic Prometheus text format (0.0.4) and OpenMetrics 1.0 text with one line parser:
both share the sample-line grammar; OpenMetrics adds `# EOF`, `# UNIT`, float timestamps and
exemplars (` # {...} v [ts]` after the value), which are accepted and dropped.

- Names keep their colons (`vllm:prefix_cache_hits_total`).
- `_created` series are ordinary samples here; the mappings simply never ask for them.
- Duplicate families (the same `# TYPE` twice) are accepted; samples are kept in order.
- `NaN`, `+Inf`, `-Inf` parse as floats; judging them is the normaliser's job. Digit separators
  (`1_000_000`), which Python's float() takes, are refused as prometheus_client refuses them.
- A payload declared OpenMetrics (`openmetrics=True`, from its Content-Type) must end with
  `# EOF`: without it the payload was cut short and is refused; nothing may follow `# EOF`.

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

# Every pattern below is linear in its input: possessive quantifiers (`*+`, `?+`) never give back
# what they matched, label values are an unrolled loop (`[^"\\]*+(?:\\.[^"\\]*+)*+`, no
# alternation inside a repeat, so no per-character backtracking state), and labels need a comma
# between them (as in Prometheus and prometheus_client), so a run of spaces has one reading only.
# tests/test_parse_hostile.py counts the regex engine's steps on adversarial lines.
_VALUE = r'"([^"\\\n]*+(?:\\.[^"\\\n]*+)*+)"'
_LABEL = r'[a-zA-Z_][a-zA-Z0-9_]*+[ \t]*+=[ \t]*+"[^"\\\n]*+(?:\\.[^"\\\n]*+)*+"'
_BLOCK = (r"[ \t]*+(?:" + _LABEL + r"(?:[ \t]*+,[ \t]*+" + _LABEL + r")*+[ \t]*+,?+[ \t]*+)?+")
# name, optional label block, value, optional timestamp, optional exemplar
_LINE = re.compile(
    r"([a-zA-Z_:][a-zA-Z0-9_:]*+)"
    r"(?:\{(" + _BLOCK + r")\})?+"
    r"[ \t]++([^ \t#]++)"
    r"(?:[ \t]++([-+]?+[0-9.eE+-]++))?+"
    r"[ \t]*+(?:#[ \t]*+\{.*+)?+"
)
_NAME = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*+")
_GOOD_NAMES: set[str] = set()
_CACHED_NAME_CHARS = 200
_LABELS = re.compile(_BLOCK)
_LABEL_PAIR = re.compile(r"([a-zA-Z_][a-zA-Z0-9_]*+)[ \t]*+=[ \t]*+" + _VALUE)
_METRIC_TYPES = frozenset(
    {"counter", "gauge", "histogram", "summary", "untyped", "unknown", "info", "stateset", "gaugehistogram"}
)
_ESCAPES = {"\\\\": "\\", '\\"': '"', "\\n": "\n"}
_ESCAPE = re.compile(r'\\[\\"n]')


class ParseError(ValueError):
    """The payload is not valid exposition text. `line` is 1-based.

    The message names the line number and what is wrong, never the line's text: a payload is
    untrusted input and errors end up in /snapshot, /metrics labels and logs."""

    reason = "parse_error"

    def __init__(self, line: int, why: str) -> None:
        super().__init__(f"line {line}: {why}")
        self.line = line
        self.why = why


class LimitExceeded(ParseError):
    """The payload breaks one of the per-target `Limits`; `reason` is the Prometheus-style fault
    (`sample_limit`, `label_limit`, `label_length`), or `metric_name_length` for a metric name
    longer than the label value limit (the name is the `__name__` label's value)."""

    def __init__(self, line: int, reason: str, why: str) -> None:
        super().__init__(line, why)
        self.reason = reason


@dataclass(frozen=True, slots=True)
class Limits:
    """Per-target limits, as Prometheus' scrape config has them; 0 means unlimited."""

    samples: int = 0  # sample lines per payload (sample_limit)
    labels: int = 0  # labels per series (label_limit)
    label_name_length: int = 0  # characters (label_name_length_limit)
    label_value_length: int = 0  # characters, after unescaping (label_value_length_limit)


NO_LIMITS = Limits()


@dataclass(slots=True)
class Payload:
    """The parsed content of one /metrics response."""

    by_name: dict[str, list[Sample]] = field(default_factory=dict)
    types: dict[str, str] = field(default_factory=dict)  # family name -> declared type
    lines: int = 0  # sample lines seen (wanted or not)
    openmetrics: bool = False
    duplicates: int = 0  # wanted samples whose name and label set were already seen (dropped)

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


def check_labels(labels: dict[str, str], limits: Limits, lineno: int) -> None:
    """Raise LimitExceeded when one series' labels break `limits`."""
    if limits.labels and len(labels) > limits.labels:
        raise LimitExceeded(lineno, "label_limit", f"{len(labels)} labels > label_limit {limits.labels}")
    if limits.label_name_length or limits.label_value_length:
        for key, value in labels.items():
            if limits.label_name_length and len(key) > limits.label_name_length:
                raise LimitExceeded(lineno, "label_length",
                                    f"label name of {len(key)} chars > {limits.label_name_length}")
            if limits.label_value_length and len(value) > limits.label_value_length:
                raise LimitExceeded(lineno, "label_length",
                                    f"label value of {len(value)} chars > {limits.label_value_length}")


def parse(text: str, wanted: Container[str] | None = None, limits: Limits = NO_LIMITS,
          openmetrics: bool = False) -> Payload:
    """Parse exposition text. Only samples whose name is in `wanted` are kept (all if None).
    `openmetrics`: the payload was served as OpenMetrics, so it must end with `# EOF`.

    Raises ParseError on the first malformed line and LimitExceeded (a ParseError) on the first
    line over `limits`; every line is held to the limits, wanted or not. A wanted sample whose
    name and label set were already seen is dropped and counted in `Payload.duplicates`."""
    out = Payload()
    by_name = out.by_name
    good_names = _GOOD_NAMES  # names already checked against the grammar (shared, bounded)
    if len(good_names) > 100_000:
        good_names.clear()
    max_samples = limits.samples
    label_limited = bool(limits.labels or limits.label_name_length or limits.label_value_length)
    # a line shorter than this cannot hold a label name or value over the length limits
    short_line = min(x for x in (limits.label_name_length, limits.label_value_length, 1 << 62) if x)
    seen: dict[str, set] = {}
    lines = 0
    eof = 0
    all_lines = text.split("\n")
    for lineno, line in enumerate(all_lines, 1):
        if not line:
            continue
        if line[0] == "#":
            if line.startswith("# HELP"):
                continue
            _comment(line, lineno, out)
            if out.openmetrics and line.startswith("# EOF"):
                eof = lineno
                break
            continue
        if line[-1] == "\r":
            line = line[:-1]
            if not line:
                continue
        lines += 1
        if max_samples and lines > max_samples:
            raise LimitExceeded(lineno, "sample_limit", f"more than sample_limit {max_samples} samples")
        brace = line.find("{")
        space = line.find(" ")
        name = line[:brace] if brace != -1 and (space == -1 or brace < space) else line[:space]
        if name not in good_names:
            if _NAME.fullmatch(name) is None:
                if not line.strip():
                    lines -= 1
                    continue
                raise ParseError(lineno, "bad metric name" if name else "not a sample line")
            if limits.label_value_length and len(name) > limits.label_value_length:  # __name__ is a label
                raise LimitExceeded(lineno, "metric_name_length",
                                    f"metric name of {len(name)} chars > {limits.label_value_length}")
            if len(name) <= _CACHED_NAME_CHARS:  # the cache stays small whatever targets send
                good_names.add(name)
        if wanted is not None and name not in wanted:
            # not needed: check it ends in a number (value, timestamp or exemplar value) and that
            # it keeps to the label limits (cheap bounds first; the full grammar only when needed)
            if label_limited and brace != -1 and (
                    len(line) > short_line or (limits.labels and line.count("=") > limits.labels)):
                m = _LINE.fullmatch(line)
                if m is None:
                    raise ParseError(lineno, "not a sample line")
                check_labels(parse_labels(m.group(2) or ""), limits, lineno)
            try:
                float(line[line.rfind(" ") + 1:])
                after = line[line.rfind("}") + 1:] if brace != -1 else line[len(name):]
                if "_" in after.partition("#")[0]:
                    raise ValueError  # a digit separator in the value or timestamp
            except ValueError:
                m = _LINE.fullmatch(line)
                if m is None:
                    raise ParseError(lineno, "not a sample line") from None
                _value(m.group(3), lineno)
                if m.group(4):
                    _value(m.group(4), lineno)
            continue
        parsed = _split(line)
        if parsed is None:  # unusual spacing, quotes or braces inside values: the full grammar
            m = _LINE.fullmatch(line)
            if m is None:
                raise ParseError(lineno, "not a sample line")
            parsed = (m.group(1), m.group(2) or "", m.group(3), m.group(4))
        name, block, value_text, ts_text = parsed
        value = _value(value_text, lineno)
        if block and _LABELS.fullmatch(block) is None:
            raise ParseError(lineno, "bad label set")
        ts = _value(ts_text, lineno) if ts_text else None
        labels = parse_labels(block)
        if label_limited:
            check_labels(labels, limits, lineno)
        names_seen = seen.get(name)
        if names_seen is None:
            seen[name] = {frozenset(labels.items())}
            by_name[name] = [Sample(name, labels, value, ts)]
            continue
        ident = frozenset(labels.items())
        if ident in names_seen:
            out.duplicates += 1
            continue
        names_seen.add(ident)
        by_name[name].append(Sample(name, labels, value, ts))
    if eof and any(rest.strip() for rest in all_lines[eof:]):
        raise ParseError(eof + 1, "content after # EOF")
    if openmetrics and not eof:
        raise ParseError(len(all_lines), "OpenMetrics payload without # EOF (cut short)")
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


def _value(text: str, lineno: int) -> float:
    if "_" in text:
        raise ParseError(lineno, "bad value (digit separator)")
    try:
        return float(text)
    except ValueError:
        raise ParseError(lineno, "bad value") from None


def _comment(line: str, lineno: int, out: Payload) -> None:
    if line.startswith("# TYPE "):
        parts = line.split()
        if len(parts) != 4 or parts[3] not in _METRIC_TYPES:
            raise ParseError(lineno, "bad TYPE line")
        out.types[parts[2]] = parts[3]
    elif line.startswith(("# EOF", "# UNIT ")):
        out.openmetrics = True
