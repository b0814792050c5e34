"""Exposition payloads and what a real Prometheus 2.42 does with each: the conformance suite of
the agent's parser (agent/collect/parse.py).

Each case is one payload in one format: `prom` is the classic text format (served as
`text/plain; version=0.0.4`), `om` is OpenMetrics 1.0 (served as `application/openmetrics-text`;
Prometheus picks its parser from the Content-Type, and so does the agent). `accepted` is the
verdict of Prometheus 2.42 scraping the payload: True when the scrape succeeds, False when the
target goes down with a parse error. The cases were written from the exposition-format and
OpenMetrics specifications and from the grammar of Prometheus' own lexers and parsers
(model/textparse); every verdict is checked against the real server by
tests/test_parse_conformance.py (slow) and bench/exposition_conformance.py.

`STRICTER` names the few cases Prometheus accepts and the agent refuses on purpose (each with
why); the agent refuses every case Prometheus refuses.
"""
from __future__ import annotations

from dataclasses import dataclass

PROM = "prom"
OM = "om"
CONTENT_TYPES = {
    PROM: "text/plain; version=0.0.4; charset=utf-8",
    OM: "application/openmetrics-text; version=1.0.0; charset=utf-8",
}


@dataclass(frozen=True, slots=True)
class Case:
    id: str
    fmt: str  # PROM or OM
    body: str
    accepted: bool  # Prometheus 2.42's verdict


HEAD = "# HELP m_total A counter.\n# TYPE m_total counter\n"
OM_HEAD = "# HELP m A counter.\n# TYPE m counter\n"


def _prom(id_: str, body: str, accepted: bool) -> Case:
    return Case(f"prom-{id_}", PROM, body, accepted)


def _om(id_: str, body: str, accepted: bool, eof: bool = True) -> Case:
    return Case(f"om-{id_}", OM, body + ("# EOF\n" if eof else ""), accepted)


# (id, sample line, classic verdict, OpenMetrics verdict): the same line in both formats
SAMPLE_LINES: list[tuple[str, str, bool, bool]] = [
    ("plain", "m_total 1", True, True),
    ("labels", 'm_total{a="1",b="x"} 2', True, True),
    ("empty-braces", "m_total{} 1", True, True),
    ("escapes", r'm_total{a="q\"u",b="b\\s",c="n\nl"} 1', True, True),
    ("odd-escape-kept", r'm_total{a="x\ty"} 1', True, True),
    ("unicode-value", 'm_total{a="ünï ☃"} 1', True, True),
    ("raw-tab-in-value", 'm_total{a="x\ty"} 1', True, True),
    ("colon-name", "vllm:hits_total 1", True, True),
    ("leading-colon-name", ":m_total 1", True, True),
    ("underscore-name", "_m_total 1", True, True),
    ("timestamp-int", "m_total 1 1700000000000", True, True),
    ("timestamp-zero", "m_total 1 0", True, True),
    ("timestamp-float", "m_total 1 1700000000.5", False, True),
    ("timestamp-negative", "m_total 1 -1", False, True),
    ("timestamp-exponent", "m_total 1 1e3", False, True),
    ("timestamp-nan", "m_total 1 NaN", False, False),
    ("timestamp-inf", "m_total 1 +Inf", False, False),
    ("timestamp-int64-max", "m_total 1 9223372036854775807", True, True),
    ("timestamp-int64-overflow", "m_total 1 9223372036854775808", False, True),
    ("timestamp-huge", "m_total 1 1" + "0" * 30, False, True),
    ("timestamp-underscore", "m_total 1 1_000", False, False),
    ("value-negative", "m_total -1", True, True),
    ("value-leading-zeros", "m_total 007", True, True),
    ("timestamp-leading-zeros", "m_total 1 0017", True, True),
    ("value-plus", "m_total +1", True, True),
    ("value-exp", "m_total 1.5e+3", True, True),
    ("value-exp-upper", "m_total 1E3", True, True),
    ("value-dot-leading", "m_total .5", True, True),
    ("value-dot-trailing", "m_total 5.", True, True),
    ("value-dot-alone", "m_total .", False, False),
    ("value-nan", "m_total NaN", True, True),
    ("value-nan-lower", "m_total nan", True, True),
    ("value-nan-signed", "m_total +NaN", False, False),
    ("value-nan-minus", "m_total -nan", False, False),
    ("value-inf", "m_total +Inf", True, True),
    ("value-inf-bare", "m_total Inf", True, True),
    ("value-minus-inf", "m_total -Inf", True, True),
    ("value-infinity", "m_total -Infinity", True, True),
    ("value-infinit", "m_total Infinit", False, False),
    ("value-underscore", "m_total 1_000", False, False),
    ("value-hex", "m_total 0x10", False, False),
    ("value-hex-p", "m_total 0x1p3", False, False),
    ("value-overflow", "m_total 1e400", False, False),
    ("value-underflow", "m_total 1e-400", True, True),
    ("value-word", "m_total twelve", False, False),
    ("value-arabic-digits", "m_total \u0661\u0662", False, False),
    ("value-fullwidth-digit", "m_total \uff11", False, False),
    ("value-missing", "m_total", False, False),
    ("value-missing-labels", 'm_total{a="1"}', False, False),
    ("value-then-brace", "m_total 1{", False, False),
    ("three-fields", "m_total 1 2 3", False, False),
    ("trailing-space", "m_total 1 ", True, False),
    ("trailing-tab", "m_total 1\t", True, False),
    ("trailing-space-after-ts", "m_total 1 2 ", True, False),
    ("trailing-cr", "m_total 1\r", False, False),
    ("tab-separator", "m_total\t1", True, False),
    ("two-spaces", "m_total  1", True, False),
    ("leading-space", " m_total 1", False, False),  # the space becomes part of the name
    ("leading-tab", "\tm_total 1", False, False),
    ("space-before-brace", 'm_total {a="1"} 1', True, False),
    ("no-space-after-brace", 'm_total{a="1"}1', True, False),
    ("spaces-in-labels", 'm_total{ a = "1" , b="2" } 1', True, False),
    ("trailing-comma", 'm_total{a="1",} 1', True, False),
    ("no-comma", 'm_total{a="1" b="2"} 1', True, False),
    ("leading-comma", 'm_total{,a="1"} 1', False, False),
    ("double-comma", 'm_total{a="1",,b="2"} 1', False, False),
    ("lone-comma", "m_total{,} 1", False, False),
    ("repeated-label", 'm_total{a="1",a="2"} 1', False, False),
    ("repeated-label-same-value", 'm_total{a="1",b="2",a="1"} 1', False, False),
    ("name-label", 'm_total{__name__="m_total"} 1', False, False),
    ("other-name-label", 'm_total{__name__="x"} 1', False, False),
    ("label-digit-start", 'm_total{1a="1"} 1', False, False),
    ("label-colon", 'm_total{a:b="1"} 1', False, False),
    ("label-unquoted", "m_total{a=1} 1", False, False),
    ("label-single-quoted", "m_total{a='1'} 1", False, False),
    ("label-unterminated", 'm_total{a="1} 1', False, False),
    ("label-no-equals", 'm_total{a "1"} 1', False, False),
    ("brace-unclosed", 'm_total{a="1" 1', False, False),
    ("brace-doubled", 'm_total{a="1"}} 1', False, False),
    ("two-label-sets", 'm_total{a="1"}{b="2"} 1', False, False),
    ("name-digit-start", "1m_total 1", False, False),
    ("name-dash", "m-total 1", False, False),
    ("name-glued-value", "m_total-1", True, False),
    ("exemplar", 'm_total 1 # {trace_id="abc"} 1', False, True),
    ("exemplar-ts", 'm_total 1 # {trace_id="abc"} 1 1700000000.5', False, True),
    ("exemplar-after-ts", 'm_total 1 1700000000 # {trace_id="abc"} 1', False, True),
    ("exemplar-empty-labels", "m_total 1 # {} 1", False, True),
    ("exemplar-no-value", 'm_total 1 # {trace_id="abc"}', False, False),
    ("exemplar-nan-ts", 'm_total 1 # {trace_id="abc"} 1 NaN', False, False),
    ("exemplar-trailing-space", 'm_total 1 # {trace_id="abc"} 1 ', False, False),
    ("exemplar-no-space", 'm_total 1 #{trace_id="abc"} 1', False, False),
    ("exemplar-bad-value", 'm_total 1 # {trace_id="abc"} x', False, False),
    ("exemplar-on-gauge-name", 'm 1 # {trace_id="abc"} 1', False, False),
    ("exemplar-on-count", 'm_count 1 # {trace_id="abc"} 1', False, False),
    ("exemplar-on-created", 'm_created 1 # {trace_id="abc"} 1', False, False),
    ("exemplar-on-bucket", 'm_bucket{le="1"} 1 # {trace_id="abc"} 0.5', False, True),
    ("trailing-comment", "m_total 1 # a comment", False, False),
]

# whole payloads, classic format
PROM_CASES: list[Case] = [
    _prom("empty", "", True),
    _prom("no-final-newline", HEAD + "m_total 1", True),
    _prom("blank-line", HEAD + "m_total 1\n\nm_total{a=\"1\"} 2\n", True),
    _prom("blank-lines-only", "\n\n\n", True),
    _prom("whitespace-line", HEAD + "m_total 1\n \t \nm_total{a=\"1\"} 2\n", True),
    _prom("crlf", HEAD.replace("\n", "\r\n") + "m_total 1\r\n", False),
    _prom("crlf-blank", HEAD + "m_total 1\n\r\n", False),
    _prom("comment", "# just a comment\nm_total 1\n", True),
    _prom("comment-hash-only", "#\nm_total 1\n", True),
    _prom("comment-no-space", "#comment\nm_total 1\n", True),
    _prom("comment-indented", "  # comment\nm_total 1\n", True),
    _prom("help-no-text", "# HELP m_total\nm_total 1\n", True),
    _prom("help-space-no-text", "# HELP m_total \nm_total 1\n", True),
    _prom("help-bare", "# HELP\nm_total 1\n", True),
    _prom("help-bare-space", "# HELP \nm_total 1\n", False),
    _prom("help-bad-name", "# HELP 1m help\nm_total 1\n", False),
    _prom("help-glued", "# HELPm_total help\nm_total 1\n", True),
    _prom("help-tabs", "#\tHELP\tm_total\thelp\nm_total 1\n", True),
    _prom("help-escapes", "# HELP m_total a \\\\ b \\n c \\x\nm_total 1\n", True),
    _prom("type-ok", "# TYPE m_total counter\nm_total 1\n", True),
    _prom("type-all", "".join(f"# TYPE m{i} {t}\n" for i, t in
                              enumerate(("counter", "gauge", "histogram", "summary", "untyped"))), True),
    _prom("type-unknown", "# TYPE m unknown\nm 1\n", False),
    _prom("type-info", "# TYPE m info\nm 1\n", False),
    _prom("type-stateset", "# TYPE m stateset\nm 1\n", False),
    _prom("type-gaugehistogram", "# TYPE m gaugehistogram\nm 1\n", False),
    _prom("type-capital", "# TYPE m Counter\nm 1\n", False),
    _prom("type-misspelt", "# TYPE m countr\nm 1\n", False),
    _prom("type-missing", "# TYPE m\nm 1\n", False),
    _prom("type-no-name", "# TYPE \nm 1\n", False),
    _prom("type-bare", "# TYPE\nm 1\n", True),
    _prom("type-two-spaces", "# TYPE m  counter\nm 1\n", False),
    _prom("type-trailing-space", "# TYPE m counter \nm 1\n", False),
    _prom("type-extra-word", "# TYPE m counter x\nm 1\n", False),
    _prom("type-tabs", "# TYPE\tm\tcounter\nm 1\n", True),
    _prom("type-bad-name", "# TYPE 1m counter\nm 1\n", False),
    _prom("type-dash", "# TYPE m-x counter\nm 1\n", False),
    _prom("type-cr", "# TYPE m counter\r\nm 1\n", False),
    _prom("type-indented", "  # TYPE m counter\nm 1\n", True),
    _prom("label-value-raw-newline", 'm_total{a="x\ny"} 1\n', True),
    _prom("type-twice", "# TYPE m counter\n# TYPE m counter\nm 1\n", True),
    _prom("unit-is-comment", "# UNIT m_seconds seconds\nm_seconds 1\n", True),
    _prom("eof-is-comment", "m_total 1\n# EOF\nm_total{a=\"1\"} 2\n", True),
    _prom("duplicate-series", "m_total 1\nm_total 2\n", True),
    _prom("duplicate-series-reordered", 'm_total{a="1",b="2"} 1\nm_total{b="2",a="1"} 1\n', True),
    _prom("bad-second-line", "m_total 1\nnot a sample\n", False),
    _prom("control-garbage", "\x01\x02garbage\n", False),
    _prom("nul-line", "m_total 1\n\x00junk\n", True),
] + [_prom(id_, HEAD + line + "\n", ok) for id_, line, ok, _ in SAMPLE_LINES]

# whole payloads, OpenMetrics
OM_CASES: list[Case] = [
    _om("eof-only", "", True),
    _om("no-eof", OM_HEAD + "m_total 1\n", False, eof=False),
    _om("empty", "", False, eof=False),
    _om("eof-no-newline", OM_HEAD + "m_total 1\n# EOF", True, eof=False),
    _om("after-eof", OM_HEAD + "m_total 1\n# EOF\nm_total 2\n", False, eof=False),
    _om("blank-after-eof", OM_HEAD + "m_total 1\n# EOF\n\n", False, eof=False),
    _om("space-after-eof", OM_HEAD + "m_total 1\n# EOF \n", False, eof=False),
    _om("eof-twice", OM_HEAD + "m_total 1\n# EOF\n# EOF\n", False, eof=False),
    _om("eof-cr", OM_HEAD + "m_total 1\n# EOF\r\n", False, eof=False),
    _om("blank-line", OM_HEAD + "m_total 1\n\nm_total{a=\"1\"} 2\n", False),
    _om("blank-line-before-eof", OM_HEAD + "m_total 1\n\n", False),
    _om("crlf", OM_HEAD + "m_total 1\r\n", False),
    _om("comment", "# just a comment\nm_total 1\n", False),
    _om("comment-hash-only", "#\nm_total 1\n", False),
    _om("help-ok", "# HELP m help text\nm_total 1\n", True),
    _om("help-empty", "# HELP m \nm_total 1\n", True),
    _om("help-no-text", "# HELP m\nm_total 1\n", False),
    _om("help-two-spaces-before", "#  HELP m x\nm_total 1\n", False),
    _om("help-tab", "# HELP\tm x\nm_total 1\n", False),
    _om("help-bad-name", "# HELP 1m x\nm_total 1\n", False),
    _om("help-escapes", "# HELP m a \\\\ \\\" \\n b\nm_total 1\n", True),
    _om("type-all", "".join(f"# TYPE m{i} {t}\n" for i, t in enumerate(
        ("counter", "gauge", "histogram", "gaugehistogram", "summary", "info", "stateset", "unknown"))), True),
    _om("type-untyped", "# TYPE m untyped\nm 1\n", False),
    _om("type-capital", "# TYPE m Counter\nm_total 1\n", False),
    _om("type-missing", "# TYPE m\nm 1\n", False),
    _om("type-two-spaces", "# TYPE m  counter\nm_total 1\n", False),
    _om("type-trailing-space", "# TYPE m counter \nm_total 1\n", False),
    _om("type-tab", "# TYPE m\tcounter\nm_total 1\n", False),
    _om("unit-ok", "# TYPE m_seconds gauge\n# UNIT m_seconds seconds\nm_seconds 1\n", True),
    _om("unit-empty", "# UNIT m_seconds \nm_seconds 1\n", True),
    _om("unit-not-suffix", "# UNIT m seconds\nm 1\n", False),
    _om("unit-no-underscore", "# UNIT mseconds seconds\nmseconds 1\n", False),
    _om("unit-is-name", "# UNIT seconds seconds\nseconds 1\n", False),
    _om("unit-no-text", "# UNIT m_seconds\nm_seconds 1\n", False),
    _om("unit-two-spaces", "# UNIT m_seconds  seconds\nm_seconds 1\n", False),
    _om("eof-lowercase", OM_HEAD + "m_total 1\n# eof\n", False, eof=False),
    _om("label-value-raw-newline", 'm_total{a="x\ny"} 1\n', False),
    _om("duplicate-series", "m_total 1\nm_total 2\n", True),
] + [_om(id_, OM_HEAD + line + "\n", ok) for id_, line, _, ok in SAMPLE_LINES]

CASES: list[Case] = PROM_CASES + OM_CASES

# Accepted by Prometheus 2.42, refused by the agent on purpose.
STRICTER: dict[str, str] = {
    # Prometheus' classic lexer treats a NUL byte at the start of a line as the end of the input
    # and keeps what came before; the agent refuses a payload with bytes that are not text.
    "prom-nul-line": "control bytes are not exposition text",
    # Prometheus' classic lexer lets a quoted label value run over a line break; the agent reads
    # one sample per line (the exposition format escapes a line break as \n).
    "prom-label-value-raw-newline": "a raw line break inside a label value",
}
