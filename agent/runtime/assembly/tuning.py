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
    import optuna

    from agent.k8s import ActuationCollector, ActuationMetrics, KubeApi, LeaseElector, build_actuator
    from agent.k8s.mapping import load_mappings
    from agent.k8s.offline import acceptance
    from agent.runtime.fleet_robust import planning_view
    from agent.runtime.paying_runtime import latency_points, twin_cluster_for
    from agent.runtime.tuning.build import TuningIO, build_tuning
    from agent.runtime.tuning.schema import deployment_limits
    from agent.runtime.tuning.workload import describe as describe_workload
    from agent.runtime.tuning.workload import planning_workload
    from agent.runtime.tuning_bridge import StoreWindowSource, StudyLastGood, drift_signals, restrict_space
    from agent.runtime.tuning_loop import TuningLoop
    from tuners.metrics import TunerMetrics
    from tuners.optuna_tuner import open_storage
    from tuners.planning.paying import restarts_serving_pods
    from tuners.planning.plan_runner import background_executor
    from tuners.proposals import ProposalBook
    from tuners.space import SearchSpace

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    t = settings.tuner
    try:
        storage = open_storage(t.storage)
    except ValueError as exc:
        raise RuntimeConfigError(f"key 'tuner.storage': {exc}") from None
    rt.last_good_store = StudyLastGood(storage, t.study, now=now)
    shadow = t.mode == "shadow"
    namespace = act.namespace if act is not None else "default"
    identity = act.identity if act is not None else (settings.actuation.identity or os.uname().nodename)
    dry_run = act.dry_run if act is not None else settings.dry_run
    if shadow:  # no Kubernetes: the running configuration is read, nothing is written
        from agent.runtime.shadow import open_acceptance, shadow_actuator

        rt.actuator = shadow_actuator(settings, act, running_knobs, api_client)
    else:
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
    limits = deployment_limits(settings)
    fixed = _running_knobs(rt.actuator, act.fixed_knobs if act is not None else {})
    # only what the targets accept (the mapping's values per knob); unowned knobs keep what runs now;
    # a knob coupled to an owned one (LMCache cache_policy with a local-disk L2) moves with it
    coupled = rt.actuator.coupled_knobs()
    acc = (acceptance(act, load_mappings(), source="actuation.targets_file") if act is not None
           else open_acceptance())
    acc = dataclasses.replace(
        acc, fixed={k: getattr(fixed, k) for k in acc.fixed if k not in coupled},
        accepts={**acc.accepts, **{c: acc.accepts[d] for c, d in coupled.items() if d in acc.accepts}})
    space = restrict_space(SearchSpace.from_limits(limits, tune_cpu_eviction=t.tune_cpu_eviction),
                           rt.actuator.tunable_knobs(), fixed, coupled=coupled).for_targets(acc)
    if not space.dimensions:
        raise RuntimeConfigError(f"actuation.targets_file: the targets own no knob of the search space "
                                 f"(they own: {', '.join(sorted(rt.actuator.tunable_knobs())) or 'none'})")
    rt.tuner_metrics = TunerMetrics(target=namespace)
    rt.agent.add_collector(rt.tuner_metrics)
    scope = "none" if shadow else t.apply  # the shadow applies nothing; its record says what `apply` would do
    rt.proposals = ProposalBook(scope, plan_line=lambda a, b: rt.paying.plan_line(a, b) if rt.paying else None,
                                path=t.proposals_file, target=namespace)
    rt.agent.add_collector(rt.proposals)
    rt.agent.add_route("/proposals", lambda _q: (dumps(rt.proposals.to_json()).encode(), "application/json"))
    # the tuner plans and judges on windows no single pod can steer (fleet_robust.py)
    planning_store = planning_view(settings, rt.fleet_store)
    rt.planning_store = planning_store
    rt.agent.add_collector(planning_store.collector())
    unmodelled = twin_unmodelled(space.fixed)
    if unmodelled:  # e.g. a vllm-project/router left at cache_aware: the twin cannot replay it
        log.warning("warm start and planner off: the twin has no model of the running %s", ", ".join(unmodelled))
        settings = settings.model_copy(update={"tuner": t.model_copy(update={
            "planner": t.planner.model_copy(update={"enabled": False}),
            "warm_start": t.warm_start.model_copy(update={"trials": 0})})})
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
    if shadow:
        from agent.runtime.shadow import add_shadow_log

        add_shadow_log(rt, settings, clock=clock, namespace=namespace)
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
