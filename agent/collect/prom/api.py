"""A small client for the Prometheus HTTP query API (`/api/v1/query`, `/api/v1/query_range`).

Works against Prometheus and anything that speaks its API (Thanos Query, Mimir, Cortex,
VictoriaMetrics): queries go as form-encoded POSTs, which every one of them accepts, so long
`__name__` regexes never hit a URL length limit. Credentials come from files that are re-read on
each query (a rotated token needs no restart): a bearer token, or basic auth. TLS: a CA file, a
client certificate and key, or no verification.

Nothing here raises for a bad answer: a query returns its result list or a `QueryFailure` with a
reason in the vocabulary of a failed scrape (`timeout`, `connection_refused`, `connection_error`,
`http_4xx`, `http_5xx`), plus `query_error` (the API answered `status: error`, e.g. a bad query
or a server-side timeout) and `auth_error` (a credentials file cannot be read).
"""
from __future__ import annotations

import asyncio
import base64
import ssl
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import aiohttp
import msgspec

from agent.collect.scrape import connect_error_detail
from agent.settings import PrometheusSourceSettings
from contracts.redact import redact_text


@dataclass(frozen=True, slots=True)
class QueryFailure:
    reason: str
    detail: str
    duration_s: float


def ssl_context(settings: PrometheusSourceSettings) -> ssl.SSLContext | bool:
    """The TLS context the settings ask for (True: the system defaults)."""
    tls = settings.tls
    if tls.ca_file is None and tls.cert_file is None and not tls.insecure_skip_verify:
        return True
    ctx = ssl.create_default_context(cafile=str(tls.ca_file) if tls.ca_file else None)
    if tls.cert_file is not None and tls.key_file is not None:
        ctx.load_cert_chain(str(tls.cert_file), str(tls.key_file))
    if tls.insecure_skip_verify:
        ctx.check_hostname = False
        ctx.verify_mode = ssl.CERT_NONE
    return ctx


def auth_header(settings: PrometheusSourceSettings) -> dict[str, str]:
    """The Authorization header from the credentials files; OSError when one cannot be read."""
    if settings.bearer_token_file is not None:
        token = settings.bearer_token_file.read_text().strip()
        return {"Authorization": f"Bearer {token}"}
    if settings.basic_auth is not None:
        password = settings.basic_auth.password_file.read_text().rstrip("\n")
        pair = f"{settings.basic_auth.username}:{password}".encode()
        return {"Authorization": "Basic " + base64.b64encode(pair).decode()}
    return {}


def new_api_session(settings: PrometheusSourceSettings) -> aiohttp.ClientSession:
    connector = aiohttp.TCPConnector(limit=settings.concurrency, ssl=ssl_context(settings), ttl_dns_cache=30)
    return aiohttp.ClientSession(connector=connector, headers={"User-Agent": "tierpilot-agent"},
                                 timeout=aiohttp.ClientTimeout(total=None))


class PrometheusApi:
    """Instant and range queries against one base URL, at most `concurrency` at a time."""

    def __init__(self, settings: PrometheusSourceSettings, clock: Callable[[], float] = time.perf_counter):
        if not settings.url:
            raise ValueError("prometheus.url is not set")
        self.settings = settings
        self.base = settings.url
        self.clock = clock
        self._gate: asyncio.Semaphore | None = None
        self._gate_loop: asyncio.AbstractEventLoop | None = None

    def _semaphore(self) -> asyncio.Semaphore:
        """One gate per event loop (`scrape_now` runs each cycle on a fresh loop)."""
        loop = asyncio.get_running_loop()
        if self._gate is None or self._gate_loop is not loop:
            self._gate, self._gate_loop = asyncio.Semaphore(self.settings.concurrency), loop
        return self._gate

    async def query(self, session: aiohttp.ClientSession, promql: str,
                    at: float | None = None) -> list[dict[str, Any]] | QueryFailure:
        """Instant vector: [{'metric': {...}, 'value': [ts, 'v']}, ...]."""
        form = {"query": promql}
        if at is not None:
            form["time"] = f"{at:.3f}"
        return await self._post(session, "query", form)

    async def query_range(self, session: aiohttp.ClientSession, promql: str, start: float, end: float,
                          step_s: float) -> list[dict[str, Any]] | QueryFailure:
        """Range matrix: [{'metric': {...}, 'values': [[ts, 'v'], ...]}, ...]."""
        form = {"query": promql, "start": f"{start:.3f}", "end": f"{end:.3f}", "step": f"{step_s:g}"}
        return await self._post(session, "query_range", form)

    async def query_body(self, session: aiohttp.ClientSession, promql: str,
                         at: float | None = None) -> tuple[bytes, float] | QueryFailure:
        """An instant query's raw answer and its duration, for a caller that decodes it into its
        own types (table.AnswerDecoder); a failure as for `query`. A body that is not a
        successful answer is decoded here, for its error."""
        form = {"query": promql}
        if at is not None:
            form["time"] = f"{at:.3f}"
        async with self._semaphore():
            got = await self._send(session, "query", form)
        if isinstance(got, QueryFailure):
            return got
        status, body, duration = got
        if status != 200 or not body.startswith(b'{"status":"success"'):
            res = _decode(status, body, promql, duration)
            if isinstance(res, QueryFailure):
                return res
        return body, duration

    async def label_values(self, session: aiohttp.ClientSession, label: str, match: str, start: float,
                           end: float) -> list[str] | QueryFailure:
        """`/api/v1/label/<label>/values` of the series matching `match` in [start, end]: the
        index alone, no samples read (every API-compatible server has it)."""
        params = {"match[]": match, "start": f"{start:.3f}", "end": f"{end:.3f}"}
        async with self._semaphore():
            got = await self._send(session, f"label/{label}/values", params, method="GET")
        if isinstance(got, QueryFailure):
            return got
        status, body, duration = got
        try:
            doc = _JSON.decode(body)
        except msgspec.DecodeError:
            doc = None
        if status == 200 and isinstance(doc, dict) and doc.get("status") == "success" \
                and isinstance(doc.get("data"), list):
            return [str(v) for v in doc["data"]]
        failure = _decode(status, body, match, duration)
        return failure if isinstance(failure, QueryFailure) else QueryFailure(
            "query_error", f"not a label values answer (HTTP {status})", duration)

    async def _post(self, session: aiohttp.ClientSession, endpoint: str,
                    form: dict[str, str]) -> list[dict[str, Any]] | QueryFailure:
        async with self._semaphore():  # waiting for a slot does not count against the timeout
            got = await self._send(session, endpoint, form)
        if isinstance(got, QueryFailure):
            return got
        status, body, duration = got
        return _decode(status, body, form["query"], duration)

    async def _send(self, session: aiohttp.ClientSession, endpoint: str, form: dict[str, str],
                    method: str = "POST") -> tuple[int, bytes, float] | QueryFailure:
        start = self.clock()
        timeout_s = self.settings.timeout_s
        try:
            headers = auth_header(self.settings)
        except OSError as exc:
            return QueryFailure("auth_error", f"cannot read credentials: {exc}", self.clock() - start)
        url = f"{self.base}/api/v1/{endpoint}"
        try:
            if method == "POST":
                # the server gives up a little before the client does, and says so in its answer
                form = {**form, "timeout": f"{max(timeout_s * 0.9, 0.1):.3f}"}  # seconds as a float
                request = session.post(url, data=form, headers=headers)
            else:
                request = session.get(url, params=form, headers=headers)
            async with asyncio.timeout(timeout_s), request as resp:
                body = await resp.read()
                status = resp.status
        except TimeoutError:
            return QueryFailure("timeout", f"no answer within {timeout_s:g}s", self.clock() - start)
        except aiohttp.ClientConnectorError as exc:
            refused = isinstance(exc.os_error, ConnectionRefusedError)
            return QueryFailure("connection_refused" if refused else "connection_error",
                                redact_text(connect_error_detail(exc)),
                                self.clock() - start)
        except (aiohttp.ClientError, OSError) as exc:  # the text may quote the URL: redacted
            return QueryFailure("connection_error", redact_text(f"{type(exc).__name__}: {exc}"), self.clock() - start)
        return status, body, self.clock() - start


_JSON = msgspec.json.Decoder()
URL_HINT = ("is this a Prometheus-compatible query API? Give the URL prefix before /api/v1, e.g. "
            "http://prometheus:9090 or http://thanos-query:9090 (not a pod's /metrics, nor .../api/v1)")


def _decode(status: int, body: bytes, query: str, duration_s: float) -> list[dict[str, Any]] | QueryFailure:
    try:
        doc = _JSON.decode(body)  # msgspec: several times faster than json.loads on large answers
    except msgspec.DecodeError:
        doc = None
    if isinstance(doc, dict) and doc.get("status") == "error":
        return QueryFailure("query_error", f"{doc.get('errorType', 'error')}: {doc.get('error', '')} "
                                           f"(query {query[:120]!r})", duration_s)
    if status in (404, 405, 501):  # nothing serves the query API here: not a Prometheus API's prefix
        return QueryFailure("http_5xx" if status >= 500 else "http_4xx",
                            f"HTTP {status} on /api/v1/query; {URL_HINT}", duration_s)
    if status >= 400:
        return QueryFailure("http_5xx" if status >= 500 else "http_4xx", f"HTTP {status}", duration_s)
    if not isinstance(doc, dict) or doc.get("status") != "success" or not isinstance(doc.get("data"), dict):
        return QueryFailure("query_error", f"not a Prometheus API answer (HTTP {status}); {URL_HINT}", duration_s)
    data = doc["data"]
    result = data.get("result")
    if data.get("resultType") not in ("vector", "matrix") or not isinstance(result, list):
        return QueryFailure("query_error", f"unexpected result type {data.get('resultType')!r}", duration_s)
    return result
