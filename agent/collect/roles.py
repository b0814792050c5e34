"""Which component a /metrics payload comes from, read from the names it carries. Pure functions.

Used for targets given without a role (`tierpilot scrape-once -t URL`, a targets-file entry
without `role`). The evidence, from the upstream sources cited in docs/agent.md:

- vllm-project/router (Rust, `vllm-router` on PyPI): every family starts `vllm_router_`;
- production-stack router: `vllm:num_incoming_requests` / `vllm:request_latency_seconds`, and its
  engine-like `vllm:` gauges carry a `server` label (an engine's never do);
- vLLM engine: `vllm:` (or `ray_vllm:`) names without `server`; SGLang's `sglang:` counts as an
  engine too. LMCache in-process `lmcache:*` series on the same payload do not change that;
- LMCache MP server: `lmcache_mp_*`; LMCache in-process internal API server: `lmcache:*` alone;
- Curvine (Rust `prometheus` crate, no prefix on master/worker names): the FUSE client has
  `curvine_fuse_*`; the master has quota eviction and inode/worker counts; a worker has its
  block and disk counters.
"""
from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

from contracts.tier_model import Role, Sample

ROUTER_PS_NAMES = frozenset({"vllm:num_incoming_requests", "vllm:num_incoming_requests_total",
                             "vllm:request_latency_seconds_bucket", "vllm:request_latency_seconds_count"})
CURVINE_MASTER_NAMES = frozenset({"eviction_files_deleted", "eviction_trigger_count", "eviction_bytes_freed",
                                  "eviction_lru_cache_size", "inode_file_num", "inode_dir_num", "worker_num",
                                  "allocatable_capacity", "ttl_bucket_len"})
CURVINE_WORKER_NAMES = frozenset({"read_blocks", "write_blocks", "num_blocks", "num_blocks_to_delete",
                                  "failed_disks", "total_disks", "read_time_us", "write_time_us"})

# role -> what the detector calls that payload (for reports)
KIND_NAMES: dict[str, str] = {
    "vllm_router": "vllm-project/router (vllm_router_*)",
    "production_stack_router": "production-stack router (vllm:* with `server`)",
    "vllm": "vLLM engine (vllm:*)",
    "sglang": "SGLang engine (sglang:*)",
    "lmcache_mp": "LMCache MP server (lmcache_mp_*)",
    "lmcache_inprocess": "LMCache in-process API server (lmcache:*)",
    "curvine_fuse": "Curvine FUSE client (curvine_fuse_*)",
    "curvine_master": "Curvine master",
    "curvine_worker": "Curvine worker",
}
KIND_ROLES: dict[str, Role] = {
    "vllm_router": "router", "production_stack_router": "router", "vllm": "vllm", "sglang": "vllm",
    "lmcache_mp": "lmcache", "lmcache_inprocess": "lmcache", "curvine_fuse": "curvine-fuse",
    "curvine_master": "curvine-master", "curvine_worker": "curvine-worker",
}


def detect_kind(by_name: Mapping[str, Sequence[Sample]]) -> str | None:
    """The kind of component (a KIND_NAMES key) the payload's names show, or None."""
    names = set(by_name)
    if any(n.startswith("vllm_router_") for n in names):
        return "vllm_router"
    engine_like = [n for n in names if n.startswith(("vllm:", "ray_vllm:"))]
    if engine_like:
        if names & ROUTER_PS_NAMES or _all_have_server(by_name, engine_like):
            return "production_stack_router"
        return "vllm"
    if any(n.startswith("sglang:") for n in names):
        return "sglang"
    if any(n.startswith("lmcache_mp_") for n in names):
        return "lmcache_mp"
    if any(n.startswith("lmcache:") for n in names):
        return "lmcache_inprocess"
    if any(n.startswith("curvine_fuse_") for n in names):
        return "curvine_fuse"
    if names & CURVINE_MASTER_NAMES:
        return "curvine_master"
    if names & CURVINE_WORKER_NAMES:
        return "curvine_worker"
    return None


def _all_have_server(by_name: Mapping[str, Sequence[Sample]], names: Iterable[str]) -> bool:
    samples = [s for n in names for s in by_name[n]]
    return bool(samples) and all("server" in s.labels for s in samples)


def detect_role(by_name: Mapping[str, Sequence[Sample]]) -> Role | None:
    kind = detect_kind(by_name)
    return None if kind is None else KIND_ROLES[kind]


def seen_summary(names: Iterable[str], lines: int, limit: int = 6) -> str:
    """`37 samples; families: a, b, c, ... (+4 more)`: what a payload held, for a warning."""
    families = sorted({_family(n) for n in names})
    shown = ", ".join(families[:limit])
    more = f" (+{len(families) - limit} more)" if len(families) > limit else ""
    return f"{lines} samples; families: {shown or '(none)'}{more}"


def _family(name: str) -> str:
    for suffix in ("_bucket", "_count", "_sum", "_created"):
        if name.endswith(suffix):
            return name[: -len(suffix)]
    return name
