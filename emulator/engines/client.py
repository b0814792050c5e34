"""Sending a request stream to a real engine (or the router in front of engines) over HTTP.

Every request is an OpenAI `/v1/completions` call with a token-id prompt and `max_tokens=1`, so
the response arrives with the first token: its latency is the TTFT the client sees (HTTP, the
API server, queueing and prefill). vLLM's `prompt_tokens_details.cached_tokens` (the engine runs
with `--enable-prompt-tokens-details`) says how many prompt tokens its prefix cache served.

`send_open_loop` sends each request at its own offset from the start (the workload's arrival
times), on worker threads, so requests queue in the engine as they would in production;
`send_closed_loop` sends one after another (no queueing: pure service times). The HTTP call, the
clock and the sleep are injected, so tests drive both without a server. With `retry_for_s`, a
refused connection or a 502/503 (the router restarting) is retried, and the wait counts in the
request's latency, as it would for a user.
"""
from __future__ import annotations

import dataclasses
import json
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

COMPLETIONS_PATH = "/v1/completions"

Post = Callable[[str, bytes, float], tuple[int, bytes]]  # (url, body, timeout) -> (status, body)


@dataclasses.dataclass(frozen=True)
class Completion:
    index: int  # position in the stream
    sent_s: float  # when it was sent, seconds from the stream's start
    latency_s: float  # until the response (with max_tokens=1: the TTFT as the client sees it)
    prompt_tokens: int
    cached_tokens: int | None  # None when the server does not report it
    error: str = ""  # empty when the request succeeded

    @property
    def ok(self) -> bool:
        return not self.error


def http_post(url: str, body: bytes, timeout: float) -> tuple[int, bytes]:
    req = urllib.request.Request(url, body, {"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            return resp.status, resp.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()
    except OSError as exc:
        return 0, str(exc).encode()


def completion_body(ids: Sequence[int], model: str, max_tokens: int = 1) -> bytes:
    return json.dumps({"model": model, "prompt": list(ids), "max_tokens": max_tokens, "temperature": 0.0,
                       "ignore_eos": True}, separators=(",", ":")).encode()


def parse_usage(status: int, body: bytes) -> tuple[int, int | None, str]:
    """(prompt tokens, cached tokens or None, error: '' when fine) from a completion response."""
    if status != 200:
        return 0, None, f"HTTP {status}: {body[:200].decode(errors='replace').strip()}"
    try:
        usage: dict[str, Any] = json.loads(body)["usage"]
    except (ValueError, KeyError, TypeError):
        return 0, None, "response without usage"
    details = usage.get("prompt_tokens_details") or {}
    cached = details.get("cached_tokens") if isinstance(details, dict) else None
    return int(usage.get("prompt_tokens", 0)), (int(cached) if cached is not None else None), ""


class StreamSender:
    """Sends token-id prompts to `base_url` and records one `Completion` per request."""

    def __init__(self, base_url: str | Callable[[], str], *, model: str, max_tokens: int = 1, timeout_s: float = 60.0,
                 post: Post = http_post, clock: Callable[[], float] = time.monotonic,
                 sleep: Callable[[float], None] = time.sleep, retry_for_s: float = 0.0) -> None:
        self._base = base_url  # a callable follows a router that moves (a surge rollout)
        self.model, self.max_tokens, self.timeout_s = model, max_tokens, timeout_s
        self.retry_for_s = retry_for_s  # keep retrying a refused connection or a 502/503 this long
        self.post, self.clock, self.sleep = post, clock, sleep
        self.stop = threading.Event()

    @property
    def url(self) -> str:
        base = self._base() if callable(self._base) else self._base
        return base.rstrip("/") + COMPLETIONS_PATH

    def one(self, index: int, ids: Sequence[int], t0: float) -> Completion:
        sent = self.clock()
        body_out = completion_body(ids, self.model, self.max_tokens)
        while True:
            status, body = self.post(self.url, body_out, self.timeout_s)
            if status not in (0, 502, 503) or self.clock() - sent >= self.retry_for_s or self.stop.is_set():
                break
            self.sleep(0.1)  # the router is restarting: the user waits, and the wait counts
        latency = self.clock() - sent
        prompt, cached, error = parse_usage(status, body)
        return Completion(index, sent - t0, latency, prompt or len(ids), cached, error)

    def send_closed_loop(self, prompts: Sequence[Sequence[int]]) -> list[Completion]:
        t0 = self.clock()
        out = []
        for i, ids in enumerate(prompts):
            if self.stop.is_set():
                break
            out.append(self.one(i, ids, t0))
        return out

    def send_open_loop(self, prompts: Sequence[Sequence[int]], offsets_s: Sequence[float], *, workers: int = 16,
                       on_done: Callable[[Completion], None] | None = None) -> list[Completion]:
        """Request i at `offsets_s[i]` after the start (late ones go at once); all responses."""
        if len(prompts) != len(offsets_s):
            raise ValueError(f"{len(prompts)} prompts but {len(offsets_s)} offsets")
        t0 = self.clock()
        done: list[Completion] = []
        lock = threading.Lock()

        def run(i: int, ids: Sequence[int]) -> None:
            c = self.one(i, ids, t0)
            with lock:
                done.append(c)
            if on_done is not None:
                on_done(c)

        with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="stream") as pool:
            for i, (ids, at) in enumerate(zip(prompts, offsets_s, strict=True)):
                while not self.stop.is_set():
                    wait = at - (self.clock() - t0)
                    if wait <= 0:
                        break
                    self.sleep(min(wait, 0.25))
                if self.stop.is_set():
                    break
                pool.submit(run, i, ids)
        return sorted(done, key=lambda c: c.index)


__all__ = ["Completion", "StreamSender", "completion_body", "http_post", "parse_usage"]
