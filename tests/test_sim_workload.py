"""Workloads: Mooncake loading and its errors, re-chunking, the synthetic generator."""
from __future__ import annotations

import json

import numpy as np
import polars as pl
import pytest

from contracts.knobs import CHUNK_TOKEN_CHOICES, KnobError
from simulator.chunking import chunk_hash_table, chunk_hashes
from simulator.synthetic import Phase, generate
from simulator.workload import PRESETS, WORKLOAD_SCHEMA, WorkloadError, load_trace, synthetic

CONV = "mooncake_fast25_conversation_trace.jsonl"
SYN = "mooncake_fast25_synthetic_trace.jsonl"


@pytest.fixture(scope="module")
def conversation(traces_dir):
    return load_trace(traces_dir / CONV)


def test_load_real_traces_match_published_counts(conversation, traces_dir):
    assert conversation.schema == pl.Schema(WORKLOAD_SCHEMA)
    assert conversation.height == 12_031
    ids = conversation["hash_ids"].explode()
    assert ids.len() == 288_500 and ids.n_unique() == 182_790
    assert conversation["timestamp_ms"].max() == 3_536_999
    assert conversation["session_id"].null_count() == 12_031 and set(conversation["phase"].to_list()) == {0}
    syn = load_trace(traces_dir / SYN)
    assert syn.height == 3_993 and syn["hash_ids"].explode().n_unique() == 43_924


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ("{not json", "not valid JSON"),
        ('[1, 2]', "expected a JSON object"),
        ('{"timestamp": 5, "input_length": 10, "output_length": 1}', r"missing field\(s\) hash_ids"),
        ('{"timestamp": -1, "input_length": 10, "output_length": 1, "hash_ids": [1]}', "timestamp must be"),
        ('{"timestamp": 5, "input_length": 1200, "output_length": 1, "hash_ids": [1, 2]}',
         r"hash_ids has 2 entries but input_length 1200 needs ceil\(1200/512\) = 3"),
        ('{"timestamp": 5, "input_length": 10, "output_length": 1, "hash_ids": ["a"]}', "hash_ids must be a list of integers"),
    ],
)
def test_malformed_line_names_file_and_line(tmp_path, line, message):
    good = json.dumps({"timestamp": 0, "input_length": 600, "output_length": 3, "hash_ids": [0, 1]})
    path = tmp_path / "t.jsonl"
    path.write_text(f"{good}\n\n{line}\n{good}\n")
    with pytest.raises(WorkloadError, match=rf"t\.jsonl:3: {message}"):
        load_trace(path)


def test_missing_and_empty_trace_files(tmp_path):
    with pytest.raises(WorkloadError, match="cannot read trace"):
        load_trace(tmp_path / "nope.jsonl")
    (tmp_path / "e.jsonl").write_text("\n")
    with pytest.raises(WorkloadError, match="no requests"):
        load_trace(tmp_path / "e.jsonl")


def test_unsorted_trace_is_sorted_stably(tmp_path):
    rows = [(20, [1]), (10, [2]), (10, [3])]
    (tmp_path / "u.jsonl").write_text("".join(
        json.dumps({"timestamp": t, "input_length": 100, "output_length": 1, "hash_ids": h}) + "\n" for t, h in rows))
    df = load_trace(tmp_path / "u.jsonl")
    assert df["timestamp_ms"].to_list() == [10, 10, 20] and df["hash_ids"].to_list() == [[2], [3], [1]]


def test_chunk_counts_and_partial_last_chunk():
    blocks = [7, 8, 9]  # 1,300 tokens: blocks 0 and 1 full, block 2 partial (276 tokens)
    assert len(chunk_hashes(blocks, 1300, 512)) == 2
    assert len(chunk_hashes(blocks, 1300, 256)) == 5  # 1,280 tokens in full chunks
    assert len(chunk_hashes(blocks, 1300, 64)) == 20
    assert len(chunk_hashes(blocks, 1300, 1024)) == 1
    assert chunk_hashes(blocks, 1300, 2048) == []


def test_chunk_hashes_follow_shared_prefixes():
    a = chunk_hashes([1, 2, 3, 4], 2048, 256)
    b = chunk_hashes([1, 2, 5, 6], 2048, 256)
    assert a[:4] == b[:4] and not set(a[4:]) & set(b)  # share the first two blocks = four 256-chunks
    big_a = chunk_hashes([1, 2, 3, 4], 2048, 1024)
    big_b = chunk_hashes([1, 2, 5, 6], 2048, 1024)
    assert big_a[0] == big_b[0] and big_a[1] != big_b[1]
    # different chunk sizes never produce the same hash for the same content
    assert not set(chunk_hashes([1, 2], 1024, 512)) & set(chunk_hashes([1, 2], 1024, 1024))
    assert all(0 <= h < 2**64 for h in a)


def test_vectorised_chunking_equals_scalar(conversation):
    sample = conversation.head(400)
    ids = sample["hash_ids"].to_list()
    lengths = sample["input_length"].to_list()
    for c in CHUNK_TOKEN_CHOICES:
        flat, offsets = chunk_hash_table(ids, lengths, c)
        scalar = [chunk_hashes(h, n, c) for h, n in zip(ids, lengths, strict=True)]
        assert flat == [x for s in scalar for x in s], c
        assert np.diff(offsets).tolist() == [n // c for n in lengths]


def test_bad_chunk_size_lists_choices():
    with pytest.raises(KnobError, match="valid choices: 64, 128, 256, 512, 1024, 2048"):
        chunk_hashes([1], 100, 300)


def test_synthetic_is_deterministic_per_seed():
    a = synthetic("rag", seed=3, duration_s=60)
    assert a.equals(synthetic("rag", seed=3, duration_s=60))
    assert not a.equals(synthetic("rag", seed=4, duration_s=60))
    assert a.schema == pl.Schema(WORKLOAD_SCHEMA)
    assert (a["hash_ids"].list.len() == (a["input_length"] + 511) // 512).all()
    assert a["timestamp_ms"].is_sorted()


def test_presets_exist_with_descriptions():
    assert {"rag", "sessions", "shift"} <= set(PRESETS) and all(PRESETS.values())
    with pytest.raises(WorkloadError, match="valid choices: rag, sessions, shift, short"):
        synthetic("nope", seed=0)


def test_multi_turn_sessions_extend_the_previous_prompt():
    df = synthetic("sessions", seed=1, duration_s=120)
    turns = df.filter(pl.col("session_id").is_not_null()).group_by("session_id", maintain_order=True).agg(
        "hash_ids", "input_length", "output_length")
    checked = 0
    for ids, lengths, outs in zip(turns["hash_ids"].to_list(), turns["input_length"].to_list(),
                                  turns["output_length"].to_list(), strict=True):
        for prev, nxt, plen, pout, nlen in zip(ids, ids[1:], lengths, outs, lengths[1:], strict=False):
            assert nlen > plen + pout  # previous prompt + its output + a new user message
            full = plen // 512  # the previous prompt's full blocks are shared verbatim
            assert nxt[:full] == prev[:full]
            checked += 1
    assert checked > 50


def test_poisson_rate_and_zipf_popularity():
    ph = Phase(duration_s=400.0, rate_rps=5.0, system_prompts=2, rag_docs=50, rag_share=1.0, rag_zipf_s=1.2)
    df = generate([ph], seed=11)
    assert 1800 <= df.height <= 2200  # 2,000 expected
    # Zipf: the most popular document prefix (block 0 is the system prompt; docs follow) dominates
    second = df["hash_ids"].list.get(2, null_on_oob=True).value_counts(sort=True)
    top = second["count"].to_list()
    assert top[0] > 3 * top[len(top) // 2]


def test_shift_preset_changes_overlap_between_phases():
    from contracts.knobs import Knobs
    from simulator.cluster import ClusterSpec
    from simulator.replay import replay

    df = synthetic("shift", seed=2, duration_s=300)
    assert set(df["phase"].to_list()) == {0, 1}
    r = replay(df, ClusterSpec(pods=1, gpu_tokens=0, cpu_tokens=0, l2_tokens=0), Knobs()).requests
    per_phase = r.group_by("phase").agg(
        overlap=1 - (pl.col("cold_tokens").sum() + pl.col("tail_tokens").sum()) / pl.col("prompt_tokens").sum(),
        sessions=pl.col("session_id").n_unique(),
    ).sort("phase")
    o0, o1 = per_phase["overlap"].to_list()
    assert o0 > 0.6 and o1 < o0 - 0.1
    assert per_phase["sessions"].to_list()[1] > 20
