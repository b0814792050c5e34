"""The OpenTelemetry exporter's settings: the `otel:` section of the agent's configuration.

They live beside the exporter that reads them, so `exporters/` needs nothing from `agent/`; the
agent's settings (agent/settings/loading.py: AgentSettings) compose this section with the others."""
from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field


class OtelSettings(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    endpoint: str | None = Field(None, description="OTLP endpoint; unset disables OpenTelemetry export")
    protocol: Literal["http", "grpc"] = "http"
    interval_s: float = Field(15.0, gt=0, le=3600.0, description="export interval")
    timeout_s: float = Field(10.0, gt=0, le=300.0)
    headers: dict[str, str] = Field(default_factory=dict)
    service_name: str = "tierpilot-agent"
    genai_operation: str = Field("chat", description="gen_ai.operation.name on TTFT")
    genai_provider: str = Field("vllm", description="gen_ai.provider.name on TTFT")
