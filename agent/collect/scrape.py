"""HTTP fetch of /metrics: concurrent, a total timeout per target, a body size cap, gzip, and
back-off for failing targets. Returns text or a typed failure; never raises for a bad target.

Failure reasons (the `reason` label of `tierpilot_scrape_errors_total`):
  timeout            no complete answer within the timeout (silent target, slow drip)
  connection_refused nothing listens (pod gone, port wrong)
  connection_error   the connection broke mid-response (pod deleted mid-scrape) or DNS failed
  http_4xx/http_5xx  an HTTP error status
  body_too_large     the (decompressed) body exceeds the cap; reading stops at the cap
  incomplete_body    the body ended early: fewer bytes than its Content-Length, a chunked body
                     without its last chunk, a gzip/deflate stream without its end (trailer), or
                     an empty gzip/deflate body (no stream at all); nothing of it is used (a cut
                     payload would read as lower counters)
  bad_encoding       a compressed body that does not decompress, or an encoding not asked for
  redirect           a redirect to another scheme, host or port (or more than MAX_REDIRECTS);
                     redirects within the target's own origin are followed
  parse_error        not UTF-8 or not exposition text (set by the caller after parsing)

Nothing of a response body ever appears in a failure's detail (it is exported in /snapshot and
logged), and credentials in a URL are redacted from it.
"""
from __future__ import annotations

import asyncio
import time
import zlib
from collections.abc import Callable
from dataclasses import dataclass

import aiohttp
from yarl import URL

from contracts.redact import redact_text

ACCEPT = (
    # classic text first: prometheus_client's OpenMetrics output rewrites `vllm:` names to `vllm_`
    "text/plain;version=0.0.4;q=1.0,application/openmetrics-text;version=1.0.0;q=0.5,*/*;q=0.1"
)


@dataclass(frozen=True, slots=True)
class FetchOk:
    text: str
    content_type: str
    body_bytes: int
    duration_s: float


@dataclass(frozen=True, slots=True)
class FetchFailure:
    reason: str
    detail: str
    duration_s: float


FetchResult = FetchOk | FetchFailure


class TooLarge(Exception):
    pass


class BodyFault(Exception):
    """The body cannot be used whole: `reason` is incomplete_body or bad_encoding."""

    def __init__(self, reason: str, detail: str) -> None:
        super().__init__(detail)
        self.reason = reason
        self.detail = detail


# Content-Encoding -> zlib window bits (47: gzip or zlib header, detected; 15: zlib "deflate")
_DECODERS = {"gzip": 31, "x-gzip": 31, "deflate": 47}


MAX_REDIRECTS = 3


async def fetch(
    session: aiohttp.ClientSession,
    url: str,
    *,
    timeout_s: float,
    max_body_bytes: int,
    clock: Callable[[], float] = time.perf_counter,
) -> FetchResult:
    """GET `url` once. The timeout covers connect, headers, redirects and the whole body.

    Redirects are followed by hand, only within the same scheme, host and port (a pod must not be
    able to point the agent at another address, e.g. a metadata service)."""
    start = clock()
    try:
        async with asyncio.timeout(timeout_s):
            current = URL(url)
            for _ in range(MAX_REDIRECTS + 1):
                async with session.get(current, headers={"Accept": ACCEPT, "Accept-Encoding": "gzip"},
                                       allow_redirects=False, auto_decompress=False) as resp:
                    if resp.status in (301, 302, 303, 307, 308):
                        target = _same_origin(current, resp.headers.get("Location", ""))
                        if target is None:
                            return FetchFailure("redirect", f"HTTP {resp.status} to another origin refused",
                                                clock() - start)
                        current = target
                        continue
                    if resp.status >= 400:
                        kind = "http_5xx" if resp.status >= 500 else "http_4xx"
                        return FetchFailure(kind, f"HTTP {resp.status}", clock() - start)
                    if resp.status != 200:
                        return FetchFailure("http_status", f"HTTP {resp.status}", clock() - start)
                    declared = resp.content_length
                    encoding = resp.headers.get("Content-Encoding", "").strip().lower()
                    if encoding in ("", "identity") and declared is not None and declared > max_body_bytes:
                        return FetchFailure("body_too_large", f"Content-Length {declared} > {max_body_bytes}",
                                            clock() - start)
                    body = await _read_capped(resp, max_body_bytes, encoding)
                    content_type = resp.headers.get("Content-Type", "")[:200]
                    break
            else:
                return FetchFailure("redirect", f"more than {MAX_REDIRECTS} redirects", clock() - start)
    except TooLarge:
        return FetchFailure("body_too_large", f"body exceeds {max_body_bytes} bytes", clock() - start)
    except BodyFault as exc:
        return FetchFailure(exc.reason, exc.detail, clock() - start)
    except aiohttp.ClientPayloadError as exc:  # the transfer framing says the body was cut
        return FetchFailure("incomplete_body", _cut_detail(exc), clock() - start)
    except TimeoutError:
        return FetchFailure("timeout", f"no complete answer within {timeout_s:g}s", clock() - start)
    except aiohttp.ClientConnectorError as exc:
        refused = isinstance(exc.os_error, ConnectionRefusedError)
        return FetchFailure("connection_refused" if refused else "connection_error",
                            redact_text(connect_error_detail(exc)), clock() - start)
    except (aiohttp.ClientError, OSError, ValueError) as exc:
        return FetchFailure("connection_error", redact_text(f"{type(exc).__name__}: {exc}"), clock() - start)
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError as exc:
        return FetchFailure("parse_error", f"body is not UTF-8 (byte {exc.start})", clock() - start)
    return FetchOk(text, content_type, len(body), clock() - start)


def connect_error_detail(exc: aiohttp.ClientConnectorError) -> str:
    """`cannot connect to HOST:PORT: connection refused`: the address and the cause, without
    aiohttp's `ssl:default` (which reads as a TLS problem on a plain http:// URL)."""
    os_error = exc.os_error
    if isinstance(os_error, ConnectionRefusedError):
        why = "connection refused"
    else:
        why = (os_error.strerror or str(os_error) or type(os_error).__name__).strip()
    return f"cannot connect to {exc.host}:{exc.port}: {why}"


def _same_origin(current: URL, location: str) -> URL | None:
    """The redirect's target when it stays on `current`'s scheme, host and port; else None."""
    if not location or len(location) > 4096:
        return None
    try:
        target = current.join(URL(location))
    except ValueError:
        return None
    if (target.scheme, target.host, target.port) != (current.scheme, current.host, current.port):
        return None
    if current.user is not None or current.password is not None:  # keep the target's credentials
        target = target.with_user(current.user).with_password(current.password)
    return target


def _cut_detail(exc: aiohttp.ClientPayloadError) -> str:
    text = str(exc)
    if "transfer length" in text or "ContentLength" in text:
        return "the body ended before its Content-Length"
    if "chunk" in text.lower() or "TransferEncoding" in text:
        return "the chunked body ended before its last chunk"
    return "the body ended before the end its framing announced"


async def _read_capped(resp: aiohttp.ClientResponse, cap: int, encoding: str = "") -> bytes:
    """The whole body, decoded; raises TooLarge past `cap` decoded bytes, BodyFault when the body
    is not complete or does not decode."""
    if encoding in ("", "identity"):
        chunks: list[bytes] = []
        size = 0
        async for chunk in resp.content.iter_chunked(1 << 16):
            size += len(chunk)
            if size > cap:
                raise TooLarge
            chunks.append(chunk)
        return b"".join(chunks)
    wbits = _DECODERS.get(encoding)
    if wbits is None:
        raise BodyFault("bad_encoding", f"Content-Encoding {encoding[:40]!r} was not asked for")
    decoder = _Decoder(wbits, cap)
    async for chunk in resp.content.iter_chunked(1 << 16):
        decoder.feed(chunk)
    return decoder.finish(encoding)


class _Decoder:
    """Incremental gzip/deflate decoding with an output cap, that insists on the stream's end:
    a stream without its final block and trailer (CRC32 and length for gzip) is refused.
    Concatenated gzip members are read as one body (as gzip.decompress does)."""

    def __init__(self, wbits: int, cap: int) -> None:
        self.wbits = wbits
        self.cap = cap
        self.out: list[bytes] = []
        self.size = 0
        self.z = zlib.decompressobj(wbits)
        self.started = False

    def feed(self, data: bytes) -> None:
        while data:
            if self.z.eof:  # another gzip member follows the one that ended
                self.z = zlib.decompressobj(self.wbits)
            self.started = True
            try:
                piece = self.z.decompress(data, self.cap + 1 - self.size)
            except zlib.error:
                raise BodyFault("bad_encoding", "the compressed body does not decode") from None
            self.size += len(piece)
            if self.size > self.cap:
                raise TooLarge
            self.out.append(piece)
            data = self.z.unused_data if self.z.eof else self.z.unconsumed_tail

    def finish(self, encoding: str) -> bytes:
        if not self.started:  # even an empty text compresses to a header and a trailer
            raise BodyFault("incomplete_body", f"the {encoding} body is empty (no header, no trailer)")
        if not self.z.eof:
            raise BodyFault("incomplete_body", f"the {encoding} stream ends without its end (no trailer)")
        return b"".join(self.out)


def new_session(concurrency: int = 256, user_agent: str = "tierpilot-agent") -> aiohttp.ClientSession:
    """One session per agent: pooled keep-alive connections, automatic gzip decoding."""
    connector = aiohttp.TCPConnector(limit=concurrency, ttl_dns_cache=30)
    return aiohttp.ClientSession(
        connector=connector, headers={"User-Agent": user_agent}, auto_decompress=True,
        timeout=aiohttp.ClientTimeout(total=None),
    )


class Backoff:
    """Per-target exponential back-off with an injectable clock (seconds).

    After n consecutive failures a target is skipped until base * 2^(n-1) seconds (capped at
    `max_s`) have passed since the last failure. One success clears it."""

    def __init__(self, base_s: float = 5.0, max_s: float = 300.0, clock: Callable[[], float] = time.monotonic):
        self.base_s = base_s
        self.max_s = max_s
        self.clock = clock
        self._state: dict[str, tuple[int, float]] = {}  # key -> (failures, retry_at)

    def ready(self, key: str) -> bool:
        state = self._state.get(key)
        return state is None or self.clock() >= state[1]

    def failures(self, key: str) -> int:
        return self._state.get(key, (0, 0.0))[0]

    def delay(self, failures: int) -> float:
        if failures <= 0 or self.base_s <= 0:
            return 0.0
        return min(self.max_s, self.base_s * 2 ** (failures - 1))

    def failed(self, key: str) -> float:
        """Record a failure; returns the seconds until the next attempt."""
        n = self.failures(key) + 1
        wait = self.delay(n)
        self._state[key] = (n, self.clock() + wait)
        return wait

    def succeeded(self, key: str) -> None:
        self._state.pop(key, None)

    def forget(self, key: str) -> None:
        self._state.pop(key, None)
