"""vLLM's native tiered KV offload for the real CPU engine: the `--kv-transfer-config` JSON (pure).

vLLM 0.32's `OffloadingConnector` with `TieringOffloadingSpec` keys (vllm/v1/kv_offload/tiering/
spec.py): a CPU primary tier of `cpu_bytes_to_use` bytes in chunks of `block_size` tokens, evicted
by `eviction_policy` (`lru` or `arc`), and secondary tiers below it; here at most one, `fs`, files
under `root_dir` named from the block hashes, which never evicts. The spec is the project's
`CpuTieringOffloadingSpec` (emulator/engines/cpu_offload_spec.py), upstream's spec with a worker for
the CPU platform, loaded by the engine through `spec_name` + `spec_module_path`.

    TieringConfig(cpu_bytes=64 << 20, fs_root=Path("/mnt/l2"))   # CPU tier 64 MiB, L2 on files
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

SPEC_NAME = "CpuTieringOffloadingSpec"
SPEC_MODULE = "emulator.engines.cpu_offload_spec"
EVICTION_POLICIES = ("lru", "arc")
SHM = Path("/dev/shm")


class TieringError(ValueError):
    """A tiering configuration the engine would refuse (one-line message)."""


@dataclass(frozen=True)
class TieringConfig:
    """The CPU tier (L1) and an optional fs tier (L2) of one engine."""

    cpu_bytes: int
    chunk_tokens: int | None = None  # tokens per offloaded chunk; None: the engine's block size
    eviction_policy: str = "lru"
    fs_root: Path | None = None
    fs_kv_events: bool = True  # the fs tier publishes `medium "STORAGE"` events
    fs_threads: tuple[int, int] | None = None  # (readers, writers); None: upstream's defaults
    self_describing_kv_events: bool = False  # offload events carry parent hash, tokens, block size
    extra: tuple[tuple[str, Any], ...] = field(default_factory=tuple)  # more extra_config keys, as given

    def __post_init__(self) -> None:
        if self.cpu_bytes <= 0:
            raise TieringError(f"cpu_bytes {self.cpu_bytes}: the CPU tier needs a positive size")
        if self.eviction_policy not in EVICTION_POLICIES:
            raise TieringError(f"eviction_policy {self.eviction_policy!r}: one of {', '.join(EVICTION_POLICIES)}")

    def check_block_size(self, engine_block_size: int) -> None:
        if self.chunk_tokens is not None and self.chunk_tokens % engine_block_size:
            raise TieringError(f"chunk_tokens {self.chunk_tokens}: must be a multiple of the engine's block size "
                               f"{engine_block_size}")


def fs_tier(cfg: TieringConfig) -> dict[str, Any]:
    tier: dict[str, Any] = {"type": "fs", "root_dir": str(cfg.fs_root), "enable_kv_events": cfg.fs_kv_events}
    if cfg.fs_threads is not None:
        tier["n_read_threads"], tier["n_write_threads"] = cfg.fs_threads
    return tier


def kv_transfer_config(cfg: TieringConfig, engine_id: str | None = None) -> dict[str, Any]:
    """The `--kv-transfer-config` value for `cfg` (a dict; json.dumps it for the command line).
    `engine_id` names the CPU tier's shared region, /dev/shm/vllm_offload_<engine_id>.mmap (vLLM
    draws a random one when None)."""
    extra: dict[str, Any] = {"spec_name": SPEC_NAME, "spec_module_path": SPEC_MODULE,
                             "cpu_bytes_to_use": cfg.cpu_bytes, "eviction_policy": cfg.eviction_policy,
                             "self_describing_kv_events": cfg.self_describing_kv_events}
    if cfg.chunk_tokens is not None:
        extra["block_size"] = cfg.chunk_tokens
    if cfg.fs_root is not None:
        extra["secondary_tiers"] = [fs_tier(cfg)]
    extra.update(dict(cfg.extra))
    out: dict[str, Any] = {"kv_connector": "OffloadingConnector", "kv_role": "kv_both",
                           "kv_connector_extra_config": extra}
    if engine_id is not None:
        out["engine_id"] = engine_id
    return out


def kv_transfer_arg(cfg: TieringConfig, engine_id: str | None = None) -> list[str]:
    return ["--kv-transfer-config", json.dumps(kv_transfer_config(cfg, engine_id), separators=(",", ":"))]


def shared_regions(engine_id: str, shm: Path = SHM) -> list[Path]:
    """The CPU tier's shared-memory files of `engine_id` (one per data-parallel rank). vLLM removes
    them when the engine shuts down cleanly; a killed engine leaves them behind."""
    return sorted(shm.glob(f"vllm_offload_{engine_id}*.mmap"))


__all__ = ["EVICTION_POLICIES", "SPEC_MODULE", "SPEC_NAME", "TieringConfig", "TieringError", "kv_transfer_arg",
           "kv_transfer_config", "shared_regions"]
