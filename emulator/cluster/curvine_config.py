"""The emulated Curvine master's quota settings read from Curvine's cluster TOML (pure).

Curvine reads its quota eviction from the `[master]` section of its cluster config
(`curvine-cluster.toml`, kept in a ConfigMap in the seed deployment). The emulated master reads the
same keys, so the agent's `curvine-configmap` actuation target (agent/k8s/mappings.yaml:
`l2_eviction` -> `master.quota_eviction_policy`, the watermarks -> `quota_eviction_high_rate` /
`quota_eviction_low_rate`) tunes it exactly as it tunes Curvine. The quota's size is not a master
key (Curvine's capacity is its workers' storage): the caller gives it.

    quota_from_toml(text, capacity_bytes=2 << 30)   # QuotaConfig(policy="lfu", ...)
"""
from __future__ import annotations

import tomllib

from emulator.cluster.curvine_quota import QuotaConfig, QuotaError

# [master] key -> QuotaConfig field
MASTER_KEYS = {
    "quota_eviction_policy": "policy",
    "quota_eviction_high_rate": "high_watermark",
    "quota_eviction_low_rate": "low_watermark",
    "quota_eviction_scan_page": "scan_page",
    "quota_eviction_dry_run": "dry_run",
}


def quota_from_toml(text: str, *, capacity_bytes: int) -> QuotaConfig:
    """The quota configuration a Curvine cluster TOML gives (absent keys: Curvine's defaults).
    QuotaError (one line) for a file that is not TOML or a value Curvine would not run."""
    try:
        master = tomllib.loads(text).get("master", {})
    except tomllib.TOMLDecodeError as exc:
        raise QuotaError(f"Curvine cluster config is not valid TOML: {exc}") from None
    if not isinstance(master, dict):
        raise QuotaError("Curvine cluster config: [master] must be a table")
    values = {field: master[key] for key, field in MASTER_KEYS.items() if key in master}
    return QuotaConfig(capacity_bytes=capacity_bytes, **values)
