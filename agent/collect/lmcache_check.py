"""The `lmcache_series_missing` check: a vLLM pod that runs LMCache but shows no LMCache series.

LMCache in-process (`LMCacheConnectorV1`) writes its `lmcache:*` series with prometheus_client
in multiprocess mode; they reach vLLM's `/metrics` only when vLLM and LMCache share
`PROMETHEUS_MULTIPROC_DIR` (LMCache sets `/tmp/lmcache_prometheus` when it is unset; LMCache
docs, `vllm_endpoint.rst`). Without them the L1 eviction and usage signals are silently absent.
The fix is in docs/runbooks.md. Pure: signals in, warnings out.

`mode` is `tiers.lmcache`: `in-process` expects the series on every vLLM pod; `auto` expects them
on a pod whose KV connector saw tokens, unless the pod runs vLLM's native offload
(`vllm:kv_offload_*`), an LMCache MP server (whose `lmcache_mp_*` series are its own), or a
connector that names its tiers (`prompt_tokens_cached_by_source` `host`/`disk` > 0: LMCache never
does); `mp` and `none` never expect them.
"""
from __future__ import annotations

from collections.abc import Iterable, Sequence

from contracts.tier_model import Signal, Target

REASON = "lmcache_series_missing"
NATIVE_OFFLOAD = frozenset({"offload_load_bytes", "offload_store_bytes"})
TIER_NAMING = frozenset({"cached_host_tokens", "cached_disk_tokens"})
DETAIL = ("LMCache is configured but no lmcache:* series reach this pod's /metrics: vLLM and LMCache must "
          "share PROMETHEUS_MULTIPROC_DIR (see docs/runbooks.md, lmcache_series_missing)")


def missing_lmcache(outcomes: Sequence[tuple[Target, Iterable[Signal]]], mode: str) -> set[str]:
    """URLs of the vLLM targets to mark with `lmcache_series_missing`."""
    if mode in ("mp", "none"):
        return set()
    sources: dict[str, set[str]] = {}
    names: dict[str, set[str]] = {}
    connector: dict[str, float] = {}
    tiered: dict[str, float] = {}  # host/disk cached tokens: a connector that names its tiers
    for target, signals in outcomes:
        for s in signals:
            sources.setdefault(target.pod, set()).add(s.source)
            names.setdefault(target.pod, set()).add(s.name)
            if s.name == "connector_lookup_tokens" and target.role == "vllm":
                connector[target.pod] = connector.get(target.pod, 0.0) + s.value
            if s.name in TIER_NAMING and target.role == "vllm":
                tiered[target.pod] = tiered.get(target.pod, 0.0) + s.value
    out: set[str] = set()
    for target, _ in outcomes:
        if target.role != "vllm":
            continue
        pod = target.pod
        pod_sources, pod_names = sources.get(pod, set()), names.get(pod, set())
        if not pod_sources or pod_sources & {"lmcache_inprocess", "lmcache_mp"}:
            continue  # nothing scraped (the target is down) or LMCache series present
        if mode == "auto" and (connector.get(pod, 0.0) <= 0 or pod_names & NATIVE_OFFLOAD
                               or tiered.get(pod, 0.0) > 0):
            continue
        out.add(target.url)
    return out
