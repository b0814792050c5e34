"""Parse and normalise together by payload shape (agent/collect/shapes.py) against the full way
(parse.py, then normalise.py): the same signals, anomaly counts, sample and duplicate counts, bit
for bit, and the same ParseError, on real payloads and on their values and lines changed."""
from __future__ import annotations

import random
import re
from pathlib import Path

import pytest

from agent.collect.mapping import load_mappings
from agent.collect.normalise import normalise
from agent.collect.parse import NO_LIMITS, Limits, ParseError, parse
from agent.collect.shapes import Shapes
from contracts.tier_model import Target

MAPPINGS = load_mappings()
FIXTURES = Path(__file__).parent / "fixtures"
PAYLOADS = [("vllm_0_33_dp2.prom", "vllm"), ("lmcache_inprocess.prom", "lmcache"), ("curvine_fuse.prom", "curvine-fuse"),
            ("router.prom", "router")]
SHARED = ["vllm_0_32_cpu_native_tiering_metrics.prom", "datadog_vllm_metrics.prom", "lmcache_metrics_test_fixture.prom"]
TOKENS = ["0", "-0", "1", "3.5", "-1", "NaN", "nan", "+Inf", "-Inf", "Infinity", "1e400", "9.3e18", "1e308", "1_0",
          "0x10", "+NaN", "-NaN", "1e-400", ".5", "5.", "١", "", "1\t", "1e", "inf"]


def texts(samples_dir: Path) -> list[tuple[str, str]]:
    out = [((FIXTURES / name).read_text(), role) for name, role in PAYLOADS]
    for name in SHARED:
        lines = (samples_dir / name).read_text().split("\n")
        out.append(("\n".join(line for line in lines if line.strip() != "..."), "vllm"))
    return out


def full(text: str, target: Target, limits: Limits = NO_LIMITS) -> tuple:
    try:
        payload = parse(text, MAPPINGS.wanted[target.role], limits, openmetrics=False)
    except ParseError as exc:
        return ("error", exc.reason, str(exc))
    got = normalise(target, payload, MAPPINGS)
    return [repr(s) for s in got.signals], got.anomalies, payload.lines, payload.duplicates


def by_shape(shapes: Shapes, text: str, target: Target) -> tuple[tuple, bool]:
    """The result and whether it was read by a known shape."""
    try:
        read = shapes.read(text, target)
    except ParseError as exc:
        return ("error", exc.reason, str(exc)), False
    got = read.result
    return ([repr(s) for s in got.signals], got.anomalies, read.lines, read.duplicates), read.payload is None


def learnt(text: str, role: str, limits: Limits = NO_LIMITS) -> tuple[Shapes, Target]:
    shapes, target = Shapes(MAPPINGS, limits), Target("http://p/metrics", role, "pod-1")
    for _ in range(2):  # a shape is remembered the second time it is seen
        assert by_shape(shapes, text, target)[0] == full(text, target, limits)
    assert len(shapes) == 1
    return shapes, target


def sample_lines(text: str) -> list[int]:
    return [i for i, line in enumerate(text.split("\n")) if line and line[0] != "#"]


def test_payloads_seen_before_are_read_by_their_shape_with_the_same_result(samples_dir: Path):
    for text, role in texts(samples_dir):
        shapes, target = learnt(text, role)
        got, known = by_shape(shapes, text, target)
        assert known, role
        assert got == full(text, target)
        assert got[0], f"{role}: no signal at all"


def test_other_values_give_the_full_ways_signals_and_anomalies(samples_dir: Path):
    rng = random.Random(33)
    known = anomalous = errors = 0
    for text, role in texts(samples_dir):
        shapes, target = learnt(text, role)
        lines = text.split("\n")
        at = sample_lines(text)
        for trial in range(40):
            changed = list(lines)
            for i in at:
                head, _, value = changed[i].rpartition(" ")
                if trial % 4 == 0 or rng.random() < 0.15:
                    value = rng.choice(TOKENS) if trial % 2 else repr(rng.uniform(0, 1e6))
                elif trial % 3 == 0:
                    value = repr(float(value) * rng.choice((0.5, 1.0, 2.0)))
                changed[i] = f"{head} {value}"
            text2 = "\n".join(changed)
            want = full(text2, target)
            got, by_it = by_shape(shapes, text2, target)
            assert got == want, (role, trial)
            known += by_it
            errors += want[0] == "error"
            anomalous += want[0] != "error" and bool(want[1])
    assert known > 40 and anomalous > 20 and errors > 20, (known, anomalous, errors)


@pytest.mark.parametrize("change", ["type", "help", "timestamp", "blank", "spaces", "duplicate", "comment_space",
                                    "drop_line", "tab"])
def test_changed_lines_go_the_full_way(samples_dir: Path, change: str):
    text, role = texts(samples_dir)[0]
    shapes, target = learnt(text, role)
    lines = text.split("\n")
    first_type = next(i for i, line in enumerate(lines) if line.startswith("# TYPE"))
    first_help = next(i for i, line in enumerate(lines) if line.startswith("# HELP"))
    sample = sample_lines(text)[5]
    if change == "type":
        lines[first_type] = lines[first_type].rpartition(" ")[0] + " bogus"
    elif change == "help":
        lines[first_help] += " more"
    elif change == "timestamp":
        lines[sample] += " 1700000000000"
    elif change == "blank":
        lines.insert(sample, "")
    elif change == "spaces":
        lines[sample] = lines[sample].replace(" ", "  ")
    elif change == "duplicate":
        lines.insert(sample, lines[sample])
    elif change == "comment_space":
        lines[first_help] = " " + lines[first_help]
    elif change == "drop_line":
        del lines[sample]
    else:
        lines[sample] = lines[sample].replace(" ", "\t")
    text2 = "\n".join(lines)
    got, _ = by_shape(shapes, text2, target)
    assert got == full(text2, target)
    if change == "type":
        assert got[0] == "error"


@pytest.mark.parametrize("change", ["le_not_a_number", "le_missing", "le_twice"])
def test_malformed_histograms_seen_again_read_as_the_full_way(samples_dir: Path, change: str):
    """A payload with a bucket the normaliser refuses (or a bucket twice) is still a shape: seen
    three times it gives the full way's signals, anomalies and duplicates each time."""
    text, role = texts(samples_dir)[0]
    lines = text.split("\n")
    at = next(i for i in sample_lines(text) if "_bucket{" in lines[i] and 'le="+Inf"' not in lines[i])
    if change == "le_not_a_number":
        lines[at] = re.sub(r'le="[^"]*"', 'le="abc"', lines[at])
    elif change == "le_missing":
        lines[at] = re.sub(r',?le="[^"]*"', "", lines[at])
    else:
        nxt = next(i for i in sample_lines(text) if i > at and "_bucket{" in lines[i])
        le = re.search(r'le="[^"]*"', lines[at]).group(0)  # type: ignore[union-attr]
        lines[nxt] = re.sub(r'le="[^"]*"', le, lines[nxt])
    text2 = "\n".join(lines)
    shapes, target = Shapes(MAPPINGS, NO_LIMITS), Target("http://p/metrics", role, "pod-1")
    want = full(text2, target)
    assert want[0] != "error"
    if change == "le_twice":
        assert want[3] == 1  # the same series twice: the parser keeps the first
    else:
        assert sum(want[1].values()) > 0, want[1]  # refused by the normaliser, not the parser
    for _ in range(3):
        assert by_shape(shapes, text2, target)[0] == want


def test_duplicates_and_limits_as_the_parser_counts_them(samples_dir: Path):
    text, role = texts(samples_dir)[0]
    lines = text.split("\n")
    wanted = MAPPINGS.wanted[role]
    dup = next(i for i in sample_lines(text) if lines[i].split("{")[0] in wanted)
    lines.insert(dup + 1, lines[dup].rpartition(" ")[0] + " 7")
    text2 = "\n".join(lines)
    shapes, target = learnt(text2, role)
    got, known = by_shape(shapes, text2, target)
    assert known and got == full(text2, target) and got[3] == 1
    limits = Limits(labels=3, label_value_length=40)
    assert full(text, target, limits)[0] == "error"
    limited = Shapes(MAPPINGS, limits)
    for _ in range(3):
        assert by_shape(limited, text, target) == ((full(text, target, limits)), False)
    assert len(limited) == 0


def test_the_cache_is_bounded_least_recently_used_out(samples_dir: Path):
    (a, role_a), (b, role_b), (c, role_c) = texts(samples_dir)[:3]
    shapes = Shapes(MAPPINGS, Limits(), max_chars=len(a) + len(b) + 10)
    ta, tb, tc = (Target("http://p/metrics", r, "p") for r in (role_a, role_b, role_c))
    for text, t in ((a, ta), (a, ta), (b, tb), (b, tb)):
        shapes.read(text, t)
    assert len(shapes) == 2
    assert shapes.read(a, ta).payload is None  # a is now the most recently used
    for _ in range(2):
        shapes.read(c, tc)
    assert shapes.read(a, ta).payload is None and shapes.read(c, tc).payload is None
    assert shapes.read(b, tb).payload is not None  # b was the least recently used
