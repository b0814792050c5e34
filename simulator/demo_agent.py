"""The agent, wired for the demo from issue 3's public pieces: static targets (the emulated
endpoints), concurrent scrapes (`agent.scrape.fetch`), parsing and normalisation through the
mapping files, the polars `WindowStore`, the unified snapshot, the Prometheus export
(`exporters.prom.build_registry`, classic text on 127.0.0.1) and the KV-event manager.

Its clock is the emulated cluster's (trace seconds), so windows, rates and the tuner's live
windows all speak cluster time. `StoreWindowSource` gives the tuner's live evaluator its
`WindowSource` over the store; `drift_signals()` gives the drift detector its inputs.
"""
from __future__ import annotations

import asyncio
import http.server
import logging
import math
import threading
from collections.abc import Callable, Sequence

from prometheus_client import generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST
from prometheus_client.registry import Collector

from agent.kvevents import EndpointSpec, KvEventManager, KvEventsCollector, KvEventsSettings, workload_overlap
from agent.mapping import load_mappings
from agent.model import Snapshot, Target, TargetStatus
from agent.normalise import normalise, resolve
from agent.parse import ParseError, parse
from agent.scrape import FetchOk, fetch, new_session
from agent.snapshot import build_snapshot
from agent.store import WindowStore
from tuners.objective import TtftObservations

log = logging.getLogger("tierpilot.demo.agent")
LONG_PROMPT_TOKENS = 4096


class StoreWindowSource:
    """`tuners.live.WindowSource` over the agent's store (fleet-wide; windows end at `until`)."""

    def __init__(self, store: WindowStore) -> None:
        self.store = store

    def ttft_observations(self, since: float, until: float) -> TtftObservations | None:
        cumulative = self.store.ttft_bucket_deltas(window_s=max(until - since, 1e-6))
        if not cumulative or cumulative[-1][1] <= 0:
            return None
        per_bucket, prev = [], 0.0
        for le, c in cumulative:
            per_bucket.append((le, max(c - prev, 0.0)))
            prev = max(prev, c)
        return TtftObservations(buckets=tuple(per_bucket))

    def cumulative_hit_ratio(self, since: float, until: float) -> float | None:
        ratios = self.store.cumulative_hit_ratios(window_s=max(until - since, 1e-6))
        for tier in ("l2", "cpu", "gpu"):
            if ratios.get(tier) is not None:
                return ratios[tier]
        return None


class _Handler(http.server.BaseHTTPRequestHandler):
    server: _Server

    def do_GET(self) -> None:
        if self.path.split("?", 1)[0] != "/metrics":
            self.send_error(404)
            return
        body = generate_latest(self.server.registry)
        self.send_response(200)
        self.send_header("Content-Type", CONTENT_TYPE_LATEST)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: object) -> None:
        return


class _Server(http.server.ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, port: int, registry: object) -> None:
        self.registry = registry
        super().__init__(("127.0.0.1", port), _Handler)


def bind_export(port: int, registry: object) -> tuple[_Server, str | None]:
    """Bind 127.0.0.1:port, or a free port with a message saying why."""
    try:
        return _Server(port, registry), None
    except OSError as exc:
        server = _Server(0, registry)
        return server, (f"127.0.0.1:{port} is not available ({exc.strerror or exc}); the agent exports on "
                        f"127.0.0.1:{server.server_address[1]} instead")


class DemoAgent:
    """Scrape -> normalise -> store -> snapshot -> /metrics, plus KV events, in background threads."""

    def __init__(self, targets: Sequence[Target], *, clock: Callable[[], float], port: int = 9400,
                 scrape_interval_s: float = 0.5, kv_endpoints: Sequence[EndpointSpec] = (),
                 kv_bytes_per_token: float | None = None, window_s: float = 120.0, retention_s: float = 1800.0,
                 extra_collectors: tuple[Collector, ...] = ()) -> None:
        self.targets = tuple(targets)
        self.clock = clock
        self.scrape_interval_s = scrape_interval_s
        self.kv_bytes_per_token = kv_bytes_per_token
        self.mappings = load_mappings()
        self.store = WindowStore(retention_s=retention_s, window_s=window_s, clock=clock)
        self.window_source = StoreWindowSource(self.store)
        self.kv = KvEventManager(KvEventsSettings(endpoints=tuple(kv_endpoints), overlap_window_s=window_s),
                                 clock=clock) if kv_endpoints else None
        extra = extra_collectors + ((KvEventsCollector(self.kv.snapshot),) if self.kv else ())
        from exporters.prom import build_registry

        self.registry = build_registry(self.snapshot, extra=extra)
        self._server, self.port_message = bind_export(port, self.registry)
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}/metrics"
        self._statuses: dict[str, TargetStatus] = {}
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self.cycles = 0
        self._errors: dict[str, dict[str, int]] = {}

    # -- lifecycle -----------------------------------------------------------------------------
    def start(self) -> None:
        t = threading.Thread(target=self._server.serve_forever, kwargs={"poll_interval": 0.2},
                             name="agent-export", daemon=True)
        t.start()
        self._threads.append(t)
        if self.kv is not None:
            self.kv.start()
        s = threading.Thread(target=self._scrape_loop, name="agent-scrape", daemon=True)
        s.start()
        self._threads.append(s)

    def stop(self) -> None:
        self._stop.set()
        self._server.shutdown()
        self._server.server_close()
        if self.kv is not None:
            self.kv.stop()
        for t in self._threads:
            t.join(timeout=5)

    # -- scraping ------------------------------------------------------------------------------
    def _scrape_loop(self) -> None:
        asyncio.run(self._scrape_forever())

    async def _scrape_forever(self) -> None:
        async with new_session(concurrency=32) as session:
            while not self._stop.is_set():
                await self.scrape_cycle(session)
                await asyncio.sleep(self.scrape_interval_s)

    async def scrape_cycle(self, session: object) -> None:
        results = await asyncio.gather(*(fetch(session, t.url, timeout_s=2.0, max_body_bytes=8 << 20)  # type: ignore[arg-type]
                                         for t in self.targets))
        now = self.clock()
        signals = []
        for target, res in zip(self.targets, results, strict=True):
            reason, detail, samples = "", "", 0
            if isinstance(res, FetchOk):
                try:
                    payload = parse(res.text)
                    found = normalise(target, payload, self.mappings).signals
                    signals.extend(found)
                    samples = len(found)
                except ParseError as exc:
                    reason, detail = "parse_error", str(exc)
            else:
                reason, detail = res.reason, res.detail
            errors = self._errors.setdefault(target.url, {})
            if reason:
                errors[reason] = errors.get(reason, 0) + 1
            self._statuses[target.url] = TargetStatus(target, not reason, res.duration_s, reason, detail,
                                                      samples, dict(errors))
        resolved = resolve(signals, self.mappings)
        if resolved:
            self.store.ingest(resolved, ts=now)
        if self.kv is not None:
            for pod in {t.pod for t in self.targets if t.role == "vllm"}:
                values, _ = self.store.values(pod=pod, window_s=1e9)
                total = values.get("prompt_tokens")
                if total is not None:
                    self.kv.observe_prompt_tokens(pod, _model_of(self.store, pod), total, ts=now)
        self.cycles += 1

    def snapshot(self) -> Snapshot:
        return build_snapshot(self.store.window(), list(self._statuses.values()), taken_at=self.clock(),
                              kv_bytes_per_token=self.kv_bytes_per_token, store_rows=self.store.rows)

    # -- signals for the drift detector -----------------------------------------------------------
    def drift_signals(self, window_s: float | None = None) -> dict[str, float]:
        out: dict[str, float] = {}
        req = self.store.request_rate(window_s=window_s)
        tok = self.store.prompt_token_rate(window_s=window_s)
        if req and req > 0:
            out["arrival_rate"] = req
            if tok is not None:
                out["prompt_tokens_mean"] = tok / req
        mix = self.store.prompt_length_mix(window_s=window_s)
        if mix:
            out["long_prompt_fraction"] = sum(share for lo, _hi, share in mix if lo >= LONG_PROMPT_TOKENS)
        overlap = workload_overlap(self.kv, window_s=window_s)
        if overlap is not None and math.isfinite(overlap):
            out["reuse_ratio"] = overlap
        return out


def _model_of(store: WindowStore, pod: str) -> str:
    frame = store.window()
    rows = frame.filter(frame["pod"] == pod)["model"].unique().to_list() if frame.height else []
    models = [m for m in rows if m]
    return models[0] if models else ""
