"""The window store's read API for the tuner and the drift detector: pure functions over
`window()` (pod/model None means all of them, summed)."""
from __future__ import annotations

from collections.abc import Sequence

import polars as pl

from agent.collect.counter_math import histogram_quantiles
from agent.collect.tiers import cumulative_hit_ratios as _cumulative
from agent.collect.tiers import derive_tiers, prompt_lookups
from agent.collect.window import bucket_increases, bucket_shares, select, signal_rate, signal_values
from contracts.tier_model import QUANTILES


class WindowReads:
    """What the tuner and the drift detector read from a store's window (`window()` is the store's)."""

    def window(self, window_s: float | None = None, now: float | None = None) -> pl.DataFrame:
        raise NotImplementedError

    def values(self, pod: str | None = None, model: str | None = None,
               window_s: float | None = None) -> tuple[dict[str, float], dict[str, str]]:
        """Signal -> window value (counters: increase; gauges: latest), and signal -> source."""
        return signal_values(select(self.window(window_s), pod, model))

    def ttft_bucket_deltas(self, pod: str | None = None, model: str | None = None,
                           window_s: float | None = None) -> list[tuple[float, float]]:
        """(upper bound, cumulative count observed in the window), ascending, +Inf last."""
        return bucket_increases(select(self.window(window_s), pod, model), "ttft_seconds")

    def ttft_quantiles(self, pod: str | None = None, model: str | None = None,
                       window_s: float | None = None, qs: Sequence[float] = QUANTILES) -> dict[float, float]:
        buckets = self.ttft_bucket_deltas(pod, model, window_s)
        return dict(zip(qs, histogram_quantiles(qs, buckets), strict=True))

    def hit_ratios(self, pod: str | None = None, model: str | None = None,
                   window_s: float | None = None) -> dict[str, float]:
        """Tier-conditional hit ratio per tier over the window (tiers without traffic absent)."""
        values, sources = self.values(pod, model, window_s)
        out = {}
        for t in derive_tiers(values, sources):
            r = t.hit_ratio
            if r is not None:
                out[t.tier] = r
        return out

    def cumulative_hit_ratios(self, pod: str | None = None, model: str | None = None,
                              window_s: float | None = None) -> dict[str, float]:
        values, sources = self.values(pod, model, window_s)
        return _cumulative(derive_tiers(values, sources), prompt_lookups(values))

    def prompt_token_rate(self, pod: str | None = None, model: str | None = None,
                          window_s: float | None = None) -> float | None:
        return signal_rate(select(self.window(window_s), pod, model), "prompt_tokens")

    def request_rate(self, pod: str | None = None, model: str | None = None,
                     window_s: float | None = None) -> float | None:
        return signal_rate(select(self.window(window_s), pod, model), "requests")

    def prompt_length_mix(self, pod: str | None = None, model: str | None = None,
                          window_s: float | None = None) -> list[tuple[float, float, float]]:
        """(lower, upper, share of requests) per `vllm:request_prompt_tokens` bucket in the window."""
        return bucket_shares(bucket_increases(select(self.window(window_s), pod, model), "prompt_length_tokens"))


__all__ = ["WindowReads"]
