"""The parser against Prometheus 2.42 on the conformance suite (tests/support/exposition_cases.py):
it refuses every payload Prometheus refuses, naming the line and the problem, and reads every one
Prometheus reads (bar the documented `STRICTER` corners). The verdicts in the suite are checked
against a real Prometheus scraping every case (slow test)."""
from __future__ import annotations

from pathlib import Path

import pytest

from agent.collect.parse import ParseError, parse
from tests.support.exposition_cases import CASES, OM, STRICTER, Case

REFUSED = [c for c in CASES if not c.accepted]
ACCEPTED = [c for c in CASES if c.accepted and c.id not in STRICTER]


def _parse(case: Case, wanted: set[str] | None = None):
    return parse(case.body, wanted, openmetrics=case.fmt == OM)


def test_the_suite_covers_both_formats_and_both_verdicts():
    kinds = {(c.fmt, c.accepted) for c in CASES}
    assert kinds == {("prom", True), ("prom", False), ("om", True), ("om", False)}
    assert len(REFUSED) >= 150 and len(ACCEPTED) >= 100
    assert len({c.id for c in CASES}) == len(CASES)
    assert set(STRICTER) <= {c.id for c in CASES if c.accepted}


@pytest.mark.parametrize("wanted", [None, set()], ids=["all", "none-wanted"])
@pytest.mark.parametrize("case", REFUSED, ids=lambda c: c.id)
def test_every_payload_prometheus_refuses_is_refused_with_its_line(case: Case, wanted):
    with pytest.raises(ParseError) as err:
        _parse(case, wanted)
    lines = case.body.split("\n")
    assert 1 <= err.value.line <= len(lines)
    assert err.value.why and "\n" not in str(err.value)


@pytest.mark.parametrize("case", ACCEPTED, ids=lambda c: c.id)
def test_every_payload_prometheus_reads_is_read(case: Case):
    _parse(case)


@pytest.mark.parametrize("case", [c for c in CASES if c.id in STRICTER], ids=lambda c: c.id)
def test_the_stricter_corners_are_refused(case: Case):
    with pytest.raises(ParseError):
        _parse(case)


@pytest.mark.parametrize("line, labels", [
    ('m{a="1",a="2"} 1', None),
    ('m{a="1",b="2",a="1"} 1', None),
    ('m{__name__="m"} 1', None),
    ('m{a="1" , b="2",} 1', {"a": "1", "b": "2"}),
])
def test_a_repeated_label_name_is_refused_not_collapsed(line: str, labels: dict | None):
    for _ in range(2):  # the second time through the series cache
        if labels is None:
            with pytest.raises(ParseError, match="label"):
                parse(f"ok 1\n{line}\n")
        else:
            assert parse(f"ok 1\n{line}\n").by_name["m"][0].labels == labels


def test_reasons_name_the_problem():
    cases = {
        "m_total 1 \n# EOF\n": (1, "trailing whitespace"),
        "m_total 1 NaN\n# EOF\n": (1, "bad timestamp"),
        "m_total 1\n\nm_total 2\n# EOF\n": (2, "blank line"),
        "m_total 1\n# EOF\nx 1\n": (3, "content after # EOF"),
        'm 1 # {a="b"} 1\n# EOF\n': (1, "exemplar on a metric"),
        "# TYPE m countr\n# EOF\n": (1, "bad TYPE line"),
        "# UNIT m seconds\n# EOF\n": (1, "bad UNIT line"),
        "# HELP m\n# EOF\n": (1, "bad HELP line"),
        "# hello\n# EOF\n": (1, "comment line"),
    }
    for text, (line, why) in cases.items():
        with pytest.raises(ParseError) as err:
            parse(text, openmetrics=True)
        assert (err.value.line, why in err.value.why) == (line, True), (text, str(err.value))
    with pytest.raises(ParseError, match="line 2: a comment or exemplar"):
        parse('m 1\nm_total 1 # {a="b"} 1\n', openmetrics=False)
    with pytest.raises(ParseError, match="line 1: bad timestamp"):
        parse("m 1 1.5\n", openmetrics=False)


def test_the_format_follows_the_content_type_not_the_text():
    text = "m_total 1\n# EOF\nm_total{a=\"1\"} 2\n"
    assert len(parse(text, openmetrics=False)) == 2  # classic: `# EOF` is a comment
    with pytest.raises(ParseError, match="content after # EOF"):
        parse(text, openmetrics=True)
    with pytest.raises(ParseError, match="content after # EOF"):
        parse(text)  # no Content-Type: a `# EOF` line means OpenMetrics


@pytest.mark.slow  # ~10-20 s: one Prometheus, every case a target scraped once
def test_the_suite_verdicts_are_prometheus_own(tmp_path: Path):
    from tests.support.conformance import prometheus_verdicts

    verdicts = prometheus_verdicts(CASES, tmp_path)
    wrong = {c.id: verdicts[c.id] for c in CASES if verdicts[c.id].accepted != c.accepted}
    assert not wrong, wrong
