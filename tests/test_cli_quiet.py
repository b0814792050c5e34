"""A quiet, truthful command line: library INFO logs only with --verbose, skipped scheduler runs
counted instead of logged, tables that fit 80 columns without cutting, no empty tables, titles
that say what the numbers are, one-line option errors, the bound address logged as bound, and
`dashboards render` naming the panels it drew without data."""
from __future__ import annotations

import asyncio
import logging
import time
from pathlib import Path

from click.testing import CliRunner

from agent.cli import main
from agent.cli.run import has_target_source
from agent.collect.discovery import StaticTargets
from agent.collect.scheduler import JobSpec, build_scheduler
from agent.runtime.app import Agent
from agent.runtime.logs import DropSkippedRuns
from agent.settings import load_settings
from tests.support.fake_targets import MetricsServer
from tuners.plots import label

FIXTURES = Path(__file__).parent / "fixtures"


def test_library_info_logs_only_with_verbose():
    CliRunner().invoke(main, ["k8s", "--help"])
    assert logging.getLogger("apscheduler").getEffectiveLevel() == logging.WARNING
    assert logging.getLogger("optuna").getEffectiveLevel() == logging.WARNING
    skipped = logging.LogRecord("apscheduler.scheduler", logging.WARNING, "", 0,
                                'Execution of job "scrape" skipped: maximum number of running instances reached (1)',
                                None, None)
    assert not DropSkippedRuns().filter(skipped)
    CliRunner().invoke(main, ["--verbose", "k8s", "--help"])
    assert logging.getLogger("apscheduler").level == logging.NOTSET
    assert not any(isinstance(f, DropSkippedRuns) for f in logging.getLogger("apscheduler.scheduler").filters)
    CliRunner().invoke(main, ["k8s", "--help"])  # back to quiet for the rest of the session


def test_a_skipped_run_is_counted_not_lost():
    seen: list[tuple[str, str]] = []

    async def slow() -> None:
        await asyncio.sleep(0.35)

    async def drive() -> None:
        scheduler = build_scheduler(asyncio.get_running_loop(), [JobSpec("slow", 0.1, slow, first_run_now=True)],
                                    lambda job, outcome: seen.append((job, outcome)))
        scheduler.start()
        await asyncio.sleep(0.6)
        scheduler.shutdown(wait=False)

    asyncio.run(drive())
    assert ("slow", "skipped") in seen and ("slow", "ok") in seen


def test_scrape_once_table_fits_80_columns_and_wraps_instead_of_cutting():
    with MetricsServer() as srv:
        vllm = srv.route("/metrics", text=(FIXTURES / "vllm_0_33_dp2.prom").read_text())
        fuse = srv.route("/fuse", text=(FIXTURES / "curvine_fuse.prom").read_text())
        master = srv.route("/m", text=(FIXTURES / "curvine_master.prom").read_text())
        result = CliRunner().invoke(main, ["scrape-once", "-t", f"vllm/vllm-llama-0={vllm}",
                                           "-t", f"curvine-fuse/vllm-llama-0={fuse}", "-t", master],
                                    env={"COLUMNS": "80"})
        alone = CliRunner().invoke(main, ["scrape-once", "-t", master], env={"COLUMNS": "80"})
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    assert max(len(line) for line in lines) <= 80
    assert "…" not in result.output  # folded, never cut with an ellipsis
    assert "Llama-3.1" in result.output.replace("\n", "")
    assert "one scrape: ratios from lifetime totals" in result.output.replace("\n", " ").replace("  ", " ")
    assert "over the window" not in result.output
    assert "50.0 GiB" in result.output  # Curvine eviction bytes, in a unit of their own
    # only the Curvine master: no traffic, no TTFT, no L2 I/O rows, so no such tables
    assert alone.exit_code == 0 and "Traffic" not in alone.output and "L2 I/O" not in alone.output


def test_run_warns_when_nothing_can_give_it_a_target():
    assert not has_target_source(load_settings())
    assert has_target_source(load_settings(targets={"static": [{"url": "http://127.0.0.1:1/metrics",
                                                                 "role": "vllm", "pod": "p"}]}))


def test_bound_address_is_logged_as_bound(caplog):
    settings = load_settings(server={"host": "0.0.0.0", "port": 0}, scrape={"interval_s": 60})
    with caplog.at_level(logging.INFO, logger="agent.runtime.app"), Agent(settings, StaticTargets([])) as agent:
        deadline = time.monotonic() + 5
        while "listening" not in caplog.text and time.monotonic() < deadline:
            time.sleep(0.05)
    assert f"agent listening on 0.0.0.0:{agent.port}" in caplog.text


def test_kv_events_bad_endpoint_is_one_line_naming_the_option():
    result = CliRunner().invoke(main, ["kv-events", "--endpoint", "pod-a=http://x:1", "--duration", "1"])
    assert result.exit_code == 1
    assert result.output.strip() == ("Error: --endpoint: endpoint must start with tcp://, ipc:// or inproc://, "
                                     "got 'http://x:1'")
    assert "pydantic" not in result.output


def test_objective_names_become_axis_labels():
    assert label("ttft_p95_s") == "TTFT p95 (s)"
    assert label("ttft_p95_s + memory") == "TTFT p95 + memory cost (s)"
    assert label("memory_gib") == "fleet CPU memory (GiB)"
