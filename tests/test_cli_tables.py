"""Tables at 80 columns: no number, unit or source name is split or cut, headers keep their words
(never `mo…`), counts are abbreviated, and every line fits: scrape-once, kv-events, replay, tune."""
from __future__ import annotations

import logging
import re
import threading
from pathlib import Path

from click.testing import CliRunner
from rich.console import Console

from agent.cli import main
from contracts.console_tables import count, table
from emulator.cluster.kv_publisher import KvEventPublisher
from tests.support.fake_targets import MetricsServer

FIXTURES = Path(__file__).parent / "fixtures"
NARROW = {"COLUMNS": "80"}


def _render(t, width: int = 80) -> list[str]:
    console = Console(width=width, record=True, force_terminal=False)
    with console.capture() as cap:
        console.print(t)
    return cap.get().splitlines()


def _whole(lines: list[str], cell: str) -> bool:
    return any(cell in line for line in lines)


def test_count_abbreviates_and_stays_short():
    assert count(None) == "-"
    assert count(99_999) == "99,999"
    assert count(2_987_590) == "2.99M"
    assert count(123_456) == "123k"
    assert count(7.5e12) == "7.5T"
    assert all(len(count(10 ** k + 7)) <= 7 for k in range(16))


def test_no_cell_of_a_number_column_is_split_at_80_columns():
    rows = [(f"http://10.0.{i}.5:8000/metrics/very/long/path", "vllm_by_source", count(2_987_590 * i),
             count(123_456_789), "37.5%", "1,234.5", "42 files\n50.0 GiB", "some long note that folds")
            for i in range(1, 4)]
    cols = ("target", "source", "lookup tok", "hit tok", "hit ratio", "TTFT p95 (ms)", "evicted", "note")
    lines = _render(table("t", cols, rows, text=("target", "note"), width=80))
    assert max(map(len, lines)) <= 80
    for row in rows:
        for cell in row[1:7]:
            for part in cell.splitlines():
                assert _whole(lines, part), (part, "\n".join(lines))
    header = " ".join(lines[:next(i for i, line in enumerate(lines) if "───" in line)])
    for word in ("lookup", "ratio", "TTFT", "(ms)", "evicted", "source"):
        assert word in header, header
    assert "…" not in "\n".join(lines)


def test_scrape_once_at_80_columns_keeps_numbers_and_sources_whole():
    vllm = (FIXTURES / "vllm_0_33_dp2.prom").read_text()
    big = re.sub(r"^(vllm:prompt_tokens_total\{[^}]*\}) \S+", r"\1 2987590", vllm, flags=re.MULTILINE)
    with MetricsServer() as srv:
        url = srv.route("/metrics", text=big)
        fuse = srv.route("/fuse", text=(FIXTURES / "curvine_fuse.prom").read_text())
        result = CliRunner().invoke(main, ["scrape-once", "-t", f"vllm/vllm-llama-0={url}",
                                           "-t", f"curvine-fuse/vllm-llama-0={fuse}", "--format", "table"], env=NARROW)
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    assert max(map(len, lines)) <= 80
    for cell in ("vllm_by_source", "vllm_v1", "16,000", "37.5%", "125.0", "742.9", "curvine-fuse", "8.67"):
        assert _whole(lines, cell), (cell, result.output)
    assert _whole(lines, "5.98M")  # two data-parallel series of 2,987,590 prompt tokens, abbreviated
    assert "(ms)" in result.output and " ms " not in result.output  # the unit in the header, once
    assert "…" not in result.output


def test_scrape_once_shows_native_tierings_per_tier_ratios_and_l2_read_time(samples_dir):
    text = (samples_dir / "vllm_0_32_cpu_native_tiering_metrics.prom").read_text()
    with MetricsServer() as srv:
        url = srv.route("/metrics", text=text)
        result = CliRunner().invoke(main, ["scrape-once", "-t", f"vllm/engine-0={url}", "--format", "table"],
                                    env=NARROW)
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    assert max(map(len, lines)) <= 80
    # the capture: CPU tier 368 hits of 3,530 chunk lookups, fs tier 496 of 539; fs reads 1.0413 s
    for cell in ("vllm_tiering", "usage", "10.4%", "92.0%", "1.04", f"{1.0412832689989955 / 496 * 1000:.2f}"):
        assert _whole(lines, cell), (cell, result.output)


def test_kv_events_at_80_columns_has_whole_headers():
    with KvEventPublisher("tcp://127.0.0.1:0", bind=True) as pub:
        from tests.test_kvevents_cli import stored_event

        def feed() -> None:
            pub.wait_subscribed()
            pub.publish([stored_event([1, 2], None, 16)], ts=1.0)

        t = threading.Thread(target=feed)
        t.start()
        result = CliRunner().invoke(main, ["kv-events", "--endpoint", f"a-rather-long-pod-name-0={pub.endpoint}",
                                           "--model", "meta-llama/Llama-3.1-8B-Instruct", "--interval", "1.0",
                                           "--duration", "1.5"], env=NARROW)
        t.join()
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    assert max(map(len, lines)) <= 80, result.output
    assert "…" not in result.output
    for word in ("model", "msgs", "stored", "removed", "restarts", "rejected", "cold", "capacity", "routing",
                 "overlap", "resident"):
        assert _whole(lines, word), (word, result.output)
    assert _whole(lines, "100.0%")  # both stored blocks were cold misses


def test_replay_and_tune_tables_fit_80_columns(tmp_path):
    replay = CliRunner().invoke(main, ["replay", "--pods", "2", "--duration", "60", "--rate", "4"], env=NARROW)
    assert replay.exit_code == 0, replay.output
    lines = replay.output.splitlines()
    assert max(map(len, lines[2:])) <= 80  # the header lines before the tables are prose, soft-wrapped
    for word in ("capacity", "lookup", "evicted", "chunks", "TTFT p50 / p95 / p99"):
        assert _whole(lines, word), (word, replay.output)
    tune = CliRunner().invoke(main, ["tune", "--workload", "short", "--duration", "60", "--pods", "2", "--trials", "2",
                                     "-q", "--storage", f"sqlite:///{tmp_path}/s.db"], env=NARROW)
    assert tune.exit_code == 0, tune.output
    table_lines = tune.output.splitlines()[tune.output.splitlines().index(
        next(x for x in tune.output.splitlines() if x.startswith("best configuration"))):]
    assert max(map(len, table_lines)) <= 80, tune.output
    assert "…" not in tune.output


def test_tune_in_process_leaves_the_callers_logging_as_it_was(tmp_path):
    import optuna

    tuner_log = logging.getLogger("tierpilot.tuner")
    before = tuner_log.level, optuna.logging.get_verbosity()
    tune = CliRunner().invoke(main, ["tune", "--workload", "short", "--duration", "30", "--pods", "2", "--trials", "1",
                                     "-q", "--storage", f"sqlite:///{tmp_path}/s.db"])
    assert tune.exit_code == 0, tune.output
    assert (tuner_log.level, optuna.logging.get_verbosity()) == before  # a later caller still sees INFO events
