"""Exposition text -> samples. Pure functions, no I/O.

Reads the classic Prometheus text format (0.0.4) and OpenMetrics 1.0 text exactly as Prometheus
2.42 does (the grammar of one line is agent/collect/exposition.py): a payload Prometheus refuses
is refused here, with the line and the reason. The format comes from the Content-Type, as in
Prometheus (`openmetrics=True` for `application/openmetrics-text`); a caller without one
(`openmetrics=None`) gets OpenMetrics when a line is exactly `# EOF`.

- Names keep their colons (`vllm:prefix_cache_hits_total`).
- `_created` series are ordinary samples here; the mappings simply never ask for them.
- Duplicate families (the same `# TYPE` twice) are accepted; samples are kept in order. A series
  seen twice keeps its first sample (Prometheus drops the later one as a duplicate too).
- `NaN`, `+Inf`, `-Inf` parse as floats; judging them is the normaliser's job.
- Exemplars are checked and dropped; timestamps are kept as written (milliseconds in the classic
  format, seconds in OpenMetrics).
- Deliberately stricter than Prometheus in two corners: a NUL byte at the start of a line (which
  Prometheus' classic lexer takes as the end of the input) and a raw line break inside a quoted
  label value are refused.

Speed: Prometheus keeps a per-target cache from the series text (`name{labels}`) to its parsed
labels; so does this parser, shared by all targets and bounded, because the series text of a pod
repeats from one scrape to the next (and across the pods of one model). A line whose series is
cached costs one split and one float check; a caller that only needs some names passes `wanted`:
every line is still held to the whole grammar, but only wanted samples are built. That keeps the
agent's parse+normalise path several times faster than prometheus_client's parser, which remains
an oracle in the tests.

Strictness follows Prometheus: one malformed line fails the whole payload (`ParseError` names the
line), because a half-read payload would silently skew counters.
"""
from __future__ import annotations

from collections.abc import Container, Sequence
from dataclasses import dataclass, field
from typing import NamedTuple

from agent.collect.exposition import (
    GrammarError,
    go_float,
    labels_of,
    om_comment,
    om_timestamp,
    prom_comment,
    prom_timestamp,
    read_sample,
    series_block,
)
from contracts.tier_model import Sample

_CACHE_ENTRIES = 50_000  # series and comment lines remembered (all cleared when full: ~45 MB at most)
_CACHED_CHARS = 256  # longer series or comment lines are never cached


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


class _Series(NamedTuple):
    """What a series text (`name{labels}`) holds, parsed once."""

    name: str
    labels: dict[str, str]  # never handed out: samples get a copy
    chars: int  # characters of its label block: no label name or value is longer


# (format, limits) -> series text -> _Series, for series within those limits; and format ->
# comment line -> its TYPE (or None)
_SERIES: dict[tuple[bool, Limits], dict[str, _Series]] = {}
_COMMENTS: dict[bool, dict[str, tuple[str, str] | None]] = {False: {}, True: {}}


def forget_series() -> None:
    """Empty the parser's series cache (benchmarks: the cost of a target's first scrape)."""
    _SERIES.clear()
    for cache in _COMMENTS.values():
        cache.clear()


def _caches(om: bool, limits: Limits) -> tuple[dict[str, _Series], dict[str, tuple[str, str] | None], int]:
    """The caches for one payload and how many entries they may still take."""
    used = sum(map(len, _SERIES.values())) + sum(map(len, _COMMENTS.values()))
    if len(_SERIES) > 16 or used >= _CACHE_ENTRIES:
        forget_series()
        used = 0
    return _SERIES.setdefault((om, limits), {}), _COMMENTS[om], _CACHE_ENTRIES - used


def parse(text: str, wanted: Container[str] | None = None, limits: Limits = NO_LIMITS,
          openmetrics: bool | None = None) -> Payload:
    """Parse exposition text. Only samples whose name is in `wanted` are kept (all if None).
    `openmetrics`: the payload was served as OpenMetrics (it must then end with `# EOF`); None
    when the Content-Type is unknown (OpenMetrics if a line is exactly `# EOF`).

    Raises ParseError on the first malformed line and LimitExceeded (a ParseError) on the first
    line over `limits`; every line is held to the grammar and the limits, wanted or not. A wanted
    sample whose name and label set were already seen is dropped and counted in
    `Payload.duplicates`."""
    om = _is_openmetrics(text) if openmetrics is None else openmetrics
    lines = _om_body(text) if om else text.split("\n")
    out = Payload(openmetrics=om)
    series_cache, comment_cache, room = _caches(om, limits)
    if _read_known(lines, om, wanted, limits.samples, series_cache, comment_cache, out):
        return out
    types = out.types
    max_samples = limits.samples
    limited = limits != NO_LIMITS
    seen: dict[str, set] = {}
    count = 0
    for lineno, line in enumerate(lines, 1):
        if not line:
            if om:
                raise ParseError(lineno, "blank line (OpenMetrics has none)")
            continue
        first = line[0]
        if first == "#" or (not om and first in " \t" and line.lstrip(" \t")[:1] in ("#", "")):
            kind = comment_cache.get(line, False)
            if kind is False:
                kind = _comment(line, lineno, om)
                if room > 0 and len(line) <= _CACHED_CHARS:
                    comment_cache[line] = kind
                    room -= 1
            if kind is not None:
                types[kind[0]] = kind[1]
            continue
        count += 1
        if max_samples and count > max_samples:
            raise LimitExceeded(lineno, "sample_limit", f"more than sample_limit {max_samples} samples")
        # fast path: `series value [timestamp]` with single spaces and a series seen before
        value = ts = None
        if om and " # {" in line:
            series = None
        elif "{" in line:
            close = line.rfind("}") + 1
            series, rest = line[:close], line[close:]
        else:
            space = line.find(" ")
            series, rest = (line[:space], line[space:]) if space > 0 else (None, "")
        info = series_cache.get(series) if series else None
        fresh = info is None and series
        if fresh:
            info = _new_series(series, om, lineno)
        if info is not None:
            parts = rest.split(" ")
            if 2 <= len(parts) <= 3 and not parts[0]:
                text_value = parts[1]
                try:
                    value = float(text_value)
                except ValueError:
                    value = None
                # what Go's parser takes and Python's too, finite: nothing more to check
                if value is not None and not (value - value == 0.0 and text_value.isascii() and "_" not in text_value
                                              and text_value[-1] > " " and text_value[0] > " "):
                    value = go_float(text_value)
                if len(parts) == 3 and value is not None:
                    ts = (om_timestamp if om else prom_timestamp)(parts[2])
                    if ts is None:
                        value = None
        if value is None:  # anything else: the whole line through the grammar
            info, value, ts = _slow_line(line, lineno, om)
            if limited:
                _check_series(info, limits, lineno)
        elif fresh:
            if limited:
                _check_series(info, limits, lineno)
            if room > 0 and len(series) <= _CACHED_CHARS:  # the cache holds series within the limits only
                series_cache[series] = info
                room -= 1
        if wanted is None or info.name in wanted:
            _keep(out, seen, info, value, ts)
    out.lines = count
    return out


def _read_known(lines: list[str], om: bool, wanted: Container[str] | None, max_samples: int,
                series_cache: dict[str, _Series], comment_cache: dict[str, tuple[str, str] | None],
                out: Payload) -> bool:
    """The whole payload at once, when every line is a comment or a `series value` line whose
    series is cached (what a target's every scrape after its first is): one pass of C-level
    list operations per step instead of a Python loop per line. Fills `out` and returns True;
    returns False at the first line that needs more (the line loop then reads the payload, with
    exact errors). Same results as the loop: a cached series passed the grammar and the limits,
    and `series + " " + value` is the whole line."""
    comments = [line for line in lines if line[:1] == "#"]
    samples = [line for line in lines if line and line[0] != "#"]
    if (om and len(comments) + len(samples) != len(lines)) or (max_samples and len(samples) > max_samples):
        return False  # a blank OpenMetrics line, or over sample_limit: the loop names the line
    if not all(map(comment_cache.__contains__, comments)):
        return False
    parts = [line.rpartition(" ") for line in samples]
    infos = list(map(series_cache.get, [p[0] for p in parts]))
    if None in infos:
        return False
    values = bulk_values([p[2] for p in parts])
    if values is None:
        return False
    for kind in map(comment_cache.__getitem__, comments):
        if kind is not None:
            out.types[kind[0]] = kind[1]
    seen: dict[str, set] = {}
    pairs = zip(infos, values, strict=True)
    for info, value in (pairs if wanted is None else [(i, v) for i, v in pairs if i.name in wanted]):
        _keep(out, seen, info, value, None)
    out.lines = len(samples)
    return True


def bulk_values(texts: Sequence[str]) -> list[float] | None:
    """The values of `value` tokens (each a classic sample's whole text after its series and one
    space), or None when one of them needs the line loop (which then names the problem or reads
    it): C-level operations over all of them instead of a check per token."""
    try:
        values = list(map(float, texts))
    except ValueError:
        return None
    joined = "".join(texts)  # what Python's float() takes beyond Go's: whitespace, controls, `_`, non-ASCII
    if not (joined.isascii() and joined.isprintable()) or "_" in joined:
        return None
    total = sum(values)
    if total - total != 0.0 and any(go_float(t) is None for t, v in zip(texts, values, strict=True)
                                    if v - v != 0.0):
        return None  # a signed NaN or an overflow (a finite sum that overflows only costs this check)
    return values


def plain_series(series: str, limits: Limits) -> _Series | None:
    """The parsed series text `name{labels}` of a classic sample within `limits` (from the cache
    when it is there), or None when `series` is not one."""
    info = _SERIES.get((False, limits), {}).get(series)
    if info is not None:
        return info
    try:
        info = _new_series(series, False, 0)
        if info is not None and limits != NO_LIMITS:
            _check_series(info, limits, 0)
    except ParseError:
        return None
    return info


def _keep(out: Payload, seen: dict[str, set], info: _Series, value: float, ts: float | None) -> None:
    """Add one wanted sample, unless its series was already seen (counted, the first kept)."""
    name, labels = info.name, info.labels
    ident = frozenset(labels.items())
    names_seen = seen.get(name)
    if names_seen is None:
        seen[name] = {ident}
        out.by_name[name] = [Sample(name, labels.copy(), value, ts)]
    elif ident in names_seen:
        out.duplicates += 1
    else:
        names_seen.add(ident)
        out.by_name[name].append(Sample(name, labels.copy(), value, ts))


def _is_openmetrics(text: str) -> bool:
    return text.startswith("# EOF") and text[5:6] in ("", "\n") or "\n# EOF\n" in text or text.endswith("\n# EOF")


def _om_body(text: str) -> list[str]:
    """The lines of an OpenMetrics payload before its final `# EOF` (which may end the text with
    or without a line break); raises ParseError when the payload does not end so."""
    lines = text.split("\n")
    if lines[-1] == "# EOF":
        return lines[:-1]
    if len(lines) > 1 and lines[-1] == "" and lines[-2] == "# EOF":
        return lines[:-2]
    if "# EOF" in lines:
        raise ParseError(lines.index("# EOF") + 2, "content after # EOF")
    raise ParseError(len(lines), "OpenMetrics payload without # EOF (cut short)")


def _comment(line: str, lineno: int, om: bool) -> tuple[str, str] | None:
    try:
        return om_comment(line) if om else prom_comment(line)
    except GrammarError as exc:
        raise ParseError(lineno + (str(exc) == "content after # EOF"), str(exc)) from None


def _new_series(series: str, om: bool, lineno: int) -> _Series | None:
    """The parsed series text; None when it is not a plain `name{labels}` (the whole line is
    then read by the grammar, which names the problem)."""
    parts = series_block(series, om)
    if parts is None:
        return None
    name, block = parts
    try:
        return _Series(name, labels_of(block) if block else {}, len(block))
    except GrammarError as exc:
        raise ParseError(lineno, str(exc)) from None


def _slow_line(line: str, lineno: int, om: bool) -> tuple[_Series, float, float | None]:
    try:
        name, block, value, ts = read_sample(line, om)
        labels = labels_of(block) if block else {}
    except GrammarError as exc:
        raise ParseError(lineno, str(exc)) from None
    return _Series(name, labels, len(block)), value, ts


def _check_series(info: _Series, limits: Limits, lineno: int) -> None:
    name, labels, chars = info
    if limits.label_value_length and len(name) > limits.label_value_length:  # __name__ is a label
        raise LimitExceeded(lineno, "metric_name_length",
                            f"metric name of {len(name)} chars > {limits.label_value_length}")
    if limits.labels and len(labels) > limits.labels:
        raise LimitExceeded(lineno, "label_limit", f"{len(labels)} labels > label_limit {limits.labels}")
    most = limits.label_name_length
    if most and chars > most and (longest := max(map(len, labels))) > most:
        raise LimitExceeded(lineno, "label_length", f"label name of {longest} chars > {most}")
    most = limits.label_value_length
    if most and chars > most and (longest := max(map(len, labels.values()))) > most:
        raise LimitExceeded(lineno, "label_length", f"label value of {longest} chars > {most}")
