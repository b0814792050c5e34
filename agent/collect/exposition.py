"""The grammar of one exposition line, as Prometheus 2.42 reads it. Pure functions, no I/O.

Two formats, chosen by the caller (Prometheus picks by Content-Type):
- the classic text format (0.0.4): spaces and tabs may separate every token, a comma between
  labels is optional and a trailing one is allowed, timestamps are integer milliseconds, blank
  lines and `#` comments are ignored, a `#` after a sample is an error;
- OpenMetrics 1.0: exactly one space between tokens and nothing else, labels separated by single
  commas, float timestamps in seconds, exemplars (` # {...} value [ts]`) only on names ending in
  `_total` or `_bucket`, no blank lines and no comments other than `# HELP`, `# TYPE`, `# UNIT`,
  and a final `# EOF`.
In both: a value is a Go float (`NaN`, `Inf`, `+Inf`, `-Inf`, `Infinity` in any case; no digit
separators, hex or signed NaN; an overflow to infinity is an error), and a label name may appear
once per series (`__name__` never, the metric name is that label).

Every reader raises `GrammarError(why)` naming the problem, never echoing the line (a payload is
untrusted input; the message ends up in logs and /metrics labels).
"""
from __future__ import annotations

import math
import re

NAME = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*+")
_LVAL = r'"[^"\\]*+(?:\\.[^"\\]*+)*+"'
_LNAME = r"[a-zA-Z_][a-zA-Z0-9_]*+"
# the inside of a label block, up to (not including) its closing brace
_BLOCK_PROM = re.compile(r"[ \t]*+(?:" + _LNAME + r"[ \t]*+=[ \t]*+" + _LVAL + r"[ \t]*+(?:,[ \t]*+)?+)*+")
_BLOCK_OM = re.compile(r"(?:" + _LNAME + "=" + _LVAL + r"(?:," + _LNAME + "=" + _LVAL + r")*+)?+")
_SERIES_PROM = re.compile(r"([a-zA-Z_:][a-zA-Z0-9_:]*+)(?:[ \t]*+\{(" + _BLOCK_PROM.pattern + r")\})?+")
_SERIES_OM = re.compile(r"([a-zA-Z_:][a-zA-Z0-9_:]*+)(?:\{(" + _BLOCK_OM.pattern + r")\})?+")
_LABEL_PAIR = re.compile(r"(" + _LNAME + r")[ \t]*+=[ \t]*+\"([^\"\\]*+(?:\\.[^\"\\]*+)*+)\"")
_TOKEN_PROM = re.compile(r"[^{ \t]++")  # the classic lexer's value token
_TOKEN_PROM_TS = re.compile(r"[^ \t]++")
_WS = re.compile(r"[ \t]*+")
_PROM_META = re.compile(r"[ \t]*+#[ \t]++(HELP|TYPE)[ \t]++")
_ESCAPES = {"\\\\": "\\", '\\"': '"', "\\n": "\n"}
_ESCAPE = re.compile(r'\\[\\"n]')
PROM_TYPES = frozenset({"counter", "gauge", "histogram", "summary", "untyped"})
OM_TYPES = frozenset({"counter", "gauge", "histogram", "gaugehistogram", "summary", "info", "stateset", "unknown"})
EXEMPLAR_SUFFIXES = ("_total", "_bucket")
INT64_MAX = (1 << 63) - 1


class GrammarError(ValueError):
    """One line breaks the exposition grammar; the message says how."""


def go_float(text: str) -> float | None:
    """`text` as Go's strconv.ParseFloat reads it (Prometheus' value parser), or None."""
    try:
        x = float(text)
    except ValueError:
        return None
    # Python's float() also takes surrounding whitespace, digit separators, non-ASCII digits,
    # a signed NaN, and turns an overflow into infinity; Go takes none of these
    if not text.isascii() or "_" in text or text[0] <= " " or text[-1] <= " ":
        return None
    if math.isfinite(x):
        return x
    if math.isnan(x):
        return None if text[0] in "+-" else x
    return x if text.lstrip("+-")[:1] in ("i", "I") else None  # an infinity, not an overflow


def prom_timestamp(text: str) -> float | None:
    """A classic-format timestamp: decimal digits that fit an int64 (milliseconds)."""
    if not (text.isdigit() and text.isascii()) or (len(text) > 18 and int(text) > INT64_MAX):
        return None
    return float(text)


def om_timestamp(text: str) -> float | None:
    """An OpenMetrics timestamp: a finite float (seconds)."""
    x = go_float(text)
    return x if x is not None and math.isfinite(x) else None


def unescape(value: str) -> str:
    return _ESCAPE.sub(lambda m: _ESCAPES[m.group(0)], value) if "\\" in value else value


def labels_of(block: str) -> dict[str, str]:
    """The labels of a label block that matched the grammar (`a="1",b="x\\"y"`), each name once."""
    pairs = _LABEL_PAIR.findall(block)
    labels = {k: unescape(v) for k, v in pairs} if "\\" in block else dict(pairs)
    if len(labels) != len(pairs):
        raise GrammarError("label name repeated in one series")
    if "__name__" in labels:
        raise GrammarError("__name__ given as a label (it is the metric name)")
    return labels


def series_block(series: str, om: bool) -> tuple[str, str] | None:
    """(name, label block) of the series part of a sample (`name` or `name{...}`), or None when
    it is not one (the caller then reads the whole line with `read_sample`)."""
    m = (_SERIES_OM if om else _SERIES_PROM).fullmatch(series)
    return None if m is None else (m.group(1), m.group(2) or "")


def read_sample(line: str, om: bool) -> tuple[str, str, float, float | None]:
    """(name, label block, value, timestamp) of a whole sample line; raises GrammarError."""
    m = NAME.match(line)
    if m is None:
        if line[:1] in (" ", "\t"):
            raise GrammarError("whitespace before the metric name")
        raise GrammarError("bad metric name" if line[:1] not in ("\r", "") else "carriage return in a line")
    name, pos = m.group(), m.end()
    if not om:
        pos = _WS.match(line, pos).end()
    block = ""
    if line.startswith("{", pos):
        b = (_BLOCK_OM if om else _BLOCK_PROM).match(line, pos + 1)
        if not line.startswith("}", b.end()):
            raise GrammarError("bad label set")
        block, pos = line[pos + 1:b.end()], b.end() + 1
    if om:
        return (name, block, *_om_rest(line, pos, name))
    return (name, block, *_prom_rest(line, pos))


def _prom_rest(line: str, pos: int) -> tuple[float, float | None]:
    pos = _WS.match(line, pos).end()
    tok = _TOKEN_PROM.match(line, pos)
    if tok is None:
        raise GrammarError("no value")
    value = go_float(tok.group())
    if value is None:
        raise GrammarError(_bad_value(tok.group()))
    pos = _WS.match(line, tok.end()).end()
    if pos == len(line):
        return value, None
    tok = _TOKEN_PROM_TS.match(line, pos)
    ts = prom_timestamp(tok.group()) if tok else None
    if ts is None:
        if line.startswith("#", pos):
            raise GrammarError("a comment or exemplar after a sample (OpenMetrics only)")
        raise GrammarError("bad timestamp (integer milliseconds expected)")
    if _WS.match(line, tok.end()).end() != len(line):
        raise GrammarError("more than a value and a timestamp")
    return value, ts


def _om_rest(line: str, pos: int, name: str) -> tuple[float, float | None]:
    if not line.startswith(" ", pos):
        raise GrammarError("expected one space before the value")
    value_text, _, rest = line[pos + 1:].partition(" ")
    value = go_float(value_text)
    if value is None:
        raise GrammarError(_bad_value(value_text) if value_text else "two spaces before the value")
    if not _:
        return value, None
    ts = None
    if not rest.startswith("# {"):
        ts_text, _, rest = rest.partition(" ")
        ts = om_timestamp(ts_text)
        if ts is None:
            raise GrammarError("bad timestamp (a finite number of seconds expected)" if ts_text
                               else "trailing whitespace")
        if not _:
            return value, ts
        if not rest.startswith("# {"):
            raise GrammarError("more than a value and a timestamp" if rest else "trailing whitespace")
    _exemplar(rest[3:], name)
    return value, ts


def _exemplar(text: str, name: str) -> None:
    """The part of an OpenMetrics exemplar after ` # {`."""
    if not name.endswith(EXEMPLAR_SUFFIXES):
        raise GrammarError("exemplar on a metric that cannot have one (only _total and _bucket)")
    b = _BLOCK_OM.match(text)
    if not text.startswith("} ", b.end()):
        raise GrammarError("bad exemplar")
    value_text, _, ts_text = text[b.end() + 2:].partition(" ")
    if go_float(value_text) is None:
        raise GrammarError("bad exemplar value")
    if _ and om_timestamp(ts_text) is None:
        raise GrammarError("bad exemplar timestamp")


def _bad_value(text: str) -> str:
    if "\r" in text:
        return "carriage return after the value (CRLF line ends)"
    if "_" in text:
        return "bad value (digit separator)"
    return "bad value"


def prom_comment(line: str) -> tuple[str, str] | None:
    """A classic-format comment line (leading whitespace allowed): (family, type) for `# TYPE`,
    None for `# HELP` and plain comments."""
    m = _PROM_META.match(line)
    if m is None:
        return None
    n = NAME.match(line, m.end())
    if n is None:
        raise GrammarError(f"{m.group(1)} line without a metric name")
    if m.group(1) == "HELP":
        return None
    kind = line[n.end() + 1:]
    if kind not in PROM_TYPES:
        raise GrammarError("bad TYPE line (one of counter, gauge, histogram, summary, untyped expected)")
    return n.group(), kind


def om_comment(line: str) -> tuple[str, str] | None:
    """An OpenMetrics `#` line other than the final `# EOF`: (family, type) for `# TYPE`, None for
    `# HELP` and `# UNIT`."""
    word = line[2:6]
    if not line.startswith("# ") or word not in ("HELP", "TYPE", "UNIT") or line[6:7] != " ":
        if line == "# EOF":
            raise GrammarError("content after # EOF")
        raise GrammarError("comment line (OpenMetrics allows only HELP, TYPE, UNIT and EOF)")
    n = NAME.match(line, 7)
    if n is None:
        raise GrammarError(f"{word} line without a metric name")
    if line[n.end():n.end() + 1] != " ":
        raise GrammarError(f"bad {word} line (one space and the text expected after the name)")
    text = line[n.end() + 1:]
    if word == "TYPE":
        if text not in OM_TYPES:
            raise GrammarError("bad TYPE line (unknown type)")
        return n.group(), text
    if word == "UNIT" and text and not n.group().endswith("_" + text):
        raise GrammarError("bad UNIT line (the unit must end the metric name, after an underscore)")
    return None
