"""The tuner of the real-engine demo: `tierpilot run` itself, with the settings file
`emulator/demo/engine_tuner.yaml` (what it changes, and why, is written in it) and the deployment
the demo describes in Kubernetes.

What the deployment starts with (`ENGINE_KNOBS`) and what the tuner may change:
- each engine runs vLLM's native tiering: a CPU tier of 16 MiB (`cpu_bytes_to_use`; about 2,000
  tokens of tiny-llama's KV in float32, far below the stream's working set), offload chunks of 256
  tokens (`block_size`), LRU eviction; an fs tier on the fleet's shared directory, kept under a
  64 MiB quota by the emulated Curvine master (LRU, watermarks 0.8 / 0.6; `l2_quota_mib`);
- the tuner owns the engines' `--kv-transfer-config` (target kind `vllm-tiering-args`): the CPU
  tier's size and chunk, each change a rollout of the engine Deployments; the router
  (round-robin) and the Curvine quota are the deployment's.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from agent.settings import AgentSettings, load_settings
from contracts.knobs import DEFAULT_KNOBS, Knobs

ENGINE_KNOBS = DEFAULT_KNOBS.replace(cpu_gib=1 / 64, chunk_tokens=256, cpu_eviction="lru", l2_eviction="lru",
                                     l2_high_watermark=0.8, l2_low_watermark=0.6, router="roundrobin")
ENGINE_TUNER_FILE = Path(__file__).with_name("engine_tuner.yaml")
TIER_KNOBS = ("cpu_gib", "chunk_tokens", "cpu_eviction")  # what the demo's targets own


def engine_settings_data() -> dict[str, Any]:
    """The demo settings file as a mapping (what agent_config starts from)."""
    return yaml.safe_load(ENGINE_TUNER_FILE.read_text()) or {}


def engine_settings(pods: int, seed: int) -> AgentSettings:
    """The settings file as the agent loads it, with the fleet's size and the run's seed."""
    data = engine_settings_data()
    tuner = data.setdefault("tuner", {})
    tuner.setdefault("limits", {})["pods"] = pods
    tuner["seed"] = seed
    tuner.setdefault("warm_start", {})["seed"] = seed
    return load_settings(env={}, **data)


def l2_quota_mib() -> int:
    """Each fleet's shared fs tier, the emulated Curvine master's quota: the L2 the settings file
    gives the tuner (`tuner.limits.l2_pool_gib`), in MiB."""
    return round(engine_settings_data()["tuner"]["limits"]["l2_pool_gib"] * 1024)


def knobs_text(knobs: Knobs) -> str:
    """The tier knobs as the engines run them (`cpu tier 48 MiB, chunk 256, lru`)."""
    return f"CPU tier {knobs.cpu_gib * 1024:g} MiB, chunk {knobs.chunk_tokens} tokens, {knobs.cpu_eviction}"


__all__ = ["ENGINE_KNOBS", "ENGINE_TUNER_FILE", "TIER_KNOBS", "engine_settings", "engine_settings_data", "knobs_text",
           "l2_quota_mib"]
