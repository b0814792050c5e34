"""Typed, frozen agent settings: a YAML file, overridden by environment variables.

Environment overrides use the prefix `TIERPILOT_` and `__` between levels, e.g.
`TIERPILOT_SCRAPE__TIMEOUT_S=3` or `TIERPILOT_SERVER__PORT=9500`. Settings are validated once at
start; a bad value or an unknown key is one `SettingsError` naming the file and the key.
"""
from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator
from pydantic_settings import BaseSettings, PydanticBaseSettingsSource, SettingsConfigDict

from agent.kvevents.settings import KvEventsSettings
from contracts.redact import redact_url
from contracts.tier_model import ROLES, Role
from exporters.settings import OtelSettings

ENV_PREFIX = "TIERPILOT_"


class SettingsError(ValueError):
    """Invalid configuration; the message names the source and the key."""


class _Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class ScrapeSettings(_Frozen):
    interval_s: float = Field(15.0, gt=0, le=3600.0, description="seconds between scrape cycles")
    timeout_s: float = Field(5.0, gt=0, le=300.0, description="total time allowed per target (connect + body)")
    max_body_bytes: int = Field(16 * 1024 * 1024, gt=0, le=256 * 1024 * 1024,
                                description="decompressed body cap per target (body_size_limit)")
    sample_limit: int = Field(50_000, gt=0, le=1_000_000,
                              description="sample lines per scrape; more marks the target down (sample_limit)")
    label_limit: int = Field(64, gt=0, le=1024, description="labels per series; more: target down (label_limit)")
    label_name_length_limit: int = Field(256, gt=0, le=65536,
                                         description="characters per label name; longer: down (label_length)")
    label_value_length_limit: int = Field(4096, gt=0, le=1024 * 1024,
                                          description="characters per label value; longer: down (label_length)")
    max_models_per_target: int = Field(
        16, ge=0, le=100_000, description="distinct model labels kept per target (0: no bound); the most "
        "active are kept, the others dropped and counted (model_budget)")
    max_series_per_target: int = Field(
        1000, ge=0, le=1_000_000, description="normalised series kept per target (0: no bound); whole signals "
        "of the least active models dropped beyond it (series_budget)")
    concurrency: int = Field(256, gt=0, le=4096, description="simultaneous connections")
    backoff_base_s: float = Field(5.0, ge=0, le=86_400.0, description="first back-off after a failure; doubles each time")
    backoff_max_s: float = Field(300.0, ge=0, le=86_400.0, description="back-off ceiling")
    blind_after_cycles: int = Field(3, ge=1, le=10_000, description="cycles in a row with no target up before "
                                    "/healthz reports the agent degraded (blind)")


class StoreSettings(_Frozen):
    retention_s: float = Field(900.0, gt=0, le=86_400.0, description="how long normalised samples are kept")
    window_s: float = Field(300.0, gt=0, le=86_400.0, description="window for ratios, rates and quantiles")


class ServerSettings(_Frozen):
    host: str = Field("0.0.0.0", description="address /metrics listens on")
    port: int = Field(9400, ge=0, le=65535, description="port of /metrics (0 picks a free one)")
    snapshot: bool = Field(False, description="serve /snapshot (all data as JSON) to loopback clients only")


class StaticTarget(_Frozen):
    url: str
    role: Literal[Role, "auto"] = Field("auto", description="omitted or auto: detected from the payload")
    pod: str
    namespace: str = ""
    node: str = ""

    @field_validator("url")
    @classmethod
    def _url(cls, v: str) -> str:
        if not v.startswith(("http://", "https://")):
            raise ValueError(f"url must start with http:// or https://, got {redact_url(v)!r}")
        return v


DEFAULT_PORTS: dict[str, tuple[int, str]] = {
    "vllm": (8000, "/metrics"),
    "lmcache": (9090, "/metrics"),
    "curvine-master": (9001, "/metrics"),
    "curvine-worker": (9002, "/metrics"),
    "curvine-fuse": (9003, "/metrics"),
    "router": (8001, "/metrics"),
}


class RoleDiscovery(_Frozen):
    selector: str = Field(description="Kubernetes label selector, e.g. app=vllm")
    port: int | None = Field(None, ge=1, le=65535, description="default port when the pod has no annotation")
    path: str | None = None
    scheme: Literal["http", "https"] = "http"


class KubernetesSettings(_Frozen):
    enabled: bool = False
    namespace: str | None = Field(None, description="namespace to watch; unset = all namespaces")
    roles: dict[Role, RoleDiscovery] = Field(default_factory=dict)
    in_cluster: bool | None = Field(None, description="None: in-cluster config if available, else kubeconfig")
    watch_timeout_s: int = Field(300, gt=0, le=3600)


class TargetSettings(_Frozen):
    static: tuple[StaticTarget, ...] = ()
    file: Path | None = Field(None, description="YAML file with a `targets:` list, re-read when it changes")
    kubernetes: KubernetesSettings = KubernetesSettings()


class BasicAuth(_Frozen):
    username: str
    password_file: Path = Field(description="file holding the password (re-read each cycle)")


class TlsSettings(_Frozen):
    ca_file: Path | None = Field(None, description="CA bundle that signed the server certificate")
    cert_file: Path | None = Field(None, description="client certificate (mutual TLS)")
    key_file: Path | None = Field(None, description="client key (mutual TLS)")
    insecure_skip_verify: bool = Field(False, description="do not verify the server certificate")

    @model_validator(mode="after")
    def _pair(self) -> TlsSettings:
        if (self.cert_file is None) != (self.key_file is None):
            raise ValueError("cert_file and key_file go together")
        return self


class PrometheusSourceSettings(_Frozen):
    """`prometheus:` read the fleet's series from a Prometheus-compatible query API
    (agent/collect/prom/source.py) instead of scraping every pod (`source: prometheus`)."""

    url: str | None = Field(None, description="base URL of the query API, e.g. http://prometheus:9090 "
                                              "(Thanos, Mimir: the prefix before /api/v1)")
    bearer_token_file: Path | None = Field(None, description="file holding a bearer token (re-read each cycle)")
    basic_auth: BasicAuth | None = None
    tls: TlsSettings = TlsSettings()
    timeout_s: float = Field(10.0, gt=0, description="total time allowed per query")
    concurrency: int = Field(16, gt=0, description="queries in flight at once")
    roles: dict[Role, str] = Field(
        default_factory=dict,
        description='per role, a series selector without braces, e.g. vllm: \'job="vllm"\'; '
                    "empty: every series, role from the `job` label or the metric name")
    pod_label: str = Field("pod", description="label naming the pod (else `instance` is used)")
    namespace_label: str = Field("namespace", description="label naming the namespace")
    backfill: bool = Field(True, description="at start, fill the window with one range query per series")
    aggregate: Literal["server", "agent"] = Field(
        "server", description="server: Prometheus aggregates every mapping rule per pod and model "
                              "(prom/plan.py; small answers, the large-fleet mode); agent: read the raw "
                              "series and normalise them here, as a direct scrape does")

    @field_validator("url")
    @classmethod
    def _url(cls, v: str | None) -> str | None:
        """The prefix before /api/v1: `http://host:9090/`, `.../api/v1` and `.../api/v1/` all name
        the same API."""
        if v is not None and not v.startswith(("http://", "https://")):
            raise ValueError(f"url must start with http:// or https://, got {redact_url(v)!r}")
        if not v:
            return v
        v = v.rstrip("/")
        return v.removesuffix("/api/v1") if v.endswith("/api/v1") else v

    @model_validator(mode="after")
    def _one_auth(self) -> PrometheusSourceSettings:
        if self.bearer_token_file is not None and self.basic_auth is not None:
            raise ValueError("give bearer_token_file or basic_auth, not both")
        return self


class ShardSettings(_Frozen):
    """`shard:` this replica scrapes (and follows the KV events of) only the targets whose
    rendezvous hash falls in its shard (agent/collect/shard.py)."""

    count: int = Field(1, ge=1, description="replicas sharing the direct scrape")
    index: int | None = Field(None, ge=0, description="this replica's shard; unset: the ordinal at the end "
                                                      "of $POD_NAME (StatefulSet), else 0")
    peers: tuple[str, ...] = Field((), description="base URLs of the other replicas' /window and /kv/sketch "
                                                  "(e.g. http://tierpilot-1.tierpilot:9400): the leader's fleet view")
    peer_timeout_s: float = Field(5.0, gt=0, description="time allowed per peer read")
    token_file: Path | None = Field(None, description="file holding the bearer token the replicas share (a "
                                    "mounted Secret): required on /window and /kv/sketch, sent to the peers; "
                                    "re-read when the file changes")
    token_grace_s: float = Field(300.0, ge=0, description="after a rotation, how long the previous token is "
                                 "still accepted (replicas see the new Secret at different times)")
    allow_unauthenticated: bool = Field(False, description="with count > 1 and no token_file, serve /window and "
                                        "/kv/sketch to anyone who reaches the port (e.g. behind a NetworkPolicy)")

    @model_validator(mode="after")
    def _in_range(self) -> ShardSettings:
        if self.index is not None and self.index >= self.count:
            raise ValueError(f"index {self.index} must be below count {self.count}")
        return self

    @model_validator(mode="after")
    def _peer_endpoints_guarded(self) -> ShardSettings:
        if self.count > 1 and self.token_file is None and not self.allow_unauthenticated:
            raise ValueError("count > 1 serves every pod's window to the peers on /window and /kv/sketch: "
                             "set token_file (a Secret mounted in every replica), or "
                             "allow_unauthenticated: true if the network already keeps others out")
        return self


class TierSettings(_Frozen):
    kv_bytes_per_token: float | None = Field(
        131072.0, gt=0, le=64 * 2**20, description="2 x layers x KV heads x head dim x dtype bytes (Llama-3.1-8B bf16)")
    cpu_capacity_gib: float | None = Field(None, gt=0, le=65536.0, description="LMCache CPU buffer, for in-process usage")
    lmcache: Literal["auto", "in-process", "mp", "none"] = Field(
        "auto", description="how LMCache runs, for the lmcache_series_missing check: auto = a vLLM pod whose KV "
                            "connector sees traffic, with no LMCache series and no vLLM native offload")


# -- the whole agent: KV events, tuning, actuation (agent/runtime/assembly/) ------------------------
class KvEventsSection(KvEventsSettings):
    """`kv_events:` the KV-event subscriber (agent/kvevents). Endpoints come from `endpoints` and,
    with `discovery`, from `tierpilot.io/kv-events-*` annotations on the discovered vLLM pods."""

    enabled: bool = Field(False, description="subscribe to the vLLM pods' KV-event streams")
    discovery: bool = Field(True, description="read endpoints from pod annotations (needs targets.kubernetes)")
    discovery_interval_s: float = Field(30.0, gt=0, le=3600.0, description="how often discovered pods are re-read")
    default_model: str | None = Field(None, description="model of a pod without tierpilot.io/model")

    def manager_settings(self) -> KvEventsSettings:
        """The subscriber's own settings (without the agent-side keys)."""
        return KvEventsSettings(**self.model_dump(exclude={"enabled", "discovery", "discovery_interval_s",
                                                           "default_model"}))


class LimitsSection(_Frozen):
    """`tuner.limits:` what the deployment allows (tuners.space.DeploymentLimits)."""

    pods: int = Field(4, ge=1, le=10_000, description="serving pods (memory cost = cpu_gib x pods)")
    node_memory_headroom_gib: float = Field(32.0, ge=0, le=65536.0, description="host memory free per pod: caps cpu_gib")
    cpu_budget_gib: float | None = Field(None, ge=0, le=1e7, description="optional fleet-wide cap on cpu_gib x pods")
    cpu_gib_step: float = Field(1.0, gt=0, le=1024.0)
    l2_pool_gib: float = Field(1024.0, gt=0, le=1e8, description="size of the shared L2 pool (fixed, not a knob)")
    l2_backend: Literal["curvine", "lmcache", "twin", "none"] = Field(
        "curvine", description="decides L2 policies; none: no shared L2 (no L2 knob is tuned)")
    l2_threshold_max: int = Field(4096, ge=0, le=1 << 20, description="largest L2 read threshold tried (tokens)")


class RegressionSection(_Frozen):
    method: Literal["mannwhitney", "bootstrap"] = "mannwhitney"
    alpha: float = Field(0.05, gt=0, lt=1, description="one-sided significance level")
    min_rel_effect: float = Field(0.05, ge=0, description="the quantile must also rise by this fraction")
    min_samples: int = Field(30, ge=1, le=1_000_000, description="fewer observations on either side: inconclusive")
    n_boot: int = Field(2000, ge=100, le=1_000_000, description="bootstrap rounds (method: bootstrap)")


class GuardrailsSection(_Frozen):
    cooldown_s: float = Field(900.0, ge=0, le=7 * 86_400.0, description="minimum time between two changes")
    max_changes_per_hour: int = Field(4, ge=1, le=3600, description="rolling-hour cap on changes")
    regression: RegressionSection = RegressionSection()


class LiveSection(_Frozen):
    settle_s: float = Field(120.0, ge=0, le=86_400.0, description="wait after a rollout before measuring")
    window_s: float = Field(300.0, gt=0, le=86_400.0, description="evaluation window")
    min_requests: int = Field(30, ge=1, le=10_000_000, description="fewer TTFT observations -> extend the window")
    max_extensions: int = Field(2, ge=0, le=100)


DRIFT_SIGNAL_NAMES = ("reuse_ratio", "prompt_tokens_mean", "long_prompt_fraction", "hit_ratio", "arrival_rate")
DriftSignal = Literal["reuse_ratio", "prompt_tokens_mean", "long_prompt_fraction", "hit_ratio", "arrival_rate"]


class DriftSection(_Frozen):
    enabled: bool = True
    method: Literal["page_hinkley", "cusum"] = "page_hinkley"
    warmup: int = Field(20, ge=3, le=100_000, description="points to learn each signal's level and noise")
    delta: float = Field(0.5, ge=0, description="drift allowance per point, in noise units")
    threshold: float = Field(16.0, gt=0, description="alarm at this cumulative deviation (noise units)")
    signals: tuple[DriftSignal, ...] = Field(("reuse_ratio", "prompt_tokens_mean"), min_length=1,
                                             description="workload signals watched")
    window_s: float = Field(300.0, gt=0, le=86_400.0, description="window the signals are computed over")
    long_prompt_tokens: int = Field(4096, gt=0, le=10_000_000, description="prompts from this length count as long")
    track: float = Field(0.1, ge=0, lt=1, description="the level follows slow trends with this weight per step (0: fixed)")
    refractory: int = Field(18, ge=0, le=100_000, description="steps ignored after an alarm before relearning")
    min_rel_shift: float = Field(0.25, ge=0, le=10, description="an alarm needs the signal to move by this share")
    confirm: int = Field(6, ge=1, le=10_000, description="points whose median must show that move")
    min_rel_sigma: float = Field(0.02, ge=0, le=10, description="noise floor as a share of the signal's level")
    quiet_s: float | None = Field(None, ge=0, le=86_400.0, description=(
        "ignore the signals this long after each of the tuner's own changes (default: "
        "planner.restart_downtime_s x pods + 10 s)"))


class PlannerSection(_Frozen):
    """`tuner.planner:` tuning that pays for itself (tuners/planning/planner.py, tuners/planning/paying.py): each phase,
    a hot router change is priced alone on the twin, then the twin search's restart candidates with
    their rolling-restart cost over `horizon_s`; only a net gain above the margin is applied, live
    changes are judged against the twin's counterfactual for the same window, and the twin's
    prefill speed is calibrated to the live windows. `enabled: false`: the older live search."""

    enabled: bool = Field(True, description="plan on the twin with transition costs (off: live search)")
    horizon_s: float = Field(900.0, gt=0, le=7 * 86_400.0, description=(
        "expected rest of a workload regime when it is not estimated from the run (horizon_from_run: false)"))
    horizon_from_run: bool = Field(True, description=(
        "estimate the regime's rest from the run: time since the last drift and past regime lengths"))
    horizon_floor_s: float = Field(300.0, gt=0, le=7 * 86_400.0, description="shortest horizon estimated from the run")
    horizon_trust_after: int = Field(2, ge=1, le=1000, description=(
        "past regimes after which the run's own estimate stands without the floor (horizon_min_s at least)"))
    horizon_cap_s: float = Field(3600.0, gt=0, le=7 * 86_400.0, description="longest horizon estimated from the run")
    horizon_min_s: float = Field(30.0, gt=0, le=7 * 86_400.0, description=(
        "shortest horizon once the run's estimate stands (after horizon_trust_after regimes)"))
    replan_growth: float = Field(1.25, gt=1, le=100, description=(
        "plan again when the regime's age has grown by this factor since the last plan"))
    plan_warm_s: float = Field(1200.0, ge=0, le=86_400.0, description=(
        "history replayed before recent_s when pricing a move (a capacity change pays at the occupancy it reaches)"))
    margin: float = Field(0.03, ge=0, le=1, description="net relative gain a restart-requiring change needs")
    hot_margin: float = Field(0.03, ge=0, le=1, description=(
        "net relative gain a router change needs (regimes flip, and a marginal switch costs the next one)"))
    tolerance: float = Field(0.005, ge=0, le=1, description="neither p95 nor mean may lose more than this")
    search_k: int = Field(3, ge=0, le=100, description="twin-search candidates priced per phase")
    refill_s: float = Field(600.0, ge=0, le=86_400.0, description=(
        "how long the twin follows a restart's cache refill past recent_s (switching this long before now, "
        "at most half the planning history); what the refill adds is charged to the move (0: the window only)"))
    recent_s: float = Field(150.0, gt=0, le=86_400.0, description="recent workload the twin scores on")
    warm_s: float = Field(300.0, ge=0, le=86_400.0, description="history replayed before it to warm the caches")
    restart_downtime_s: float = Field(30.0, ge=0, le=3600.0, description="seconds a pod is down in a rollout")
    calibrate: bool = Field(True, description="fit the twin's prefill speed to the live windows")
    calibration_step_s: float = Field(30.0, gt=0, le=3600.0, description="window length of each calibration point")


class WarmStartSection(_Frozen):
    """`tuner.warm_start:` tune on the digital twin first; its top candidates go first live."""

    trials: int = Field(24, ge=0, le=10_000, description=(
        "twin trials per phase (0 disables the warm start); bench/twin_search.py: 24 reach the sweep's best"))
    top_k: int = Field(3, ge=0, le=100, description="twin candidates enqueued in the live study")
    workload: Literal["synthetic", "trace"] = Field(
        "synthetic", description="synthetic: the planning workload (rebuilt from the KV events, else fitted to "
                                "the observed signals); trace: replay `trace`")
    trace: Path | None = Field(None, description="Mooncake-format trace (workload: trace)")
    duration_s: float = Field(300.0, gt=0, le=7 * 86_400.0, description="span of the fitted synthetic workload")
    max_requests: int = Field(2000, ge=10, le=10_000_000, description="cap on the replayed requests (twin cost)")
    max_block_refs: int = Field(100_000, ge=100, le=100_000_000,
                                description="cap on the block references replayed in one plan (twin memory and "
                                            "time), whatever prompt length or rate a pod claims")
    profile: str | None = Field(None, description="twin hardware profile (default: the twin's)")
    after_baseline: bool = Field(False, description=(
        "search once the phase's baseline window is measured, on the workload observed until then (with the "
        "planner on it always does); false: at the phase's start, on what the agent has seen so far"))
    seed: int = 0

    @model_validator(mode="after")
    def _trace_given(self) -> WarmStartSection:
        if self.workload == "trace" and self.trace is None:
            raise ValueError("workload 'trace' needs `trace: PATH`")
        return self


class ShadowSection(_Frozen):
    """`tuner.shadow:` what shadow mode (`tuner.mode: shadow`) reads and keeps (agent/runtime/shadow.py)."""

    running_file: Path | None = Field(None, description="knobs YAML of what the fleet runs, kept by your deploy "
                                      "pipeline and re-read at every look: how the shadow sees a change made by "
                                      "anyone (unset: the targets file's fixed_knobs over the defaults)")
    log_file: Path | None = Field(None, description="append every plan, priced move, configuration change and "
                                  "score as one JSON line (the record of a weeks-long shadow run)")
    settle_s: float | None = Field(None, ge=0, le=86_400.0, description="after a change, wait this long before "
                                   "measuring it (default: tuner.live.settle_s)")
    window_s: float | None = Field(None, gt=0, le=86_400.0, description="TTFT window before and after a change "
                                   "(default: tuner.live.window_s; keep settle_s + window_s under store.retention_s)")
    keep: int = Field(500, ge=1, le=100_000, description="priced moves and scores kept in memory (/healthz)")


class FleetBoundsSection(_Frozen):
    """`tuner.fleet_bounds:` what one pod may claim in the windows the tuner plans and judges on
    (agent/runtime/fleet_robust.py): an outlier pod's signals are replaced by the median pod's."""

    max_ratio: float = Field(4.0, gt=1.0, le=1000.0,
                             description="a pod's rate above, or prompt length or mean TTFT outside, this factor of "
                                         "the median pod's makes it an outlier")
    max_hit_gap: float = Field(0.5, gt=0.0, le=1.0, description="a pod's hit ratio this far from the median's: outlier")
    max_pod_rps: float = Field(1000.0, gt=0, description="more requests per second than one pod can serve: outlier")
    max_pod_prompt_tokens_per_s: float = Field(
        2_000_000.0, gt=0, description="more prompt tokens per second than a model's prefill can take: outlier")
    min_pods: int = Field(3, ge=3, le=1000, description="pods with traffic needed for a median to compare with")


class TunerSection(_Frozen):
    """`tuner:` live tuning with optuna (tuners/), through the guardrails and the actuator."""

    enabled: bool = Field(False, description="run the tuning controller (the leader only)")
    mode: Literal["live", "shadow"] = Field(
        "live", description="live: act through the Kubernetes actuator (within `apply`); shadow: no Kubernetes, "
                            "plan as the live tuner would, apply nothing, record and score every plan (tuner.shadow)")
    apply: Literal["none", "hot", "all"] = Field(
        "hot", description="what the tuner changes without a person: hot = the router's knobs only (no engine "
                           "restarts); all = restart-requiring changes too (chunk size, CPU buffer, eviction "
                           "policies: the engines or the L2 master restart, their caches empty); none = nothing. "
                           "A change outside it is a proposal (/proposals, `tierpilot k8s apply-proposal`)")
    proposals_file: Path | None = Field(None, description="also write the proposals (the /proposals body) to this "
                                                          "file, for `tierpilot k8s apply-proposal --file`")
    storage: str = Field("sqlite:///tierpilot.db", description="optuna storage URL (SQLite or PostgreSQL)")
    study: str = Field("tierpilot", min_length=1, description="study name; phases are <study>.phaseNNN")
    sampler: Literal["tpe", "random", "grid"] = "tpe"
    seed: int | None = None
    objective: Literal["ttft_p95", "ttft_p50"] = "ttft_p95"
    memory_ms_per_gib: float = Field(
        2.0, ge=0, description="objective = TTFT + this many ms per GiB of fleet CPU buffer (0: TTFT alone)")
    step_interval_s: float = Field(30.0, gt=0, le=86_400.0, description="seconds between controller steps")
    trials_per_phase: int = Field(20, ge=1, le=100_000)
    min_improvement: float = Field(0.01, ge=0, description="relative gain to replace the last good config")
    max_apply_retries: int = Field(5, ge=1, le=1000)
    tune_cpu_eviction: bool = Field(False, description="also search LMCache's CPU eviction policy")
    limits: LimitsSection = LimitsSection()
    guardrails: GuardrailsSection = GuardrailsSection()
    live: LiveSection = LiveSection()
    drift: DriftSection = DriftSection()
    fleet_bounds: FleetBoundsSection = FleetBoundsSection()
    warm_start: WarmStartSection = WarmStartSection()
    planner: PlannerSection = PlannerSection()
    shadow: ShadowSection = ShadowSection()

    @field_validator("storage")
    @classmethod
    def _storage_url(cls, v: str) -> str:
        if "://" not in v:
            raise ValueError(f"expected an optuna storage URL such as sqlite:///tierpilot.db or "
                             f"postgresql+psycopg2://user@host/db, got {v!r}")
        return v


class ActuationSection(_Frozen):
    """`actuation:` the Kubernetes actuator (agent/k8s) and leader election."""

    targets_file: Path | None = Field(
        None, description="agent.k8s targets YAML; unset: $TIERPILOT_K8S_TARGETS")
    kubeconfig: Path | None = Field(None, description="unset: in-cluster credentials, else ~/.kube/config")
    leader_election: bool = Field(True, description="only the Lease holder actuates")
    lease_name: str | None = Field(None, description="default: the targets file's lease name")
    lease_namespace: str | None = Field(None, description="default: the targets file's namespace")
    identity: str | None = Field(None, description="default: $POD_NAME, else the host name")


class ExportSettings(_Frozen):
    """`export:` who serves the fleet series when several replicas scrape the same targets."""

    fleet: Literal["all", "leader"] = Field(
        "all", description="all: this replica serves every series; leader: only the Lease holder serves the "
                           "fleet series (tier, TTFT, per-target health, KV events), every replica its own "
                           "agent series, so replicas scraping the same targets are not counted twice")


class AgentSettings(BaseSettings):
    """All agent settings. Build with `load_settings`."""

    model_config = SettingsConfigDict(
        frozen=True, extra="forbid", env_prefix=ENV_PREFIX, env_nested_delimiter="__",
    )

    scrape: ScrapeSettings = ScrapeSettings()
    store: StoreSettings = StoreSettings()
    server: ServerSettings = ServerSettings()
    otel: OtelSettings = OtelSettings()
    targets: TargetSettings = TargetSettings()
    tiers: TierSettings = TierSettings()
    mappings: tuple[Path, ...] = Field((), description="extra mapping files (added to the built-in ones)")
    source: Literal["scrape", "prometheus"] = Field(
        "scrape", description="scrape: fetch every target's /metrics; prometheus: query `prometheus.url`")
    prometheus: PrometheusSourceSettings = PrometheusSourceSettings()
    shard: ShardSettings = ShardSettings()
    export: ExportSettings = ExportSettings()
    log_level: Literal["DEBUG", "INFO", "WARNING", "ERROR"] = "INFO"
    kv_events: KvEventsSection = KvEventsSection()
    tuner: TunerSection = TunerSection()
    actuation: ActuationSection = ActuationSection()
    dry_run: bool = Field(False, description="propose and log changes, apply nothing ($TIERPILOT_DRY_RUN)")

    @classmethod
    def settings_customise_sources(
        cls, settings_cls: type[BaseSettings], init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource, dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        return (env_settings, init_settings)  # environment wins over the file

    @model_validator(mode="after")
    def _one_exporter_per_series(self) -> AgentSettings:
        if self.export.fleet == "leader" and self.shard.count > 1:
            raise ValueError("export.fleet 'leader' with shard.count > 1 would hide the other shards' series; "
                             "with sharding every replica exports its own shard: use export.fleet 'all'")
        return self

    @model_validator(mode="after")
    def _source_has_url(self) -> AgentSettings:
        if self.source == "prometheus" and not self.prometheus.url:
            raise ValueError("source 'prometheus' needs prometheus.url")
        return self

    @property
    def cpu_capacity_bytes(self) -> float | None:
        gib = self.tiers.cpu_capacity_gib
        return gib * 2**30 if gib else None


MAX_SHOWN_ERRORS = 8  # a config with more problems than this names the first ones and counts the rest


def _describe(exc: ValidationError, origin: str) -> str:
    """Every problem of the config on one line (at most MAX_SHOWN_ERRORS, then a count)."""
    errors = exc.errors()
    parts = []
    for err in errors[:MAX_SHOWN_ERRORS]:
        key = ".".join(str(p) for p in err["loc"]) or "(top level)"
        msg = "unknown key" if err["type"] == "extra_forbidden" else err["msg"]
        parts.append(f"key {key!r}: {msg}")
    rest = len(errors) - MAX_SHOWN_ERRORS
    extra = f" (and {rest} more)" if rest > 0 else ""
    return f"{origin}: " + "; ".join(parts) + extra


def load_settings(path: Path | str | None = None, env: Mapping[str, str] | None = None,
                  **overrides: Any) -> AgentSettings:
    """Settings from `path` (YAML), then `TIERPILOT_*` environment variables, then overrides."""
    data: dict[str, Any] = {}
    origin = "settings"
    if path is not None:
        path = Path(path)
        origin = str(path)
        try:
            loaded = yaml.safe_load(path.read_text())
        except OSError as exc:
            raise SettingsError(f"{path}: cannot read: {exc.strerror}") from exc
        except yaml.YAMLError as exc:
            raise SettingsError(f"{path}: not valid YAML: {exc}") from exc
        if loaded is None:
            loaded = {}
        if not isinstance(loaded, dict):
            raise SettingsError(f"{path}: expected a mapping at the top level, got {type(loaded).__name__}")
        data = loaded
    data.update(overrides)
    saved = None
    if env is not None:  # evaluate against an explicit environment (tests)
        saved = {k: v for k, v in os.environ.items() if k.startswith(ENV_PREFIX)}
        for k in saved:
            del os.environ[k]
        os.environ.update({k: v for k, v in env.items() if k.startswith(ENV_PREFIX)})
    try:
        return AgentSettings(**data)
    except ValidationError as exc:
        env_keys = _settings_env_keys(env if env is not None else os.environ)
        where = origin + (f" (with environment {', '.join(env_keys)})" if env_keys else "")
        raise SettingsError(_describe(exc, where)) from exc
    finally:
        if saved is not None:
            for k in [k for k in os.environ if k.startswith(ENV_PREFIX)]:
                del os.environ[k]
            os.environ.update(saved)


def _settings_env_keys(environ: Mapping[str, str]) -> list[str]:
    """The `TIERPILOT_*` variables that name a settings field (others, such as
    `TIERPILOT_SHARED` or `TIERPILOT_K8S_TARGETS`, belong to other tools and are not config)."""
    fields = {name.upper() for name in AgentSettings.model_fields}
    return sorted(k for k in environ
                  if k.startswith(ENV_PREFIX) and k[len(ENV_PREFIX):].split("__", 1)[0] in fields)


__all__ = ["DEFAULT_PORTS", "ROLES", "AgentSettings", "SettingsError", "load_settings"]
