"""Wire-format checks of the emulated endpoints against the reference doc and the real parser."""
from __future__ import annotations

import re
import urllib.request
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from emulator.cluster import catalogue as cat
from emulator.cluster.exposition import (
    HistogramValue,
    MetricSpec,
    Snapshot,
    render_python_client,
    render_rust_text,
    rust_float,
)
from emulator.cluster.fleet import ClusterSpec, EmulatedCluster
from emulator.cluster.pod_metrics import (
    CurvineFuseMetrics,
    CurvineMasterMetrics,
    L2Status,
    PodIdentity,
    RequestOutcome,
    VllmPodMetrics,
)

MODEL = "meta-llama/Llama-3.1-8B-Instruct"
OUTCOME = RequestOutcome(prompt_tokens=2048, gpu_hit_tokens=512, cpu_hit_tokens=256, l2_hit_tokens=768,
                         output_tokens=11, ttft_s=0.3, queue_s=0.02, l2_read_s=0.056, cpu_load_s=0.004,
                         stored_tokens=512, chunk_tokens=256, itl_s=0.02)


@pytest.fixture(scope="module")
def reference_doc(shared_dir: Path) -> str:
    return (shared_dir / "reference" / "metrics-and-knobs.md").read_text()


def _doc_buckets(doc: str, metric: str) -> tuple[float, ...]:
    """The default-bucket cell of `metric`'s row in the reference tables."""
    for line in doc.splitlines():
        if line.startswith(f"| `{metric}`"):
            cells = [c.strip() for c in line.strip().strip("|").split("|")]
            text = cells[-1]
            return tuple(float(x) for x in re.findall(r"\d+(?:\.\d+)?(?:e\d+)?", text))
    raise AssertionError(f"{metric} not in the reference doc")


def _families(text: str) -> dict[str, object]:
    return {f.name: f for f in text_string_to_metric_families(text)}


def _pod_text(engines: int = 1) -> str:
    m = VllmPodMetrics(PodIdentity(engines=engines, max_model_len=4096), started_at=1_795_000_000.0)
    m.record(OUTCOME)
    return render_python_client(m.snapshot()).decode()


def test_vllm_names_types_and_base_labels_parse_with_the_real_parser(reference_doc: str) -> None:
    fams = _families(_pod_text())
    # Every vllm:/lmcache: family served is named in the reference doc, with its declared type.
    for spec in cat.vllm_specs(4096) + cat.LMCACHE_SPECS:
        assert f"`{spec.name}" in reference_doc or f"`{spec.name}_total`" in reference_doc, spec.name
        fam = fams[spec.name]
        assert fam.type == spec.kind, spec.name
    for name in ("vllm:prefix_cache_hits", "vllm:time_to_first_token_seconds"):
        for s in fams[name].samples:
            if not s.name.endswith("_created"):
                assert {"model_name", "engine"} <= set(s.labels), s
    for s in fams["lmcache:num_hit_tokens"].samples:
        assert set(s.labels) == {"model_name", "worker_id", "role", "served_model_name"}


def test_vllm_text_has_total_and_created_series_and_histogram_suffixes() -> None:
    text = _pod_text()
    assert f'vllm:prefix_cache_hits_total{{engine="0",model_name="{MODEL}"}} 512.0' in text
    assert f'vllm:prefix_cache_hits_created{{engine="0",model_name="{MODEL}"}} 1.795e+09' in text
    assert "# TYPE vllm:prefix_cache_queries_total counter" in text
    assert f'vllm:time_to_first_token_seconds_bucket{{engine="0",le="0.25",model_name="{MODEL}"}} 0.0' in text
    assert f'vllm:time_to_first_token_seconds_bucket{{engine="0",le="0.5",model_name="{MODEL}"}} 1.0' in text
    assert f'vllm:time_to_first_token_seconds_count{{engine="0",model_name="{MODEL}"}} 1.0' in text
    assert f'vllm:time_to_first_token_seconds_sum{{engine="0",model_name="{MODEL}"}} 0.3' in text
    assert "# TYPE vllm:time_to_first_token_seconds_created gauge" in text
    lm_labels = f'model_name="{MODEL}",role="worker",served_model_name="{MODEL}",worker_id="0"'
    assert f"lmcache:num_hit_tokens_total{{{lm_labels}}} 1024.0" in text


def test_vllm_values_for_one_request_are_exact() -> None:
    fams = _families(_pod_text())

    def value(name: str, sample: str, **labels: str) -> float:
        for s in fams[name].samples:
            if s.name == sample and all(s.labels.get(k) == v for k, v in labels.items()):
                return s.value
        raise AssertionError((name, sample, labels))

    assert value("vllm:prefix_cache_queries", "vllm:prefix_cache_queries_total") == 2048
    assert value("vllm:external_prefix_cache_queries", "vllm:external_prefix_cache_queries_total") == 1536
    assert value("vllm:external_prefix_cache_hits", "vllm:external_prefix_cache_hits_total") == 1024
    by_src = "vllm:prompt_tokens_by_source_total"
    assert value("vllm:prompt_tokens_by_source", by_src, source="local_compute") == 512
    assert value("vllm:prompt_tokens_by_source", by_src, source="external_kv_transfer") == 1024
    cached = "vllm:prompt_tokens_cached_by_source_total"
    assert value("vllm:prompt_tokens_cached_by_source", cached, source="device") == 512
    # LMCache leaves vLLM's default tier for connector hits (kv_connector/v1/base.py): the 256 L1 +
    # 768 L2 tokens are `external_unspecified`; `host` and `disk` never move with LMCache
    assert value("vllm:prompt_tokens_cached_by_source", cached, source="external_unspecified") == 1024
    assert value("vllm:prompt_tokens_cached_by_source", cached, source="host") == 0
    assert value("vllm:prompt_tokens_cached_by_source", cached, source="disk") == 0
    assert value("lmcache:num_requested_tokens", "lmcache:num_requested_tokens_total") == 1536
    assert value("lmcache:num_remote_read_requests", "lmcache:num_remote_read_requests_total") == 3
    assert value("lmcache:num_remote_read_bytes", "lmcache:num_remote_read_bytes_total") == 768 * 131072
    assert value("lmcache:remote_time_to_get", "lmcache:remote_time_to_get_bucket", le="60.0") == 1
    assert value("lmcache:remote_time_to_get", "lmcache:remote_time_to_get_bucket", le="40.0") == 0


def test_vllm_buckets_match_the_reference_defaults(reference_doc: str) -> None:
    fams = _families(_pod_text())
    for name in ("vllm:time_to_first_token_seconds", "vllm:inter_token_latency_seconds",
                 "vllm:e2e_request_latency_seconds", "vllm:iteration_tokens_total", "lmcache:time_to_retrieve",
                 "lmcache:remote_time_to_get"):
        served = tuple(float(s.labels["le"]) for s in fams[name].samples
                       if s.name.endswith("_bucket") and s.labels["le"] != "+Inf")
        assert served == _doc_buckets(reference_doc, name), name
    prompt = [s.labels["le"] for s in fams["vllm:request_prompt_tokens"].samples if s.name.endswith("_bucket")]
    assert prompt == ["1.0", "2.0", "5.0", "10.0", "20.0", "50.0", "100.0", "200.0", "500.0", "1000.0",
                      "2000.0", "+Inf"]


def test_data_parallel_engines_each_get_series() -> None:
    m = VllmPodMetrics(PodIdentity(engines=2, max_model_len=4096), started_at=1.0)
    m.record(OUTCOME)
    m.record(OUTCOME)
    fams = _families(render_python_client(m.snapshot()).decode())
    hits = {s.labels["engine"]: s.value for s in fams["vllm:prefix_cache_hits"].samples
            if s.name.endswith("_total")}
    assert hits == {"0": 512.0, "1": 512.0}


def test_curvine_fuse_format_is_the_rust_crates(reference_doc: str) -> None:
    fuse = CurvineFuseMetrics(started_at=1.0)
    fuse.record_io("read", 3 * 256 * 131072, [18_000.0, 19_000.0, 56_000.0])
    text = render_rust_text(fuse.snapshot()).decode()
    assert "_created" not in text
    assert 'curvine_fuse_io_bytes_total{io_type="read",path_type="curvine",status="success"} 100663296' in text
    assert 'curvine_fuse_io_duration_us_bucket{io_type="read",path_type="curvine",status="success",le="25000"} 2' in text
    assert 'curvine_fuse_io_duration_us_bucket{io_type="read",path_type="curvine",status="success",le="+Inf"} 3' in text
    assert 'curvine_fuse_io_duration_us_sum{io_type="read",path_type="curvine",status="success"} 93000' in text
    fams = _families(text)
    assert fams["curvine_fuse_io_duration_us"].type == "histogram"
    # The parser strips a `_total` suffix from counter family names; the wire name keeps it.
    assert "curvine_fuse_io_bytes" in fams and fams["curvine_fuse_io_bytes"].type == "counter"
    served = tuple(float(s.labels["le"]) for s in fams["curvine_fuse_io_duration_us"].samples
                   if s.name.endswith("_bucket") and s.labels["le"] != "+Inf" and s.labels["io_type"] == "read")
    assert served == _doc_buckets(reference_doc, "curvine_fuse_io_duration_us")


def test_curvine_master_names_have_no_suffix_added() -> None:
    master = CurvineMasterMetrics(started_at=1.0)
    master.set_usage(L2Status(capacity_bytes=1e12, used_bytes=2.5e11, tracked_files=7))
    master.record_eviction(files=3, bytes_freed=3 * 33554432)
    text = render_rust_text(master.snapshot()).decode()
    lines = set(text.splitlines())
    assert {"capacity 1000000000000", "fs_used 250000000000", "available 750000000000",
            "eviction_trigger_count 1", "eviction_files_deleted 3", "eviction_bytes_freed 100663296",
            "# TYPE eviction_files_deleted counter"} <= lines
    assert "eviction_files_deleted_total" not in text


def test_rust_float_formatting() -> None:
    assert [rust_float(v) for v in (0.0, 5.0, 2.5, 1e7, 1e-5, float("inf"))] == [
        "0", "5", "2.5", "10000000", "0.00001", "+Inf"]


def test_snapshot_renderer_is_pure_and_skips_unset_series() -> None:
    spec = MetricSpec("x:h", "histogram", "h", ("a",), (1.0, 2.0))
    snap = Snapshot((spec,), {("x:h", ("v",)): HistogramValue((1, 0, 2), 7.5)}, created=10.0)
    assert render_python_client(snap) == render_python_client(snap)
    text = render_python_client(snap).decode()
    assert 'x:h_bucket{a="v",le="2.0"} 1.0' in text and 'x:h_bucket{a="v",le="+Inf"} 3.0' in text
    assert render_python_client(Snapshot((spec,), {}, 0.0)) == b""


def test_endpoints_serve_over_loopback_http_with_gzip() -> None:
    with EmulatedCluster(ClusterSpec(pods=1, restart_downtime_s=0.0)) as cluster:
        pod = cluster.pods["vllm-0"]
        pod.metrics.record(OUTCOME)
        assert pod.vllm_endpoint.url.startswith("http://127.0.0.1:")
        with urllib.request.urlopen(pod.vllm_endpoint.url, timeout=5) as resp:
            assert resp.headers["Content-Type"].startswith("text/plain")
            body = resp.read().decode()
        assert "vllm:prefix_cache_hits_total" in body
        req = urllib.request.Request(cluster.master_endpoint.url, headers={"Accept-Encoding": "gzip"})
        with urllib.request.urlopen(req, timeout=5) as resp:
            assert resp.headers["Content-Encoding"] == "gzip"
        roles = sorted({t["role"] for t in cluster.targets()})
        assert roles == ["curvine-fuse", "curvine-master", "vllm"]
