"""The demo's deployment: the tuner settings it runs (`emulator/demo/tuner.yaml`: the chart's
defaults plus the demo's named overrides), what the emulated fleet starts on, and the restart rule
of its actuator. The tuner itself is the agent's (`agent.runtime.tuning.build_tuning`).

    dep = demo_deployment(pods=4, seed=7)                       # the file, for a 4-pod fleet
    dep = demo_deployment(4, 7, tuner={"memory_ms_per_gib": 0})  # plus a scenario's own overrides
"""
from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml

from agent.runtime.tuning.schema import deployment_limits, objective_spec
from agent.settings import AgentSettings, load_settings
from contracts.knobs import DEFAULT_KNOBS, Knobs
from emulator.cluster.local_actuator import POD_RESTART_KNOBS
from tuners.objective import ObjectiveSpec
from tuners.space import DeploymentLimits, SearchSpace

TUNER_FILE = Path(__file__).with_name("tuner.yaml")
MODEL_NAME = "meta-llama/Llama-3.1-8B-Instruct"  # what the emulated pods serve
# the emulated vLLM pods' TTFT histogram buckets (vLLM's custom_histogram_buckets): 25 ms up to 1.5 s
DEMO_TTFT_BUCKETS = tuple(round(0.025 * i, 3) for i in range(1, 61)) + (1.75, 2.0, 2.5, 3.0, 4.0, 5.0, 7.5,
                                                                        10.0, 20.0, 40.0, 80.0)


def restarts_pods(before: Knobs, after: Knobs) -> bool:
    """Whether going from `before` to `after` is a rolling restart of the emulated vLLM pods."""
    return bool(set(before.diff(after)) & POD_RESTART_KNOBS)


def _merge(base: dict[str, Any], over: Mapping[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for k, v in over.items():
        out[k] = _merge(out.get(k) or {}, v) if isinstance(v, Mapping) else v
    return out


def demo_file() -> dict[str, Any]:
    """The overrides `tuner.yaml` makes (a mapping, as written)."""
    return yaml.safe_load(TUNER_FILE.read_text()) or {}


def demo_settings(pods: int, seed: int, *, tuner: Mapping[str, Any] | None = None) -> AgentSettings:
    """`tuner.yaml` with the run's own values: the fleet's pods, the seed, and `tuner` (a
    scenario's overrides of the `tuner:` section)."""
    run = {"limits": {"pods": pods}, "seed": seed, "warm_start": {"seed": seed}}
    data = demo_file()
    data["tuner"] = _merge(_merge(data.get("tuner") or {}, tuner or {}), run)
    return load_settings(env={}, **data)


@dataclasses.dataclass(frozen=True)
class Deployment:
    """The settings the tuner runs, the configuration the emulated fleet starts on (held, for
    the reference run), and what the targets offer beyond the settings (`offer`: DeploymentLimits
    fields such as `watermarks` or `routers`)."""

    settings: AgentSettings
    start: Knobs = DEFAULT_KNOBS
    offer: Mapping[str, Any] = dataclasses.field(default_factory=dict)

    @property
    def limits(self) -> DeploymentLimits:
        return deployment_limits(self.settings, **self.offer)

    @property
    def objective(self) -> ObjectiveSpec:
        return objective_spec(self.settings)

    def space(self) -> SearchSpace:
        return SearchSpace.from_limits(self.limits, tune_cpu_eviction=self.settings.tuner.tune_cpu_eviction)


def demo_deployment(pods: int, seed: int = 0, *, tuner: Mapping[str, Any] | None = None, start: Knobs = DEFAULT_KNOBS,
                    offer: Mapping[str, Any] | None = None) -> Deployment:
    return Deployment(demo_settings(pods, seed, tuner=tuner), start, dict(offer or {}))


def overrides_lines() -> list[str]:
    """The demo's overrides of the chart's defaults, one `key: value` per line (for the report)."""
    out: list[str] = []

    def walk(prefix: str, node: Any) -> None:
        if isinstance(node, Mapping):
            for k, v in node.items():
                walk(f"{prefix}.{k}" if prefix else str(k), v)
        else:
            out.append(f"{prefix}: {node}")

    walk("", demo_file())
    return out


__all__ = ["DEMO_TTFT_BUCKETS", "MODEL_NAME", "TUNER_FILE", "Deployment", "demo_deployment", "demo_file", "demo_settings", "overrides_lines",
           "restarts_pods"]
