"""Helpers for the suite's real vLLM CPU engines (emulator/engines) and the real vllm-router: start
engines in parallel, send completions, read an engine's own /metrics, and count its raw KV-event
stream independently of the agent's decoder.

Nothing here uses agent code: the engine's counters are read with prometheus_client's parser and
the raw stream is decoded with msgspec's generic msgpack decoder, so a test comparing the agent
with these figures compares it with the engine, not with itself.
"""
from __future__ import annotations

import json
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Self

import msgspec
import zmq
from prometheus_client.parser import text_string_to_metric_families

from emulator.engines.engine import EngineProcess, EngineSpec, engine_available, tiny_model_dir
from tests.support.prometheus import free_port

MODEL = "tiny-llama"
ROUTER_BINARY = shutil.which("vllm-router", path=str(Path(sys.executable).parent)) or shutil.which("vllm-router")


def skip_reason() -> str | None:
    """Why the real-engine tests cannot run here (None: they can). `make test` builds the engine
    venv first, so in CI this is None."""
    return engine_available()


def engine_spec(*, cpu_bind: str, kv_events: bool = True, **kw) -> EngineSpec:
    """A tiny-model engine on free ports, publishing KV events (PUB + replay ROUTER) when asked."""
    ports = {"kv_events_port": free_port(), "replay_port": free_port()} if kv_events else {}
    return EngineSpec(model=tiny_model_dir(), port=free_port(), cpu_bind=cpu_bind, **ports, **kw)


def start_engines(specs: Sequence[EngineSpec], scratch: Path, timeout: float = 300.0) -> list[EngineProcess]:
    """Start every engine, then wait for all (they load in parallel); stops them all on failure."""
    engines = [EngineProcess(s, scratch / f"engine-{i}") for i, s in enumerate(specs)]
    try:
        for e in engines:
            e.start()
        for e in engines:
            e.wait_healthy(timeout)
    except BaseException:
        for e in engines:
            e.stop()
        raise
    return engines


def complete(base_url: str, prompt: str | list[int], max_tokens: int = 1, timeout: float = 120.0) -> dict:
    """One /v1/completions request (text or token ids); the parsed JSON answer."""
    body = json.dumps({"model": MODEL, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0.0}).encode()
    req = urllib.request.Request(f"{base_url}/v1/completions", data=body, method="POST",
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=timeout) as resp:
        return json.loads(resp.read())


def http_get(url: str, timeout: float = 5.0) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as resp:
            return resp.status, resp.read().decode("utf-8", "replace")
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode("utf-8", "replace")
    except OSError:
        return 0, ""


# -- the engine's own counters -------------------------------------------------------------------
@dataclass(frozen=True)
class EngineCounters:
    """What an engine's /metrics says, read with prometheus_client's parser only."""

    prefix_queries: float
    prefix_hits: float
    prompt_tokens: float
    requests: float
    ttft_buckets: tuple[tuple[float, float], ...]  # (le, cumulative count), +Inf last
    ttft_sum: float
    ttft_count: float
    cache_config: dict[str, str]

    @property
    def hit_ratio(self) -> float:
        return self.prefix_hits / self.prefix_queries


def read_counters(metrics_text: str) -> EngineCounters:
    values: dict[str, float] = {}
    buckets: list[tuple[float, float]] = []
    cache_config: dict[str, str] = {}
    for fam in text_string_to_metric_families(metrics_text):
        for s in fam.samples:
            if s.name == "vllm:time_to_first_token_seconds_bucket":
                buckets.append((float(s.labels["le"]), s.value))
            elif s.name == "vllm:cache_config_info":
                cache_config = dict(s.labels)
            elif s.name == "vllm:request_success_total":
                values["requests"] = values.get("requests", 0.0) + s.value
            else:
                values[s.name] = values.get(s.name, 0.0) + s.value
    return EngineCounters(
        values.get("vllm:prefix_cache_queries_total", 0.0), values.get("vllm:prefix_cache_hits_total", 0.0),
        values.get("vllm:prompt_tokens_total", 0.0), values.get("requests", 0.0),
        tuple(sorted(buckets)), values.get("vllm:time_to_first_token_seconds_sum", 0.0),
        values.get("vllm:time_to_first_token_seconds_count", 0.0), cache_config)


def engine_counters(engine: EngineProcess) -> EngineCounters:
    status, text = http_get(engine.metrics_url)
    assert status == 200, f"{engine.metrics_url} answered {status}"
    return read_counters(text)


# -- an independent count of the raw KV-event stream ---------------------------------------------
@dataclass
class RawCount:
    messages: int = 0
    stored: int = 0
    removed: int = 0
    cleared: int = 0
    restarts: int = 0
    gaps: int = 0
    resident: set[int] = field(default_factory=set)
    last_seq: int | None = None


class RawStream:
    """A SUB socket of its own on an engine's PUB endpoint, in a thread, decoding every frame with
    msgspec's generic decoder: resident block hashes = stored - removed, cleared on
    AllBlocksCleared and on a sequence drop (the engine restarted)."""

    def __init__(self, endpoint: str) -> None:
        self.endpoint = endpoint
        self.count = RawCount()
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._ctx = zmq.Context()
        self._sub = self._ctx.socket(zmq.SUB)
        self._sub.setsockopt(zmq.SUBSCRIBE, b"")
        self._sub.setsockopt(zmq.RCVHWM, 0)  # never drop: this is the reference count
        self._sub.setsockopt(zmq.LINGER, 0)
        self._sub.connect(endpoint)
        self._thread = threading.Thread(target=self._run, name="raw-kv-stream", daemon=True)

    def __enter__(self) -> Self:
        self._thread.start()
        time.sleep(0.3)  # ZMQ slow joiner: connected before the first publish
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(5)
        self._sub.close(0)
        self._ctx.term()

    def _run(self) -> None:
        decoder = msgspec.msgpack.Decoder()
        while not self._stop.is_set():
            if not self._sub.poll(50):
                continue
            _topic, seq_raw, payload = self._sub.recv_multipart()
            seq = int.from_bytes(seq_raw, "big")
            _ts, events, _dp = decoder.decode(payload)
            with self._lock:
                c = self.count
                if c.last_seq is not None and seq <= c.last_seq:
                    c.restarts += 1
                    c.resident.clear()
                elif c.last_seq is not None and seq != c.last_seq + 1:
                    c.gaps += 1
                c.last_seq = seq
                c.messages += 1
                for ev in events:
                    kind = ev["type"]
                    if kind == "BlockStored":
                        c.stored += len(ev["block_hashes"])
                        c.resident.update(ev["block_hashes"])
                    elif kind == "BlockRemoved":
                        c.removed += len(ev["block_hashes"])
                        c.resident.difference_update(ev["block_hashes"])
                    elif kind == "AllBlocksCleared":
                        c.cleared += 1
                        c.resident.clear()

    def snapshot(self) -> RawCount:
        with self._lock:
            c = self.count
            return RawCount(c.messages, c.stored, c.removed, c.cleared, c.restarts, c.gaps, set(c.resident),
                            c.last_seq)

    def wait_quiet(self, quiet_s: float = 0.5, max_s: float = 20.0) -> RawCount:
        """Wait until no message arrived for `quiet_s` (the engine's batches are all in)."""
        end = time.monotonic() + max_s
        last = self.snapshot().messages
        quiet_since = time.monotonic()
        while time.monotonic() < end:
            time.sleep(0.1)
            now = self.snapshot().messages
            if now != last:
                last, quiet_since = now, time.monotonic()
            elif time.monotonic() - quiet_since >= quiet_s:
                break
        return self.snapshot()


# -- workloads -----------------------------------------------------------------------------------
def token_prompt(prefix: Iterable[int], suffix: Iterable[int]) -> list[int]:
    """Token ids of the tiny model's vocabulary (4..4095) for a prompt: prefix then suffix."""
    ids = [*prefix, *suffix]
    assert all(4 <= t < 4096 for t in ids)
    return ids


def words(ids: Iterable[int]) -> str:
    """The same prompt as text: the tiny tokenizer maps word `w{i}` to token id i + 4."""
    return " ".join(f"w{t - 4}" for t in ids)


# -- the real vllm-router -----------------------------------------------------------------------
class Router:
    """vllm-router (the Rust binary of the `vllm-router` wheel) as a child process on 127.0.0.1;
    stopped by its own PID on exit."""

    def __init__(self, workers: Sequence[str], policy: str, *extra: str, env: dict[str, str] | None = None) -> None:
        assert ROUTER_BINARY is not None, "vllm-router is not installed"
        self.port, self.metrics_port = free_port(), free_port()
        self.args = [ROUTER_BINARY, "--host", "127.0.0.1", "--port", str(self.port), "--worker-urls", *workers,
                     "--policy", policy, "--prometheus-host", "127.0.0.1", "--prometheus-port",
                     str(self.metrics_port), "--worker-startup-check-interval", "1", "--log-level", "warning",
                     *extra]
        self.env = env
        self.proc: subprocess.Popen | None = None
        self._log: IO[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def metrics_url(self) -> str:
        return f"http://127.0.0.1:{self.metrics_port}/metrics"

    def __enter__(self) -> Self:
        self._log = tempfile.TemporaryFile()  # closed in __exit__
        self.proc = subprocess.Popen(self.args, stdin=subprocess.DEVNULL, stdout=self._log,
                                     stderr=subprocess.STDOUT, env=self.env)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise AssertionError(f"vllm-router exited {self.proc.returncode}: {self.log()[-2000:]}")
            if http_get(f"{self.url}/health", 2.0)[0] == 200 and http_get(self.metrics_url, 2.0)[0] == 200:
                return self
            time.sleep(0.2)
        self.__exit__()
        raise AssertionError("vllm-router did not become ready in 60 s")

    def __exit__(self, *exc: object) -> None:
        if self.proc is None:
            return
        self.proc.terminate()
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.proc = None
        if self._log is not None:
            self._log.close()
            self._log = None

    def log(self) -> str:
        if self._log is None:
            return ""
        self._log.seek(0)
        return self._log.read().decode(errors="replace")

    def samples(self, name: str) -> dict[tuple[tuple[str, str], ...], float]:
        """The router's own /metrics: every sample of `name`, keyed by its sorted labels."""
        status, text = http_get(self.metrics_url)
        assert status == 200
        out = {}
        for fam in text_string_to_metric_families(text):
            for s in fam.samples:
                if s.name == name:
                    out[tuple(sorted(s.labels.items()))] = s.value
        return out
