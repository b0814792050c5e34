"""The README's first tour, run as written from a clean directory (with only the scale turned down:
fewer trials, a shorter demo, free ports): every command in its code blocks succeeds, the scrape
step reaches the demo's pods, and each step leaves what the README says it does."""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import REPO_ROOT
from tests.support.prometheus import fixed_port_range

# the demo step's paced clock waits for its control loop on a busy machine (the 30 s demo may take
# up to 4x), so the whole tour may take minutes under load
pytestmark = pytest.mark.timeout(900)

SMALLER = (("--trials 40", "--trials 3"), ("--duration 60", "--duration 30"), ("sleep 20", "sleep 12"))


def tour_blocks() -> list[list[str]]:
    text = (REPO_ROOT / "README.md").read_text()
    section = text[text.index("## A first tour"):text.index("\n## ", text.index("## A first tour") + 5)]
    return [[line for line in block.splitlines() if line.strip()]
            for block in re.findall(r"```\n(.*?)```", section, flags=re.DOTALL)]


def test_the_tour_needs_nothing_outside_the_repository():
    commands = [line for block in tour_blocks() for line in block]
    assert commands and all(line.startswith(("make ", "tierpilot ", "sleep ", "wait")) for line in commands), commands
    assert not any("../shared" in line for line in commands)  # a clone has no ../shared
    # the scrape step points at what the demo started in the background, on the ports it was given
    scrape = next(line for line in commands if line.startswith("tierpilot scrape-once"))
    demo = next(line for line in commands if line.startswith("tierpilot demo"))
    port = re.search(r"127\.0\.0\.1:(\d+)", scrape).group(1)
    assert f"--pods-port {port}" in demo and demo.rstrip().split("#")[0].strip().endswith("&")


@pytest.fixture(scope="module")
def tour(tmp_path_factory, shared_dir):
    """Run both blocks as one bash script in an empty directory; returns (directory, output)."""
    work = tmp_path_factory.mktemp("tour")
    # the trace the README says to download, as downloaded (a link: nothing is copied into the project)
    (work / "conversation_trace.jsonl").symlink_to(shared_dir / "traces" / "mooncake_fast25_conversation_trace.jsonl")
    base = fixed_port_range(2 * 4 + 1)  # the demo's 4 pods: a vLLM and a FUSE port each, and the master
    lines = []
    for line in (line for block in tour_blocks() for line in block):
        if line.startswith("make setup"):
            continue  # the suite runs inside the environment `make setup` built
        for a, b in SMALLER:
            line = line.replace(a, b)
        line = line.replace("--pods-port 8000", f"--pods-port {base}").replace("127.0.0.1:8000", f"127.0.0.1:{base}")
        lines.append(f"echo '$ {line.split('#')[0].strip()}'\n{line}")
    script = "set -e\n" + "\n".join(lines) + "\n"
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}", "COLUMNS": "80"}
    proc = subprocess.run(["bash", "-c", script], check=False, cwd=work, env=env, capture_output=True, text=True, timeout=840)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    return work, proc.stdout, base


def test_every_tour_step_leaves_what_the_readme_says(tour):
    work, out, _base = tour
    assert (work / "replay.png").stat().st_size > 10_000
    assert (work / "plots" / "history.png").is_file() and "chunk_tokens:" in (work / "best.yaml").read_text()
    assert "knobs:" in out and "Tiers" in out
    report = (work / "demo-report" / "report.md").read_text()
    assert "Interrupted" not in report


def test_the_demo_prints_its_endpoints_and_progress_and_the_scrape_reaches_them(tour):
    _work, out, base = tour
    assert f"vllm-0: vLLM+LMCache http://127.0.0.1:{base}/metrics" in out
    assert re.search(r"KV events tcp://127\.0\.0\.1:\d+ \(replay tcp://127\.0\.0\.1:\d+\)", out)
    assert re.search(r"\[\s+\d+ s / 30 s\] phase \d", out), out  # --no-live is not silent
    scrape = out[out.index("$ tierpilot scrape-once"):]
    assert "Tiers of vllm-0" in scrape and "vllm_v1" in scrape


def test_the_real_trace_step_prints_one_json_object(tour):
    _work, out, _base = tour
    last = [line for line in out.splitlines() if line.startswith("{")][-1]
    summary = json.loads(last)
    assert summary["workload"] == "conversation_trace.jsonl" and summary["requests"] > 1000
