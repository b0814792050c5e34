"""The exposition parser against hostile payloads: linear cost, bounded memory, per-target limits,
duplicate series, and errors that never echo what the target sent."""
from __future__ import annotations

import json
import subprocess
import sys
import tracemalloc
from pathlib import Path

import pytest

from agent.collect.parse import LimitExceeded, Limits, ParseError, parse

ROOT = Path(__file__).resolve().parent.parent

# Each family builds one line from a label count n. The first is the ~160-byte line that froze the
# old parser (exponential backtracking over `[ \t]*,?[ \t]*` between labels).
ATTACKS = {
    "unclosed_block": 'lambda n: "junk{" + \'a="1"  \' * n',
    "closed_then_junk": 'lambda n: "junk{" + \'a="1"  \' * n + "} x"',
    "no_commas": 'lambda n: "m{" + " ".join(f\'l{i}="v"\' for i in range(n)) + "} 1"',
    "escapes_unterminated": 'lambda n: \'m{a="\' + \'\\\\"\' * (8 * n)',
    "spaces_everywhere": 'lambda n: "m{" + \'a="1" ,  \' * n + "}" + " \\t" * n + "1" + " " * n + "x"',
}

# Runs in a child process so that a parser that backtracks exponentially fails the test by timing
# out instead of hanging the suite. It prints, per family and label count, the best of 5 CPU times
# of parsing the line 200 times, wanted and unwanted.
CHILD = """
import json, sys, time
from agent.collect.parse import ParseError, parse
attacks = {name: eval(src) for name, src in json.loads(sys.argv[1]).items()}
out = {}
for name, make in attacks.items():
    for n in (16, 32, 64, 128):
        text = (make(n) + "\\n") * 200
        best = float("inf")
        for _ in range(5):
            t = time.process_time()
            for wanted in (None, set()):
                try:
                    parse(text, wanted)
                except ParseError:
                    pass
            best = min(best, time.process_time() - t)
        out[f"{name}:{n}"] = best
print(json.dumps(out))
"""


def test_adversarial_lines_cost_linear_time():
    proc = subprocess.run([sys.executable, "-c", CHILD, json.dumps(ATTACKS)], check=False, capture_output=True,
                          text=True, timeout=120, cwd=ROOT, env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"})
    assert proc.returncode == 0, proc.stderr[-2000:]
    times = json.loads(proc.stdout)
    for name in ATTACKS:
        t16, t128 = times[f"{name}:16"], times[f"{name}:128"]
        # 8x the input: linear is ~8x the time; exponential is 2^112x. Allow 6x noise on top.
        assert t128 <= max(48 * t16, 0.05), (name, times)
        assert t128 < 2.0, (name, t128)  # 200 lines of ~1-2 KiB each


def test_the_freezing_line_is_one_clear_error():
    line = "junk{" + 'a="1"  ' * 20
    with pytest.raises(ParseError) as err:
        parse(line + "\n")
    assert str(err.value) == "line 1: bad label set"


def test_label_separators_follow_prometheus():
    # the classic format takes spaces, a missing comma and a trailing comma (Prometheus' lexer
    # skips whitespace and its label loop makes the comma optional); OpenMetrics takes none
    for text in ('m{a="1" b="2"} 1\n', 'm{ a = "1" , b="2", } 1\n'):
        assert parse(text, openmetrics=False).by_name["m"][0].labels == {"a": "1", "b": "2"}
        with pytest.raises(ParseError) as err:
            parse(text + "# EOF\n", openmetrics=True)
        assert err.value.line == 1


def test_errors_never_echo_the_payload():
    secret = "AKIAIOSFODNN7EXAMPLE"
    for text in (f"{secret} is not exposition\n", f'm{{k="{secret}" 1\n', f"m {secret}\n",
                 f"# TYPE m {secret}\n", f"{secret}{{a=\"1\"}} x\n"):
        with pytest.raises(ParseError) as err:
            parse(text)
        assert secret not in str(err.value) and "AKIA" not in str(err.value), str(err.value)


def test_a_huge_label_value_uses_memory_linear_in_the_input():
    value = "x" * (8 << 20)
    text = f'm{{a="{value}"}} 1\nm{{a="{value}\\"q"}} 2\n'
    tracemalloc.start()
    try:
        p = parse(text)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert len(p.by_name["m"]) == 2
    assert peak < 8 * len(text), peak / len(text)  # the old regex peaked at ~170x


@pytest.mark.parametrize("wanted", [None, {"other"}])
def test_sample_limit(wanted):
    text = "".join(f'm{{i="{i}"}} {i}\n' for i in range(11))
    assert len(parse(text, wanted, Limits(samples=11)).by_name.get("m", ())) == (11 if wanted is None else 0)
    with pytest.raises(LimitExceeded) as err:
        parse(text, wanted, Limits(samples=10))
    assert err.value.reason == "sample_limit" and err.value.line == 11


@pytest.mark.parametrize("wanted", [None, {"other"}])
def test_label_limit_counts_labels_not_equal_signs(wanted):
    ok = 'm{a="x=y=z",b="2"} 1\n'
    parse(ok, wanted, Limits(labels=2))
    with pytest.raises(LimitExceeded) as err:
        parse('m 1\nm{a="1",b="2",c="3"} 1\n', wanted, Limits(labels=2))
    assert (err.value.reason, err.value.line) == ("label_limit", 2)


@pytest.mark.parametrize("wanted", [None, {"other"}])
def test_label_name_and_value_length(wanted):
    limits = Limits(label_name_length=8, label_value_length=16)
    parse('m{abcdefgh="' + "v" * 16 + '"} 1\n', wanted, limits)
    parse('m{a="' + '\\"' * 16 + '"} 1\n', wanted, limits)  # 32 characters on the wire, 16 unescaped
    for text in ('m{abcdefghi="1"} 1\n', 'm{a="' + "v" * 17 + '"} 1\n'):
        with pytest.raises(LimitExceeded) as err:
            parse(text, wanted, limits)
        assert err.value.reason == "label_length"


def test_duplicate_series_are_dropped_and_counted_never_summed():
    text = "".join(f'c_total{{model="m",engine="0"}} {i}\n' for i in range(1, 51))
    text += 'c_total{engine="0",model="m"} 99\nc_total{model="m",engine="1"} 7\n'
    p = parse(text)
    assert [s.value for s in p.by_name["c_total"]] == [1.0, 7.0]
    assert p.duplicates == 50


def test_long_metric_names_are_held_to_the_value_length_and_never_cached():
    from agent.collect import parse as parse_module

    name = "m" * 5000
    parse(f"{name} 1\n")
    assert not any(name in cache for cache in (*parse_module._SERIES.values(), *parse_module._COMMENTS.values()))
    with pytest.raises(LimitExceeded) as err:
        parse(f"{name} 1\n", None, Limits(label_value_length=4096))
    assert err.value.reason == "metric_name_length"


@pytest.mark.parametrize("line", ["m 1_000_000", "m{a=\"1\"} 1_0", "m 1 1_000", "m{a=\"1\"} 1 1_000"])
@pytest.mark.parametrize("wanted", [None, {"other"}])
def test_digit_separators_are_refused_as_prometheus_client_refuses_them(line, wanted):
    from prometheus_client.parser import text_string_to_metric_families

    with pytest.raises(ValueError):
        list(text_string_to_metric_families(line + "\n"))
    with pytest.raises(ParseError) as err:
        parse(line + "\n", wanted)
    assert err.value.line == 1


def test_underscores_elsewhere_are_fine():
    p = parse('m_total{a_b="1_0"} 1 # {trace_id="x_y"} 2\n# EOF\n', openmetrics=True)
    assert p.by_name["m_total"][0].labels == {"a_b": "1_0"}


def test_openmetrics_needs_its_eof_and_nothing_after_it():
    text = "# TYPE m counter\nm_total 1\n"
    assert parse(text).by_name["m_total"]  # the classic text format has no # EOF
    assert parse(text + "# EOF\n", openmetrics=True).by_name["m_total"]
    with pytest.raises(ParseError, match="without # EOF"):
        parse(text, openmetrics=True)
    with pytest.raises(ParseError, match="after # EOF"):
        parse(text + "# EOF\nm_total 2\n")


def test_a_long_metric_name_has_its_own_reason():
    with pytest.raises(LimitExceeded) as err:
        parse("m" * 300 + " 1\n", {"other"}, Limits(label_value_length=256))
    assert err.value.reason == "metric_name_length"


def test_the_series_cache_stays_bounded_whatever_targets_send():
    from agent.collect import parse as parse_module

    for chunk in range(3):  # 60,000 distinct series of 40 characters, 20,000 a payload
        parse("".join(f'm{{a="{i:030d}"}} 1\n' for i in range(chunk * 20_000, (chunk + 1) * 20_000)), set())
    cached = sum(len(c) for c in (*parse_module._SERIES.values(), *parse_module._COMMENTS.values()))
    assert 0 < cached <= parse_module._CACHE_ENTRIES
