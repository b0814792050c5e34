"""The exposition parser against prometheus_client's parser (the oracle) and on edge cases."""
from __future__ import annotations

import math
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry, Counter, generate_latest
from prometheus_client.openmetrics.parser import text_string_to_metric_families as om_families
from prometheus_client.parser import text_string_to_metric_families

from agent.collect.parse import ParseError, parse

FIXTURES = Path(__file__).parent / "fixtures"


def strip_elisions(text: str) -> str:
    """The docs excerpts contain `...` lines (not exposition text; see samples/README.md)."""
    return "\n".join(line for line in text.split("\n") if line.strip() != "...")


def _key(name: str, labels: dict, value: float) -> tuple:
    return name, tuple(sorted(labels.items())), "nan" if math.isnan(value) else float(value)


def oracle(text: str) -> list[tuple]:
    return sorted(_key(s.name, s.labels, s.value) for f in text_string_to_metric_families(text) for s in f.samples)


def mine(text: str) -> list[tuple]:
    return sorted(_key(s.name, s.labels, s.value) for s in parse(text).samples)


SAMPLE_FILES = [
    "datadog_ray_vllm_metrics.prom", "datadog_sglang_metrics.prom", "datadog_vllm_metrics.prom",
    "lmcache_metrics_test_fixture.prom", "vllm_0_32_cpu_native_tiering_metrics.prom",
    "vllm_metrics_docs_design_excerpt.prom",
    "vllm_metrics_docs_usage_excerpt.prom",
]


def test_every_shared_sample_is_listed(samples_dir: Path):
    assert sorted(p.name for p in samples_dir.glob("*.prom")) == sorted(SAMPLE_FILES)


@pytest.mark.parametrize("name", SAMPLE_FILES)
def test_shared_samples_parse_like_prometheus_client(samples_dir: Path, name: str):
    text = strip_elisions((samples_dir / name).read_text())
    assert mine(text) == oracle(text)


@pytest.mark.parametrize("name", ["vllm_0_33_dp2.prom", "lmcache_inprocess.prom", "curvine_fuse.prom",
                                  "curvine_master.prom", "router.prom"])
def test_own_fixtures_parse_like_prometheus_client(name: str):
    text = (FIXTURES / name).read_text()
    # prometheus_client's parser adds `_total` to counters that lack it (Curvine's Rust names do);
    # the agent keeps wire names, which is what the mappings match
    def unify(rows):
        return sorted((n.removesuffix("_total"), *rest) for n, *rest in rows)
    assert unify(mine(text)) == unify(oracle(text))


def test_colon_names_and_created_series_are_kept(samples_dir: Path):
    p = parse((samples_dir / "lmcache_metrics_test_fixture.prom").read_text())
    assert [s.value for s in p.by_name["lmcache:num_hit_tokens_total"]] == [4096.0, 2048.0]
    assert p.by_name["lmcache:num_hit_tokens_created"][0].value == 1700000000.0
    assert p.types == {"lmcache:num_hit_tokens_total": "counter"}


def test_duplicate_families_are_accepted(samples_dir: Path):
    p = parse((samples_dir / "datadog_ray_vllm_metrics.prom").read_text())
    assert len(p.by_name["ray_vllm:avg_generation_throughput_toks_per_s"]) == 2


def test_openmetrics_with_unit_exemplar_and_eof():
    text = (FIXTURES / "lmcache_mp.om").read_text()
    p = parse(text)
    assert p.openmetrics
    assert p.by_name["lmcache_mp_lookup_hit_l1_tokens_total"][0].value == 6000.0
    assert p.by_name["lmcache_mp_l1_usage_ratio"][0].labels == {}
    oracle_samples = sorted(_key(s.name, s.labels, s.value) for f in om_families(text) for s in f.samples)
    assert mine(text) == oracle_samples


def test_nan_inf_escapes_and_timestamps():
    text = ('a{x="q\\"uote",y="back\\\\slash",z="new\\nline"} NaN\n'
            "b +Inf 1700000000000\n"
            "c{} -Inf\n"
            "d 1e3\n")
    p = parse(text)
    (a,) = p.by_name["a"]
    assert a.labels == {"x": 'q"uote', "y": "back\\slash", "z": "new\nline"} and math.isnan(a.value)
    assert p.by_name["b"][0].value == math.inf and p.by_name["b"][0].timestamp == 1700000000000.0
    assert p.by_name["c"][0].value == -math.inf
    assert p.by_name["d"][0].value == 1000.0


def test_crlf_line_ends_are_refused_like_prometheus():
    # Prometheus reads `1e3\r` as the value, which is not a number: the scrape fails
    with pytest.raises(ParseError) as err:
        parse("c 1\nd 1e3\r\n")
    assert err.value.line == 2 and "carriage return" in err.value.why


@pytest.mark.parametrize("bad, line", [
    ("ok 1\nthis is not a metric\n", 2),
    ("ok 1\nx{le=\"1\" 3\n", 2),
    ("x{a=unquoted} 1\n", 1),
    ("x 1\ny twelve\n", 2),
    ("# TYPE x countr\nx 1\n", 1),
    ("\x00\x01\x02garbage\n", 1),
])
def test_malformed_lines_fail_the_payload_naming_the_line(bad: str, line: int):
    with pytest.raises(ParseError) as err:
        parse(bad)
    assert err.value.line == line
    assert f"line {line}" in str(err.value)


def test_wanted_filter_keeps_only_wanted_names_but_still_validates():
    p = parse("a 1\nb{x=\"1\"} 2\nc 3\n", wanted={"b"})
    assert list(p.by_name) == ["b"] and p.lines == 3
    with pytest.raises(ParseError):
        parse("a 1\nc three\n", wanted={"b"})


label_values = st.text(alphabet=st.characters(blacklist_categories=("Cs",)), max_size=20)


@settings(max_examples=60, deadline=None)
@given(values=st.lists(st.tuples(label_values, st.floats(allow_nan=False, min_value=0, max_value=1e15)),
                       min_size=1, max_size=5, unique_by=lambda t: t[0]))
def test_roundtrip_through_prometheus_client_output(values):
    reg = CollectorRegistry()
    c = Counter("vllm:prefix_cache_hits", "h", ["model_name"], registry=reg)
    for label, v in values:
        c.labels(label).inc(v)
    text = generate_latest(reg).decode()
    got = {s.labels["model_name"]: s.value for s in parse(text).by_name["vllm:prefix_cache_hits_total"]}
    assert got == pytest.approx({label: v for label, v in values})


def _content(p) -> tuple:
    rows = [(s.name, tuple(s.labels.items()), repr(s.value), s.timestamp) for s in p.samples]
    return rows, p.types, p.lines, p.duplicates, p.openmetrics


@pytest.mark.parametrize("wanted", [None, {"vllm:prompt_tokens_total", "vllm:time_to_first_token_seconds_bucket",
                                           "lmcache_mp_lookup_hit_l1_tokens_total", "curvine_fuse_read_bytes"}])
def test_a_payload_reads_the_same_on_every_scrape(samples_dir: Path, wanted):
    """The first scrape goes line by line and fills the series cache; later ones read cached
    series in bulk: both give the same samples, types and counts."""
    from agent.collect.parse import forget_series

    texts = [strip_elisions(p.read_text()) for p in sorted(samples_dir.glob("*.prom"))]
    texts += [p.read_text() for p in sorted(FIXTURES.glob("*.prom")) + sorted(FIXTURES.glob("*.om"))]
    texts.append('m{a="1"} 1\nm{a="1"} 2\nm NaN\nm{b="x"} -Inf\n')  # a duplicate series, NaN, -Inf
    for text in texts:
        forget_series()
        first = _content(parse(text, wanted))
        assert _content(parse(text, wanted)) == first
        assert _content(parse(text, wanted)) == first
