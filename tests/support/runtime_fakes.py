"""A scriptable vLLM 0.33 /metrics payload for runtime tests: cumulative counters that grow as
the test "serves" requests, rendered in the classic text format vLLM exposes (colon names,
`model_name` label, TTFT and prompt-length histograms)."""
from __future__ import annotations

import dataclasses
import math

MODEL = "meta-llama/Llama-3.1-8B-Instruct"
TTFT_BOUNDS = (0.05, 0.1, 0.2, 0.3, 0.5, 0.75, 1.0, 2.5, 5.0, 10.0)
PROMPT_BOUNDS = (128.0, 256.0, 512.0, 1024.0, 2048.0, 4096.0, 8192.0)


def _le(b: float) -> str:
    return "+Inf" if math.isinf(b) else repr(float(b))


@dataclasses.dataclass
class FakeVllm:
    """Cumulative vLLM counters of one pod."""

    model: str = MODEL
    requests: float = 0.0
    prompt_tokens: float = 0.0
    computed_tokens: float = 0.0
    external_hits: float = 0.0
    gpu_queries: float = 0.0
    gpu_hits: float = 0.0
    ttft: list[float] = dataclasses.field(default_factory=lambda: [0.0] * (len(TTFT_BOUNDS) + 1))
    ttft_sum: float = 0.0
    prompts: list[float] = dataclasses.field(default_factory=lambda: [0.0] * (len(PROMPT_BOUNDS) + 1))
    waiting: float | None = None  # vllm:num_requests_waiting (gauge), absent when None
    gpu_blocks: int | None = None  # vllm:cache_config_info num_gpu_blocks (16-token blocks), absent when None

    def serve(self, n: int, *, ttft_s: float = 0.25, prompt: int = 2000, gpu_hit: float = 0.5,
              external_hit: float = 0.2) -> None:
        """n requests of `prompt` tokens, each with TTFT `ttft_s`."""
        self.requests += n
        self.prompt_tokens += n * prompt
        self.gpu_queries += n * prompt
        self.gpu_hits += n * prompt * gpu_hit
        self.external_hits += n * prompt * external_hit
        self.computed_tokens += n * prompt * (1.0 - gpu_hit - external_hit)
        self.ttft[next((i for i, b in enumerate(TTFT_BOUNDS) if ttft_s <= b), len(TTFT_BOUNDS))] += n
        self.ttft_sum += n * ttft_s
        self.prompts[next((i for i, b in enumerate(PROMPT_BOUNDS) if prompt <= b), len(PROMPT_BOUNDS))] += n

    def text(self) -> str:
        m = f'model_name="{self.model}"'
        lines = []

        def counter(name: str, value: float, extra: str = "") -> None:
            lines.append(f"# TYPE {name} counter")
            lines.append(f"{name}_total{{{m}{extra}}} {value}")

        counter("vllm:request_success", self.requests, ',finished_reason="stop"')
        counter("vllm:prompt_tokens", self.prompt_tokens)
        lines.append("# TYPE vllm:prompt_tokens_by_source counter")
        lines.append(f'vllm:prompt_tokens_by_source_total{{{m},source="local_compute"}} {self.computed_tokens}')
        lines.append(f'vllm:prompt_tokens_by_source_total{{{m},source="local_cache_hit"}} {self.gpu_hits}')
        lines.append(f'vllm:prompt_tokens_by_source_total{{{m},source="external_kv_transfer"}} {self.external_hits}')
        counter("vllm:prefix_cache_queries", self.gpu_queries)
        counter("vllm:prefix_cache_hits", self.gpu_hits)
        counter("vllm:external_prefix_cache_queries", self.gpu_queries - self.gpu_hits)
        counter("vllm:external_prefix_cache_hits", self.external_hits)
        for name, bounds, counts, total in (
                ("vllm:time_to_first_token_seconds", TTFT_BOUNDS, self.ttft, self.ttft_sum),
                ("vllm:request_prompt_tokens", PROMPT_BOUNDS, self.prompts, self.prompt_tokens)):
            lines.append(f"# TYPE {name} histogram")
            cum = 0.0
            for b, c in zip((*bounds, math.inf), counts, strict=True):
                cum += c
                lines.append(f'{name}_bucket{{{m},le="{_le(b)}"}} {cum}')
            lines.append(f"{name}_sum{{{m}}} {total}")
            lines.append(f"{name}_count{{{m}}} {cum}")
        if self.gpu_blocks is not None:
            lines.append("# TYPE vllm:cache_config_info gauge")
            lines.append(f'vllm:cache_config_info{{block_size="16",enable_prefix_caching="True",'
                         f'num_gpu_blocks="{self.gpu_blocks}"}} 1.0')
        if self.waiting is not None:
            lines.append("# TYPE vllm:num_requests_waiting gauge")
            lines.append(f"vllm:num_requests_waiting{{{m}}} {self.waiting}")
        return "\n".join(lines) + "\n"
