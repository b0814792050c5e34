"""Measuring a real tiered engine for the twin: calibration requests that hit one tier each, the
engine's own counters, and the tier sizes to replay it with.

The calibration sends, for each of `n` fresh prefixes P (a whole number of offload chunks), four
requests one at a time, each P followed by a fresh suffix, so every request computes a suffix of
its own and finds P in exactly one place:

1. `cold`: nothing cached (P and the suffix computed);
2. `gpu`: P in the KV cache;
3. `cpu`: after the KV cache is emptied (`/reset_prefix_cache`), P in the CPU tier;
4. `fs`: after the KV cache and the CPU tier are emptied (`?reset_external=true`, which lets the
   fs tier finish its writes first), P in the fs tier.

The engine must run with `VLLM_SERVER_DEV_MODE=1` (the reset endpoint) and
`--enable-prompt-tokens-details` (the tokens each request found cached). The counters say how long
the engine's own copies took (CPU tier -> KV cache, fs tier -> CPU tier), which gives the
per-token transfer costs; the TTFTs give the rest (simulator/tier_fit.py).
"""
from __future__ import annotations

import dataclasses
import json
import random
import re
import urllib.request
from collections.abc import Callable, Sequence
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

from emulator.engines.client import Completion, StreamSender
from emulator.engines.tiering import TieringConfig

KINDS = ("cold", "gpu", "cpu", "fs")
FIRST_ID, VOCAB = 4, 4096  # tiny-llama's vocabulary without its special tokens
PAGE = 4096  # vLLM aligns a CPU-tier chunk to the page size (SharedOffloadRegion.BLOCK_SIZE_ALIGNMENT)
COUNTER_PREFIXES = ("vllm:kv_offload_", "vllm:prefix_cache_", "vllm:prompt_tokens_cached_by_source",
                    "vllm:prompt_tokens_total")

Counters = dict[tuple[str, str], float]


class ProbeError(RuntimeError):
    """The engine refused a reset or a calibration request failed (one-line message)."""


def parse_counters(text: str) -> Counters:
    """(metric, `tier` / `source` / `transfer_type` label or '') -> value, summed over the rest."""
    out: Counters = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            if s.name.startswith(COUNTER_PREFIXES):
                label = s.labels.get("tier") or s.labels.get("source") or s.labels.get("transfer_type") or ""
                out[(s.name, label)] = out.get((s.name, label), 0.0) + s.value
    return out


def delta(before: Counters, after: Counters, name: str, label: str = "") -> float:
    return after.get((name, label), 0.0) - before.get((name, label), 0.0)


def kv_cache_tokens(text: str) -> int:
    """The engine's KV cache in tokens: `vllm:cache_config_info` num_gpu_blocks x block_size."""
    blocks = re.search(r'^vllm:cache_config_info{[^}]*num_gpu_blocks="(\d+)"', text, re.MULTILINE)
    size = re.search(r'^vllm:cache_config_info{[^}]*block_size="(\d+)"', text, re.MULTILINE)
    if not (blocks and size):
        raise ProbeError("the engine's /metrics has no cache_config_info with num_gpu_blocks and block_size")
    return int(blocks.group(1)) * int(size.group(1))


def cpu_tier_tokens(cfg: TieringConfig, chunk_tokens: int, kv_bytes_per_token: int) -> int:
    """The CPU tier's capacity in tokens, as vLLM sizes it: `cpu_bytes_to_use` over the chunk's
    bytes rounded up to a page (vllm/v1/kv_offload/cpu/spec.py), whole chunks only."""
    chunk_bytes = -(-chunk_tokens * kv_bytes_per_token // PAGE) * PAGE
    return cfg.cpu_bytes // chunk_bytes * chunk_tokens


@dataclasses.dataclass(frozen=True)
class Sample:
    kind: str  # one of KINDS
    prompt_tokens: int
    cached_tokens: int  # the engine's prompt_tokens_details.cached_tokens: the tokens of P it found
    ttft_s: float

    @property
    def computed_tokens(self) -> int:
        return self.prompt_tokens - self.cached_tokens


@dataclasses.dataclass(frozen=True)
class Calibration:
    samples: list[Sample]
    before: Counters  # the engine's counters around the calibration
    after: Counters

    def of(self, kind: str) -> list[Sample]:
        return [s for s in self.samples if s.kind == kind]

    def save(self, path: Path) -> None:
        path.write_text(json.dumps({
            "samples": [dataclasses.astuple(s) for s in self.samples],
            "before": [[k[0], k[1], v] for k, v in self.before.items()],
            "after": [[k[0], k[1], v] for k, v in self.after.items()]}))

    @classmethod
    def load(cls, path: Path) -> Calibration:
        doc = json.loads(path.read_text())
        return cls([Sample(*row) for row in doc["samples"]], {(a, b): v for a, b, v in doc["before"]},
                   {(a, b): v for a, b, v in doc["after"]})


class TierProbe:
    """One tiered engine's HTTP side: completions, resets, counters. `get`/`post` are injectable."""

    def __init__(self, base_url: str, sender: StreamSender, *, get: Callable[[str], str] | None = None,
                 post: Callable[[str], bytes] | None = None) -> None:
        self.base_url = base_url.rstrip("/")
        self.sender = sender
        self._get = get or _http_get
        self._post = post or _http_post

    def metrics_text(self) -> str:
        return self._get(f"{self.base_url}/metrics")

    def counters(self) -> Counters:
        return parse_counters(self.metrics_text())

    def reset(self, *, cpu_tier: bool) -> None:
        """Empty the KV cache (and the CPU tier when `cpu_tier`); the fs tier keeps its files."""
        url = f"{self.base_url}/reset_prefix_cache" + ("?reset_external=true" if cpu_tier else "")
        try:
            ok = json.loads(self._post(url)).get("success")
        except (OSError, ValueError) as exc:
            raise ProbeError(f"{url}: {exc} (the engine needs VLLM_SERVER_DEV_MODE=1)") from None
        if not ok:
            raise ProbeError(f"{url}: the engine refused to reset its caches")

    def one(self, ids: Sequence[int]) -> Completion:
        c = self.sender.one(0, ids, 0.0)
        if not c.ok:
            raise ProbeError(f"a calibration request failed: {c.error}")
        return c

    def calibrate(self, n: int, *, seed: int, chunk_tokens: int, prefix_chunks: tuple[int, int] = (2, 26),
                  suffix_tokens: tuple[int, int] = (8, 320), progress: Callable[[int, int], None] | None = None
                  ) -> Calibration:
        """`n` prefixes x the four kinds (module docstring), from content seeded by `seed`."""
        rng = random.Random(seed)
        before = self.counters()
        samples: list[Sample] = []
        for i in range(n):
            prefix = _tokens(rng, rng.randint(*prefix_chunks) * chunk_tokens)
            for kind in KINDS:
                if kind == "cpu":
                    self.reset(cpu_tier=False)
                elif kind == "fs":
                    self.reset(cpu_tier=True)
                ids = prefix + _tokens(rng, rng.randint(*suffix_tokens))
                c = self.one(ids)
                samples.append(Sample(kind, c.prompt_tokens, c.cached_tokens or 0, c.latency_s))
            if progress is not None:
                progress(i + 1, n)
        return Calibration(samples, before, self.counters())


def _tokens(rng: random.Random, n: int) -> list[int]:
    return [rng.randrange(FIRST_ID, VOCAB) for _ in range(n)]


def _http_get(url: str) -> str:
    with urllib.request.urlopen(url, timeout=10) as resp:
        return resp.read().decode()


def _http_post(url: str) -> bytes:
    with urllib.request.urlopen(urllib.request.Request(url, data=b"", method="POST"), timeout=60) as resp:
        return resp.read()


__all__ = ["KINDS", "Calibration", "ProbeError", "Sample", "TierProbe", "cpu_tier_tokens", "delta", "kv_cache_tokens",
           "parse_counters"]
