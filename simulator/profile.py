"""Hardware profiles (data files in `simulator/profiles/*.yaml`) and the twin's latency model.

A profile holds every latency parameter of one node type plus the default capacities. The
latency model is deliberately small and linear, so the calibration can be solved exactly:

    TTFT = queue delay + request_overhead
           + [l2_retrieve_overhead                                  if any chunk is read from L2]
           + [cpu_load_overhead                       if any chunk is loaded from the CPU tier and none from L2]
           + cpu_chunks x cpu_load_chunk   + cpu_bytes / pcie_bytes_per_s        (CPU -> GPU load)
           + l2_chunks  x l2_read_chunk    + l2_bytes  / l2_read_bytes_per_s     (L2 read)
           + max(computed_tokens, 1) x prefill_s_per_token                        (prefill)
           + max(computed_tokens, 1) x (cached_tokens + computed_tokens / 2)
             x attention_s_per_token2                                             (attention)

The attention term is the quadratic part of a prefill: every computed token attends to the cached
prefix and to the computed tokens before it. It is negligible next to the matrix multiplies of a
large model on a GPU (0 in the GPU profiles, and optional in a profile file) but not for a small
model on a CPU (the `cpu-tiny-llama` profile, fitted on the real engine by bench/real_engine.py).

L2 writes are asynchronous: their latency is observed but never added to TTFT.

`cpu_load_overhead_s` (optional, default 0) is the fixed latency of a request that loads from the
CPU tier: the scheduler steps an asynchronous load waits (vLLM's OffloadingConnector loads
between steps). Like `l2_retrieve_overhead_s` it adds to that request's TTFT, not to the pod's busy
time; a request that also reads L2 pays `l2_retrieve_overhead_s` alone, which covers its whole
wait (the L2 path goes through the CPU tier).

`overhead_busy_share` (optional, 0 to 1, default 0) is the part of `request_overhead` that holds
the pod: on a GPU the API server's work (HTTP, tokenisation, scheduling) runs on host cores beside
the GPU's compute, so a queued request does not wait for it (0); a CPU engine whose API server and
engine core share one core spends the overhead on the core that prefills, so the next request
waits for it too (1).
"""
from __future__ import annotations

import dataclasses
import functools
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml

PROFILE_DIR = Path(__file__).with_name("profiles")
DEFAULT_PROFILE = "g6e-l40s"
OPTIONAL_LATENCY = ("attention_s_per_token2", "overhead_busy_share", "cpu_load_overhead_s")  # may be left out of a profile file (default 0)
SHARES = ("overhead_busy_share",)  # optional keys that are fractions (0 to 1)


class ProfileError(ValueError):
    """An unknown profile or a malformed profile file (the message names the file and key)."""


@dataclasses.dataclass(frozen=True)
class LatencyModel:
    request_overhead_s: float
    prefill_s_per_token: float
    decode_s_per_token: float
    pcie_bytes_per_s: float
    cpu_load_chunk_s: float
    l2_read_chunk_s: float
    l2_read_bytes_per_s: float
    l2_retrieve_overhead_s: float
    l2_write_chunk_s: float
    l2_write_bytes_per_s: float
    attention_s_per_token2: float = 0.0  # optional: s per (computed token x token attended to)
    overhead_busy_share: float = 0.0  # optional: the part of request_overhead_s that holds the pod
    cpu_load_overhead_s: float = 0.0  # optional: fixed latency of a request loading from the CPU tier

    @property
    def overhead_busy_s(self) -> float:
        """The request overhead a queued request waits for (it holds the pod)."""
        return self.request_overhead_s * self.overhead_busy_share

    @property
    def overhead_free_s(self) -> float:
        """The request overhead that adds to the request's own TTFT only."""
        return self.request_overhead_s - self.overhead_busy_s

    def prefill_s(self, computed_tokens: int, cached_tokens: int = 0) -> float:
        """GPU time to prefill the uncached tokens (vLLM always computes at least one token),
        after `cached_tokens` of the prompt were found in a cache."""
        n = max(computed_tokens, 1)
        return n * self.prefill_s_per_token + n * (cached_tokens + 0.5 * n) * self.attention_s_per_token2

    def cpu_load_s(self, chunks: int, nbytes: float) -> float:
        return chunks * self.cpu_load_chunk_s + nbytes / self.pcie_bytes_per_s if chunks else 0.0

    def l2_read_s(self, chunks: int, nbytes: float) -> float:
        """Transfer time of an L2 read (excludes the per-request retrieve overhead)."""
        return chunks * self.l2_read_chunk_s + nbytes / self.l2_read_bytes_per_s if chunks else 0.0

    def l2_write_s(self, chunks: int, nbytes: float) -> float:
        return chunks * self.l2_write_chunk_s + nbytes / self.l2_write_bytes_per_s if chunks else 0.0


@dataclasses.dataclass(frozen=True)
class HardwareProfile:
    name: str
    description: str
    model: str  # the model the calibration refers to (default for --model)
    gpu_memory_gib: float
    gpu_kv_gib: float  # default GPU KV pool per pod
    host_memory_gib: float  # upper bound for the CPU tier per pod
    l2_pool_gib: float  # default size of the shared L2 pool
    latency: LatencyModel


def _positive(source: str, key: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0:
        raise ProfileError(f"{source}: {key}: must be a positive number, got {value!r}")
    return float(value)


def profile_from_mapping(data: Mapping[str, Any], *, source: str) -> HardwareProfile:
    """Validate a parsed profile document."""
    if not isinstance(data, Mapping):
        raise ProfileError(f"{source}: expected a mapping, got {type(data).__name__}")
    top = {f.name for f in dataclasses.fields(HardwareProfile)}
    lat_keys = {f.name for f in dataclasses.fields(LatencyModel)}
    optional = {k for k in OPTIONAL_LATENCY if k in lat_keys}
    unknown = sorted(set(data) - top)
    missing = sorted(top - set(data))
    if unknown or missing:
        raise ProfileError(
            f"{source}: unknown key(s) {unknown or '-'}, missing key(s) {missing or '-'}; "
            f"valid keys: {', '.join(sorted(top))}"
        )
    lat = data["latency"]
    if not isinstance(lat, Mapping):
        raise ProfileError(f"{source}: latency: expected a mapping")
    unknown = sorted(set(lat) - lat_keys)
    missing = sorted(lat_keys - optional - set(lat))
    if unknown or missing:
        raise ProfileError(
            f"{source}: latency: unknown key(s) {unknown or '-'}, missing key(s) {missing or '-'}; "
            f"valid keys: {', '.join(sorted(lat_keys))}"
        )
    values = {k: _positive(source, f"latency.{k}", lat[k]) for k in sorted(lat_keys - optional)}
    for k in sorted(optional & set(lat)):
        v = lat[k]
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not 0 <= v < float("inf"):
            raise ProfileError(f"{source}: latency.{k}: must be a finite number >= 0, got {v!r}")
        if k in SHARES and v > 1:
            raise ProfileError(f"{source}: latency.{k}: must be between 0 and 1, got {v!r}")
        values[k] = float(v)
    latency = LatencyModel(**values)
    from simulator.models import ModelError, get_model

    try:
        get_model(str(data["model"]))
    except ModelError as exc:
        raise ProfileError(f"{source}: {exc}") from None
    return HardwareProfile(
        name=str(data["name"]),
        description=str(data["description"]),
        model=str(data["model"]),
        gpu_memory_gib=_positive(source, "gpu_memory_gib", data["gpu_memory_gib"]),
        gpu_kv_gib=_positive(source, "gpu_kv_gib", data["gpu_kv_gib"]),
        host_memory_gib=_positive(source, "host_memory_gib", data["host_memory_gib"]),
        l2_pool_gib=_positive(source, "l2_pool_gib", data["l2_pool_gib"]),
        latency=latency,
    )


def profile_names() -> list[str]:
    return sorted(p.stem for p in PROFILE_DIR.glob("*.yaml"))


@functools.cache
def _load_builtin(name: str) -> HardwareProfile:
    path = PROFILE_DIR / f"{name}.yaml"
    return load_profile_file(path)


def load_profile_file(path: str | Path) -> HardwareProfile:
    p = Path(path)
    try:
        data = yaml.safe_load(p.read_text())
    except OSError as exc:
        raise ProfileError(f"{p}: cannot read profile: {exc.strerror or exc}") from None
    except yaml.YAMLError as exc:
        raise ProfileError(f"{p}: not valid YAML: {exc}") from None
    return profile_from_mapping(data, source=str(p))


def get_profile(name_or_path: str | HardwareProfile | None = None) -> HardwareProfile:
    """A built-in profile by name, a profile YAML by path, or pass a profile through."""
    if isinstance(name_or_path, HardwareProfile):
        return name_or_path
    name = name_or_path or DEFAULT_PROFILE
    if name in profile_names():
        return _load_builtin(name)
    if name.endswith((".yaml", ".yml")) and Path(name).is_file():
        return load_profile_file(name)
    raise ProfileError(
        f"profile: unknown profile {name!r}; valid choices: {', '.join(profile_names())} (or a path to a profile YAML)"
    )
