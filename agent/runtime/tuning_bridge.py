"""What the tuner and the KV-event subsystem need from the agent, over the agent's own state.

The same functions serve the production runtime (agent/runtime/assembly/) and the demo:

- `StoreWindowSource(store)`: the tuner's `tuners.live.WindowSource` over the `WindowStore`;
  windows are exactly [since, until] in the store's clock, whatever time the caller polls.
- `drift_signals(store, kv_manager, window_s)`: the drift detector's workload signals, all from
  one `store.window(window_s)` (given a `RobustFleet`, no single pod can steer them).
- `pod_counters(window)` / `feed_kv_counters(store, kv_manager, ...)`: per scrape, the scraped
  vLLM token counters the KV-event overlap and miss estimates need (`PodCounters`).
- `kv_endpoints_from_pods(pods, default_model)`: KV-event endpoints from discovered pods.
- `restrict_space(space, tunable, fixed)`: the search space limited to what the actuator can
  change; every other knob stays at the value the cluster runs.
- `StudyLastGood(storage, study)`: the actuator's `on_mark_good` / `load_last_good` hooks, keeping
  the last good record in the optuna study storage.

Everything except `StudyLastGood` is pure or reads only the store and the KV manager.
"""
from __future__ import annotations

import dataclasses
import datetime
import math
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import optuna
import polars as pl

from agent.collect.store import WindowStore
from agent.collect.tiers import cumulative_hit_ratios, derive_tiers, prompt_lookups
from agent.collect.window import bucket_increases, bucket_shares, select, signal_rate, signal_values
from agent.kvevents import EndpointSpec, KvEventManager, PodCounters, workload_overlap
from agent.kvevents.fleet_overlap import FleetOverlap
from agent.kvevents.settings import SettingsError as KvSettingsError
from agent.kvevents.settings import endpoint_from_annotations
from agent.settings import DriftSection
from contracts.knobs import Knobs
from tuners.objective import TtftObservations
from tuners.space import WATERMARKS_PARAM, SearchSpace
from tuners.space.modes import follow_deployment

LONG_PROMPT_TOKENS = DriftSection.model_fields["long_prompt_tokens"].default  # the schema's (tuner.drift)
# The unified signals (agent/collect/mapping.py) behind PodCounters' three fields:
# vllm:prompt_tokens_total, vllm:prompt_tokens_by_source_total{source="local_compute"},
# vllm:external_prefix_cache_hits_total.
COUNTER_SIGNALS = {"prompt_tokens": "prompt_tokens", "prompt_computed_tokens": "local_compute_tokens",
                   "connector_hit_tokens": "external_hit_tokens"}
TIER_ORDER = ("l2", "cpu", "gpu")  # the deepest tier's cumulative ratio covers every tier above


# -- the live evaluator's window source ------------------------------------------------------
class StoreWindowSource:
    """`tuners.live.WindowSource` over the agent's store (fleet-wide, all models)."""

    def __init__(self, store: WindowStore) -> None:
        self.store = store

    def _window(self, since: float, until: float) -> pl.DataFrame:
        # exactly [since, until]: not back into the configuration before a trial's rollout (a
        # sharded leader's FleetStore reads every shard's window over the same span)
        return self.store.window_between(since, until)

    def ttft_observations(self, since: float, until: float) -> TtftObservations | None:
        return ttft_observations(self._window(since, until))

    def cumulative_hit_ratio(self, since: float, until: float) -> float | None:
        return deepest_cumulative_ratio(self._window(since, until))


def ttft_observations(window: pl.DataFrame) -> TtftObservations | None:
    """Per-bucket TTFT counts of a window aggregate (None when nothing was observed)."""
    cumulative = bucket_increases(window, "ttft_seconds")
    if not cumulative or cumulative[-1][1] <= 0:
        return None
    per_bucket, prev = [], 0.0
    for le, c in cumulative:
        per_bucket.append((le, max(c - prev, 0.0)))
        prev = max(prev, c)
    return TtftObservations(buckets=tuple(per_bucket))


def deepest_cumulative_ratio(window: pl.DataFrame) -> float | None:
    """Share of prompt tokens served by any cache tier over a window aggregate, or None."""
    values, sources = signal_values(window)
    ratios = cumulative_hit_ratios(derive_tiers(values, sources), prompt_lookups(values))
    return next((ratios[t] for t in TIER_ORDER if ratios.get(t) is not None), None)


# -- GPU capacity and load from vLLM ----------------------------------------------------------
def gpu_observations(window: pl.DataFrame) -> dict[str, float]:
    """Per-pod GPU KV capacity in tokens (median over pods of `cache_config_info` blocks x block
    size), mean waiting requests per pod and fleet preemptions/s; keys without data are absent."""
    rows = window.filter(pl.col("le").is_null() & pl.col("signal").is_in(
        ["gpu_blocks", "gpu_block_size", "requests_waiting"]))
    per_pod: dict[str, dict[str, float]] = {}
    for pod, signal, last in rows.select("pod", "signal", "last").iter_rows():
        if last is not None and math.isfinite(last):
            per_pod.setdefault(pod, {})[signal] = last
    out: dict[str, float] = {}
    capacities = sorted(v["gpu_blocks"] * v["gpu_block_size"] for v in per_pod.values()
                        if v.get("gpu_blocks", 0) > 0 and v.get("gpu_block_size", 0) > 0)
    if capacities:
        out["gpu_tokens"] = capacities[len(capacities) // 2]
    waiting = [v["requests_waiting"] for v in per_pod.values() if "requests_waiting" in v]
    if waiting:
        out["requests_waiting"] = sum(waiting) / len(waiting)
    rate = signal_rate(window, "preemptions")
    if rate is not None:
        out["preemption_rate"] = rate
    return out


# -- drift signals ---------------------------------------------------------------------------
def drift_signals(store: WindowStore, kv_manager: KvEventManager | FleetOverlap | None, window_s: float | None, *,
                  long_prompt_tokens: int = LONG_PROMPT_TOKENS) -> dict[str, float]:
    """The drift detector's inputs over the last `window_s`; signals without data are absent.

    arrival_rate (req/s), prompt_tokens_mean, long_prompt_fraction (share of requests whose
    prompt-length bucket starts at `long_prompt_tokens` or above), hit_ratio (cumulative, all
    tiers; configuration-dependent) and reuse_ratio (the workload's own overlap from KV events:
    the KV manager's, or for a sharded agent the `FleetOverlap` merged from every shard).
    """
    out: dict[str, float] = {}
    window = store.window(window_s)  # one window for every signal: a RobustFleet's is robust
    req = signal_rate(window, "requests")
    tok = signal_rate(window, "prompt_tokens")
    if req is not None and req > 0:
        out["arrival_rate"] = req
        if tok is not None:
            out["prompt_tokens_mean"] = tok / req
    mix = bucket_shares(bucket_increases(window, "prompt_length_tokens"))
    if mix:
        out["long_prompt_fraction"] = sum(share for lo, _hi, share in mix if lo >= long_prompt_tokens)
    hit = deepest_cumulative_ratio(window)
    if hit is not None and math.isfinite(hit):
        out["hit_ratio"] = hit
    overlap = workload_overlap(kv_manager, window_s=window_s)
    if overlap is not None and math.isfinite(overlap):
        out["reuse_ratio"] = overlap
    return out


# -- the KV-event counter feed ---------------------------------------------------------------
def pod_counters(window: pl.DataFrame) -> dict[tuple[str, str], PodCounters]:
    """(pod, model) -> the latest scraped cumulative token counters in a window aggregate.
    Pods without `vllm:prompt_tokens_total` are left out (nothing to divide by)."""
    rows = window.filter(pl.col("le").is_null() & pl.col("signal").is_in(list(COUNTER_SIGNALS)))
    found: dict[tuple[str, str], dict[str, float]] = {}
    for pod, model, signal, last in rows.select("pod", "model", "signal", "last").iter_rows():
        if last is None or not math.isfinite(last):
            continue
        fields = found.setdefault((pod, model or ""), {})
        name = COUNTER_SIGNALS[signal]
        fields[name] = fields.get(name, 0.0) + last
    return {key: PodCounters(**f) for key, f in sorted(found.items()) if "prompt_tokens" in f}


def feed_kv_counters(store: WindowStore, kv_manager: KvEventManager, *, window_s: float,
                     ts: float | None = None) -> int:
    """Feed every pod scraped within `window_s` to the KV manager; returns how many were fed."""
    counters = pod_counters(select(store.window(window_s), None, None))
    for (pod, model), c in counters.items():
        kv_manager.observe_counters(pod, model, c, ts)
    return len(counters)


# -- KV-event endpoints from discovery --------------------------------------------------------
def kv_endpoints_from_pods(pods: Iterable[Mapping[str, Any]], default_model: str | None = None
                           ) -> tuple[list[EndpointSpec], list[str]]:
    """Running pods with `tierpilot.io/kv-events-port` -> endpoints; invalid annotations are
    reported (one message per pod) and skipped, never fatal."""
    specs: list[EndpointSpec] = []
    errors: list[str] = []
    for pod in pods:
        meta = pod.get("metadata") or {}
        status = pod.get("status") or {}
        ip = status.get("podIP")
        if meta.get("deletionTimestamp") or status.get("phase") != "Running" or not ip:
            continue
        try:
            spec = endpoint_from_annotations(meta.get("name", ""), ip, meta.get("annotations") or {},
                                             default_model)
        except KvSettingsError as exc:
            errors.append(str(exc))
            continue
        if spec is not None:
            specs.append(spec)
    return sorted(specs, key=lambda s: s.pod), errors


# -- the search space the actuator can reach --------------------------------------------------
def _dimension_knobs(d: Any) -> tuple[str, ...]:
    if d.name == WATERMARKS_PARAM:
        return ("l2_high_watermark", "l2_low_watermark")
    return (d.name, *getattr(d, "couples", ()))


def restrict_space(space: SearchSpace, tunable: Iterable[str], fixed: Knobs, *,
                   accepted: Mapping[str, tuple[Any, ...]] | None = None,
                   coupled: Mapping[str, str] | None = None) -> SearchSpace:
    """Keep the dimensions whose knobs are all in `tunable`; every other knob takes its value
    from `fixed` (what the cluster runs), so a candidate never asks for an unowned change. With the
    actuator's `accepted` values and `coupled` knobs, the space follows the deployment mode
    (`tuners.space.modes.follow_deployment`): only values the targets can express, coupled knobs as one
    dimension."""
    space = dataclasses.replace(space, fixed=fixed)
    if accepted or coupled:
        space = follow_deployment(space, accepted or {}, coupled or {})
    owned = set(tunable)
    dims = tuple(d for d in space.dimensions if set(_dimension_knobs(d)) <= owned)
    return dataclasses.replace(space, dimensions=dims)


# -- last good configuration in the study storage --------------------------------------------
class StudyLastGood:
    """The Kubernetes actuator's `on_mark_good` / `load_last_good` hooks over optuna storage:
    the record lives in the user attributes of the study `<study>.last-good`, so it survives
    the loss of the annotations (an operator re-created the object) and agent restarts."""

    ATTR = "last_good"

    def __init__(self, storage: optuna.storages.BaseStorage, study: str,
                 now: Callable[[], datetime.datetime] = lambda: datetime.datetime.now(datetime.UTC)) -> None:
        self.storage = storage
        self.study_name = f"{study}.last-good"
        self._now = now

    def _study(self) -> optuna.Study:
        return optuna.create_study(study_name=self.study_name, storage=self.storage, load_if_exists=True)

    def on_mark_good(self, knobs: Knobs, records: Mapping[str, str]) -> None:
        self._study().set_user_attr(self.ATTR, {
            "knobs": knobs.to_dict(), "records": dict(records),
            "at": self._now().astimezone(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")})

    def load_last_good(self) -> Knobs | None:
        try:
            study = optuna.load_study(study_name=self.study_name, storage=self.storage)
        except KeyError:
            return None
        data = study.user_attrs.get(self.ATTR)
        return Knobs.from_mapping(data["knobs"], source=f"study {self.study_name}") if data else None

    def records(self) -> dict[str, str]:
        """The per-target annotation records of the last mark_good (empty when none)."""
        try:
            study = optuna.load_study(study_name=self.study_name, storage=self.storage)
        except KeyError:
            return {}
        return dict((study.user_attrs.get(self.ATTR) or {}).get("records") or {})


__all__ = ["StoreWindowSource", "StudyLastGood", "deepest_cumulative_ratio", "drift_signals", "feed_kv_counters",
           "kv_endpoints_from_pods", "pod_counters", "restrict_space", "ttft_observations"]
