"""The runtime's tuner (`tuner.enabled`): the actuator (or shadow mode's reader) behind the
guardrails, the Lease elector, the search space the targets accept, the planning store no single
pod can steer, the planning workload, and the tuning loop with its health and plan lines."""
from __future__ import annotations

import dataclasses
import datetime
import logging
import os
from collections.abc import Callable, Mapping
from concurrent.futures import Executor
from pathlib import Path
from typing import TYPE_CHECKING, Any

from agent.collect.scheduler import JobSpec
from agent.runtime.assembly.errors import RuntimeConfigError
from agent.settings import AgentSettings
from contracts.actuator import ActuationError
from contracts.jsonsafe import dumps
from contracts.knobs import DEFAULT_KNOBS, Knobs

if TYPE_CHECKING:
    from agent.runtime.assembly import Runtime

log = logging.getLogger("tierpilot.runtime")
TARGETS_ENV = "TIERPILOT_K8S_TARGETS"


def actuation_settings(settings: AgentSettings, env: Mapping[str, str], *, required: bool = True) -> Any:
    """The actuator settings the runtime uses: the targets file, with the agent config's lease,
    identity and global dry-run applied. Errors name the key or the file. Not `required` (shadow
    mode): None without a targets file."""
    from agent.k8s import ActuationConfigError
    from agent.k8s import load_settings as load_actuation

    act_cfg = settings.actuation
    path = act_cfg.targets_file or (Path(env[TARGETS_ENV]) if env.get(TARGETS_ENV) else None)
    if path is None and not required:
        return None
    if path is None:
        raise RuntimeConfigError(f"key 'actuation.targets_file': tuner.enabled needs the actuator's targets "
                                 f"file (or ${TARGETS_ENV}); tuner.mode: shadow plans without one")
    try:
        act = load_actuation(path)
    except ActuationConfigError as exc:
        msg = str(exc) if str(path) in str(exc) else f"{path}: {exc}"
        raise RuntimeConfigError(f"actuation.targets_file: {msg}") from None
    lease = act.lease.model_copy(update={"enabled": act_cfg.leader_election,
                                         **({"name": act_cfg.lease_name} if act_cfg.lease_name else {})})
    update: dict[str, Any] = {"lease": lease, "dry_run": act.dry_run or settings.dry_run}
    if act_cfg.identity:
        update["identity"] = act_cfg.identity
    return act.model_copy(update=update)


def add_tuning(rt: Runtime, settings: AgentSettings, act: Any, api_client: Any, *,
                clock: Callable[[], float], monotonic: Callable[[], float], sleep: Callable[[float], None],
                now: Callable[[], datetime.datetime], plan_executor: Executor | None,
                running_knobs: Callable[[], Knobs] | None = None) -> None:
    """The tuner on `rt`, step by step: study storage, actuator, search space, metrics and
    proposals, planning store, the twin's reach, the tuning stack, the loop, and the start line."""
    from agent.runtime.tuning.schema import deployment_limits

    storage = _open_study_storage(rt, settings, now)
    shadow = settings.tuner.mode == "shadow"
    namespace, identity, dry_run = _tuning_target(settings, act)
    _add_actuator(rt, settings, act, api_client, running_knobs, monotonic=monotonic, sleep=sleep, now=now)
    limits = deployment_limits(settings)
    space = _search_space(rt, settings, act, limits)
    scope = "none" if shadow else settings.tuner.apply  # the shadow applies nothing; its record says what `apply` would do
    _add_metrics_and_proposals(rt, settings, namespace, scope)
    planning_store = _add_planning_store(rt, settings)
    settings = _without_unmodelled_twin(settings, space.fixed)
    tuning, workload = _tuning_stack(rt, settings, space, storage, limits, planning_store, clock=clock,
                                     monotonic=monotonic, plan_executor=plan_executor, identity=identity,
                                     dry_run=dry_run, scope=scope)
    _add_tuning_loop(rt, settings, tuning, planning_store, workload, clock=clock)
    if shadow:
        from agent.runtime.shadow import add_shadow_log

        add_shadow_log(rt, settings, clock=clock, namespace=namespace)
    _log_tuning_started(rt, settings, space, namespace, shadow=shadow, dry_run=dry_run)


def _open_study_storage(rt: Runtime, settings: AgentSettings, now: Callable[[], datetime.datetime]) -> Any:
    """The study's optuna storage (`tuner.storage`; an error names the key), and the last good
    configuration kept in it."""
    import optuna

    from agent.runtime.tuning_bridge import StudyLastGood
    from tuners.optuna_tuner import open_storage

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    t = settings.tuner
    try:
        storage = open_storage(t.storage)
    except ValueError as exc:
        raise RuntimeConfigError(f"key 'tuner.storage': {exc}") from None
    rt.last_good_store = StudyLastGood(storage, t.study, now=now)
    return storage


def _tuning_target(settings: AgentSettings, act: Any) -> tuple[str, str, bool]:
    """Namespace, owner identity and dry-run of what is tuned: the targets file's, else (shadow
    mode without one) the agent config's."""
    namespace = act.namespace if act is not None else "default"
    identity = act.identity if act is not None else (settings.actuation.identity or os.uname().nodename)
    dry_run = act.dry_run if act is not None else settings.dry_run
    return namespace, identity, dry_run


def _add_actuator(rt: Runtime, settings: AgentSettings, act: Any, api_client: Any,
                  running_knobs: Callable[[], Knobs] | None, *, monotonic: Callable[[], float],
                  sleep: Callable[[float], None], now: Callable[[], datetime.datetime]) -> None:
    """`rt.actuator`: shadow mode's reader, or the Kubernetes actuator with its metrics and (with
    the Lease enabled) the elector."""
    if settings.tuner.mode == "shadow":  # no Kubernetes: the running configuration is read, nothing is written
        from agent.runtime.shadow import shadow_actuator

        rt.actuator = shadow_actuator(settings, act, running_knobs, api_client)
        return
    from agent.k8s import ActuationCollector, ActuationMetrics, KubeApi, LeaseElector, build_actuator

    rt.actuation_metrics = ActuationMetrics()
    rt.agent.add_collector(ActuationCollector(rt.actuation_metrics))
    if act.lease.enabled:
        lease_ns = settings.actuation.lease_namespace or act.namespace
        rt.elector = LeaseElector(KubeApi(api_client, field_manager=act.field_manager), lease_ns, act.lease,
                                  act.identity, clock=monotonic, now=now, metrics=rt.actuation_metrics)
    rt.actuator = build_actuator(api_client, act, elector=rt.elector, metrics=rt.actuation_metrics,
                                 clock=monotonic, sleep=sleep, now=now,
                                 on_mark_good=rt.last_good_store.on_mark_good,
                                 load_last_good=rt.last_good_store.load_last_good)


def _search_space(rt: Runtime, settings: AgentSettings, act: Any, limits: Any) -> Any:
    """The search space the targets accept; an error when they own none of its knobs."""
    from agent.k8s.mapping import load_mappings
    from agent.k8s.offline import acceptance
    from agent.runtime.tuning_bridge import restrict_space
    from tuners.space import SearchSpace

    fixed = _running_knobs(rt.actuator, act.fixed_knobs if act is not None else {})
    # only what the targets accept (the mapping's values per knob); unowned knobs keep what runs now;
    # a knob coupled to an owned one (LMCache cache_policy with a local-disk L2) moves with it
    coupled = rt.actuator.coupled_knobs()
    if act is not None:
        acc = acceptance(act, load_mappings(), source="actuation.targets_file")
    else:
        from agent.runtime.shadow import open_acceptance

        acc = open_acceptance()
    acc = dataclasses.replace(
        acc, fixed={k: getattr(fixed, k) for k in acc.fixed if k not in coupled},
        accepts={**acc.accepts, **{c: acc.accepts[d] for c, d in coupled.items() if d in acc.accepts}})
    space = restrict_space(SearchSpace.from_limits(limits, tune_cpu_eviction=settings.tuner.tune_cpu_eviction),
                           rt.actuator.tunable_knobs(), fixed, coupled=coupled).for_targets(acc)
    if not space.dimensions:
        raise RuntimeConfigError(f"actuation.targets_file: the targets own no knob of the search space "
                                 f"(they own: {', '.join(sorted(rt.actuator.tunable_knobs())) or 'none'})")
    return space


def _add_metrics_and_proposals(rt: Runtime, settings: AgentSettings, namespace: str, scope: str) -> None:
    """The tuner's metrics and its proposal book (a collector and the /proposals route)."""
    from tuners.metrics import TunerMetrics
    from tuners.proposals import ProposalBook

    rt.tuner_metrics = TunerMetrics(target=namespace)
    rt.agent.add_collector(rt.tuner_metrics)
    rt.proposals = ProposalBook(scope, plan_line=lambda a, b: rt.paying.plan_line(a, b) if rt.paying else None,
                                path=settings.tuner.proposals_file, target=namespace)
    rt.agent.add_collector(rt.proposals)
    rt.agent.add_route("/proposals", lambda _q: (dumps(rt.proposals.to_json()).encode(), "application/json"))


def _add_planning_store(rt: Runtime, settings: AgentSettings) -> Any:
    """The tuner plans and judges on windows no single pod can steer (fleet_robust.py)."""
    from agent.runtime.fleet_robust import planning_view

    planning_store = planning_view(settings, rt.fleet_store)
    rt.planning_store = planning_store
    rt.agent.add_collector(planning_store.collector())
    return planning_store


def _without_unmodelled_twin(settings: AgentSettings, fixed: Knobs) -> AgentSettings:
    """`settings` with warm start and planner off when the twin has no model of a running (not
    searched) knob value, e.g. a vllm-project/router left at cache_aware; else unchanged."""
    unmodelled = twin_unmodelled(fixed)
    if not unmodelled:
        return settings
    log.warning("warm start and planner off: the twin has no model of the running %s", ", ".join(unmodelled))
    t = settings.tuner
    return settings.model_copy(update={"tuner": t.model_copy(update={
        "planner": t.planner.model_copy(update={"enabled": False}),
        "warm_start": t.warm_start.model_copy(update={"trials": 0})})})


def _tuning_stack(rt: Runtime, settings: AgentSettings, space: Any, storage: Any, limits: Any, planning_store: Any, *,
                  clock: Callable[[], float], monotonic: Callable[[], float], plan_executor: Executor | None,
                  identity: str, dry_run: bool, scope: str) -> tuple[Any, Any]:
    """The tuning stack (agent/runtime/tuning/build.py) over the planning workload, and that workload."""
    from agent.runtime.paying_runtime import latency_points, twin_cluster_for
    from agent.runtime.tuning.build import TuningIO, build_tuning
    from agent.runtime.tuning.workload import planning_workload
    from agent.runtime.tuning_bridge import StoreWindowSource
    from tuners.planning.paying import restarts_serving_pods
    from tuners.planning.plan_runner import background_executor

    t = settings.tuner
    # the block stream rebuilt (kv_events.enabled), else the workload fitted to the counters; the
    # fitted one also gives the twin cluster vLLM's GPU capacity and the observed load term
    workload, fitted = planning_workload(settings, planning_store, rt.overlap_source, clock, rt.rebuilt_history)
    cluster_kw = twin_cluster_kw(settings, limits)
    plans = plan_executor or background_executor()  # one plan thread across leader terms
    rt.plan_executor = plans
    tuning = build_tuning(settings, TuningIO(
        actuator=rt.actuator, space=space, window_source=StoreWindowSource(planning_store), workload=workload,
        twin_cluster=lambda: twin_cluster_for(cluster_kw, fitted.observed(clock()), limits.pods),
        clock=clock, monotonic=monotonic, metrics=rt.tuner_metrics, storage=storage, restarts=restarts_serving_pods,
        latency_points=lambda since, until: latency_points(planning_store, since, until,
                                                           t.planner.calibration_step_s),
        plan_executor=plans, owner=identity, dry_run=dry_run, apply=scope, proposals=rt.proposals,
        trace=_warm_start_trace(settings)))
    rt.paying = tuning.paying
    return tuning, workload


def _add_tuning_loop(rt: Runtime, settings: AgentSettings, tuning: Any, planning_store: Any, workload: Any, *,
                     clock: Callable[[], float]) -> None:
    """The tuning loop (drift-watched, leader-gated), its `tune_step` job, and its health lines."""
    from agent.runtime.tuning.workload import describe as describe_workload
    from agent.runtime.tuning_bridge import drift_signals
    from agent.runtime.tuning_loop import TuningLoop

    t = settings.tuner
    d = t.drift
    rt.tuning = TuningLoop(
        tuning.new_controller,
        lambda: drift_signals(planning_store, rt.overlap_source, d.window_s, long_prompt_tokens=d.long_prompt_tokens),
        clock=clock, guardrails=tuning.guardrails, is_leader=_tuning_leader(rt, settings))
    rt.agent.add_job(JobSpec("tune_step", t.step_interval_s, rt.tuning.step))
    rt.agent.add_health_check("tuner", rt.tuning.health)
    rt.agent.add_health_info("tuner_workload", lambda: describe_workload(workload))
    if rt.paying is not None:  # every priced candidate of the latest plan: gain/h, cost, payback, verdict
        rt.agent.add_health_info("tuner_plan", lambda: rt.paying.planner.last_plan)
    rt.agent.add_health_info("tuner_proposals", lambda: {"apply": t.apply, "pending": len(rt.proposals.proposals())})


def _log_tuning_started(rt: Runtime, settings: AgentSettings, space: Any, namespace: str, *, shadow: bool,
                        dry_run: bool) -> None:
    """The one line saying what is tuned, where, how, and with which parts."""
    t = settings.tuner
    mode = "SHADOW" if shadow else "DRY-RUN" if dry_run else "live"
    log.info("tuning %s in %s: knobs %s; %s (apply: %s); leader election %s; %s", t.study, namespace,
             ", ".join(d.name for d in space.dimensions), mode, t.apply,
             "on" if rt.elector is not None else "off",
             "planner on (transition costs, twin counterfactual)" if rt.paying is not None else "live search")


def _tuning_leader(rt: Runtime, settings: AgentSettings) -> Callable[[], bool] | None:
    """Who runs the tuner's steps: the Lease holder. Shadow mode has no elector of its own; with
    leader election on it follows the export's, made later (export.fleet: leader), so replicas do
    not plan and export the same shadow record twice."""
    if rt.elector is not None:
        return rt.elector.is_leader
    if settings.tuner.mode == "shadow" and settings.actuation.leader_election and settings.export.fleet == "leader":
        return lambda: rt.elector is not None and rt.elector.is_leader()
    return None


def _running_knobs(actuator: Any, fixed_knobs: Mapping[str, Any]) -> Knobs:
    """What the cluster runs (the values of knobs the tuner will not search), read once."""
    try:
        return actuator.current()
    except ActuationError as exc:
        log.warning("cannot read the running configuration (%s); assuming defaults + fixed_knobs", exc)
        return Knobs.from_mapping({**DEFAULT_KNOBS.to_dict(), **fixed_knobs}, source="fixed_knobs")


def twin_unmodelled(fixed: Knobs) -> list[str]:
    """The running knob values (not searched) the twin cannot replay, as `knob=value`."""
    from tuners.space import TWIN_CPU_EVICTIONS, TWIN_ROUTERS

    out = []
    if fixed.router not in TWIN_ROUTERS:
        out.append(f"router={fixed.router}")
    if fixed.cpu_eviction not in TWIN_CPU_EVICTIONS:
        out.append(f"cpu_eviction={fixed.cpu_eviction}")
    return out


def twin_cluster_kw(settings: AgentSettings, limits: Any) -> dict[str, Any]:
    """The twin cluster's fixed arguments (pods, L2 size, profile), checked: an error names the key."""
    from simulator.cluster import ClusterSpec

    kvbpt = settings.tiers.kv_bytes_per_token or 131072.0
    kw: dict[str, Any] = {"pods": limits.pods, "l2_tokens": int(limits.l2_pool_gib * 2**30 / kvbpt)}
    if settings.tuner.warm_start.profile:
        kw["profile"] = settings.tuner.warm_start.profile
    try:
        ClusterSpec(**kw)
    except ValueError as exc:
        raise RuntimeConfigError(f"key 'tuner.warm_start.profile': {exc}") from None
    return kw


def _warm_start_trace(settings: AgentSettings) -> Any:
    """`tuner.warm_start.workload: trace`: the trace the twin search replays (None otherwise)."""
    ws = settings.tuner.warm_start
    if ws.workload != "trace":
        return None
    from simulator.workload import load_trace

    assert ws.trace is not None
    try:
        return load_trace(ws.trace).head(ws.max_requests)
    except (OSError, ValueError) as exc:
        raise RuntimeConfigError(f"key 'tuner.warm_start.trace': {exc}") from None


__all__ = ["TARGETS_ENV", "actuation_settings", "add_tuning", "twin_cluster_kw", "twin_unmodelled"]
