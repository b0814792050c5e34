"""Settings shared by the dashboards and the alert rules, so the SLO drawn on a panel and the SLO
an alert burns against come from one place. Frozen and validated once; a bad value names its field."""
from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

TtftQuantile = Literal["0.5", "0.95", "0.99"]


class SloSettings(BaseModel):
    """The TTFT service-level objective.

    It is a time-slice SLO over the model's TTFT histogram: a 5-minute slice is bad when
    `histogram_quantile(ttft_quantile)` over the rates of all its pods' buckets is above
    `ttft_seconds` (slices without requests are good). The error ratio is the share of bad slices,
    and `objective` is the share of good slices promised over `period_days`.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    ttft_quantile: TtftQuantile = "0.95"
    ttft_seconds: float = Field(1.0, gt=0, description="TTFT target for the chosen quantile, seconds")
    objective: float = Field(0.99, gt=0, lt=1, description="share of good time slices promised")
    period_days: int = Field(30, ge=1, le=365, description="SLO period the error budget spans")

    @property
    def error_budget(self) -> float:
        return 1.0 - self.objective


class AlertSettings(BaseModel):
    """Thresholds of the non-SLO alerts. Defaults suit the reference deployment (L2 read ~56 ms)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    l2_latency_quantile: TtftQuantile = "0.95"
    l2_read_latency_seconds: float = Field(0.25, gt=0, description="L2 read latency that alerts")
    l2_write_latency_seconds: float = Field(0.5, gt=0, description="L2 write latency that alerts")
    hit_ratio_drop_fraction: float = Field(
        0.5, gt=0, lt=1, description="alert when the hit ratio falls below this share of its baseline")
    hit_ratio_min_baseline: float = Field(
        0.2, ge=0, lt=1, description="ignore collapses from a baseline below this (cold or cache-less)")
    eviction_storm_factor: float = Field(
        4.0, gt=1, description="alert when evictions run this many times faster than the last hour")
    eviction_storm_min_per_second: float = Field(
        5.0, gt=0, description="ignore eviction rates below this (per pod and tier)")
    rollback_storm_count: int = Field(3, ge=1, description="rollbacks within one hour that alert")
    agent_job: str = Field("tierpilot", min_length=1, description="Prometheus job that scrapes the agent")
    agent_stale_seconds: int = Field(180, ge=10, description="no completed scrape cycle for this long")


class BuildSettings(BaseModel):
    """Everything `tierpilot dashboards build` renders from."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    slo: SloSettings = SloSettings()
    alerts: AlertSettings = AlertSettings()
    runbook_base_url: str = Field(
        "https://github.com/tierpilot/tierpilot/blob/main/docs/runbooks.md",
        description="where docs/runbooks.md is served; alert runbook_url = this + '#' + anchor")
    rule_namespace: str = Field("", description="metadata.namespace of the PrometheusRule; empty: none")

    @model_validator(mode="after")
    def _check_url(self) -> BuildSettings:
        if "#" in self.runbook_base_url:
            raise ValueError(f"runbook_base_url must not contain '#': {self.runbook_base_url!r}")
        return self
