"""The agent for the demo: issue 3's `Agent` app with static targets (the emulated endpoints),
exporting on 127.0.0.1, plus the KV-event manager; the tuner's collector is exported too.

Its clock is the emulated cluster's (trace seconds), so windows, rates and the tuner's live
windows all speak cluster time. `StoreWindowSource` gives the tuner's live evaluator its
`WindowSource` over the store; `drift_signals()` gives the drift detector its inputs.
"""
from __future__ import annotations

import logging
import math
from collections.abc import Callable, Sequence

from prometheus_client.registry import Collector

from agent.app import Agent
from agent.kvevents import EndpointSpec, KvEventManager, KvEventsCollector, KvEventsSettings, workload_overlap
from agent.model import Target
from agent.scheduler import JobSpec
from agent.settings import load_settings
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


class DemoAgent:
    """The real agent (`agent.app.Agent`, issue 3) on the cluster clock, with static targets, plus
    the KV-event manager (`agent.kvevents`) whose collector it exports too."""

    def __init__(self, targets: Sequence[Target], *, clock: Callable[[], float], port: int = 9400,
                 scrape_interval_s: float = 0.5, kv_endpoints: Sequence[EndpointSpec] = (),
                 kv_bytes_per_token: float | None = None, window_s: float = 120.0, retention_s: float = 1800.0,
                 extra_collectors: tuple[Collector, ...] = ()) -> None:
        self.clock = clock
        self.kv = KvEventManager(KvEventsSettings(endpoints=tuple(kv_endpoints), overlap_window_s=window_s),
                                 clock=clock) if kv_endpoints else None
        self._collectors = extra_collectors + ((KvEventsCollector(self.kv.snapshot),) if self.kv else ())
        self._vllm_pods = sorted({t.pod for t in targets if t.role == "vllm"})
        self._overrides = {
            "scrape": {"interval_s": scrape_interval_s, "timeout_s": 2.0, "backoff_base_s": scrape_interval_s,
                    "backoff_max_s": 2.0},
            "store": {"retention_s": retention_s, "window_s": window_s},
            "server": {"host": "127.0.0.1", "port": port},
            "targets": {"static": [{"url": t.url, "role": t.role, "pod": t.pod} for t in targets]},
            "tiers": {"kv_bytes_per_token": kv_bytes_per_token} if kv_bytes_per_token else {},
            "log_level": "WARNING"}
        self.port_message: str | None = None
        self.agent = self._make(port)
        self.store = self.agent.store
        self.window_source = StoreWindowSource(self.store)

    def _make(self, port: int) -> Agent:
        overrides = dict(self._overrides, server={"host": "127.0.0.1", "port": port})
        settings = load_settings(env={}, **overrides)
        jobs = [JobSpec("kv_prompt_tokens", float(self._overrides["scrape"]["interval_s"]),  # type: ignore[index]
                        self._feed_kv)] if self.kv else []
        return Agent(settings, collectors=self._collectors, jobs=jobs, clock=self.clock)

    @property
    def url(self) -> str:
        return self.agent.url

    # -- lifecycle -----------------------------------------------------------------------------
    def start(self) -> None:
        wanted = self.agent.settings.server.port
        try:
            self.agent.start()
        except RuntimeError as exc:
            if wanted == 0:
                raise
            self.agent = self._make(0)
            self.store = self.agent.store
            self.window_source = StoreWindowSource(self.store)
            self.agent.start()
            self.port_message = (f"127.0.0.1:{wanted} is not available ({exc}); the agent exports on "
                                 f"{self.agent.url} instead")
        if self.kv is not None:
            self.kv.start()

    def stop(self) -> None:
        if self.kv is not None:
            self.kv.stop()
        self.agent.stop()

    def _feed_kv(self) -> None:
        """vLLM's prompt-token counter, the denominator of the KV-event overlap signal."""
        assert self.kv is not None
        now = self.clock()
        for pod in self._vllm_pods:
            values, _ = self.store.values(pod=pod, window_s=1e9)
            total = values.get("prompt_tokens")
            if total is not None:
                self.kv.observe_prompt_tokens(pod, _model_of(self.store, pod), total, ts=now)

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
