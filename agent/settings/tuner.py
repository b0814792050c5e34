"""The `tuner:` sections, the one home of every tuner default (agent/runtime/tuning/schema.py turns
them into the tuners' settings), and `actuation:`, the Kubernetes actuator the tuner acts through."""
from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import Field, field_validator, model_validator

from agent.settings.frozen import _Frozen


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
