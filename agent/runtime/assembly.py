"""The whole agent, composed from settings: what `tierpilot run` starts.

    runtime = build_runtime(load_settings("agent.yaml"))
    runtime.run_forever()          # or start() ... stop(); SIGTERM/SIGINT stop it cleanly

Pieces (each built only when its section asks for it):

- the agent (agent.runtime.app.Agent): discovery, scrape, window store, /metrics, OTLP;
- `kv_events.enabled`: the KV-event manager (agent.kvevents) with endpoints from the config and
  from `tierpilot.io/kv-events-*` pod annotations, its collector, a per-scrape job feeding it the
  vLLM token counters (`kv_counters`) and a discovery job (`kv_endpoints`);
- `tuner.enabled`: the Kubernetes actuator (agent.k8s, targets from `actuation.targets_file` or
  $TIERPILOT_K8S_TARGETS) behind the guardrails, the Lease elector, the live evaluator over the
  store, the planner and twin search over the planning workload (rebuilt from the KV events'
  block stream; fitted to the observed signals without them; agent/runtime/tuning/),
  the drift detector, and the `tune_step` job, which acts on the leader only. The last good
  configuration goes to the target annotations and to the study storage.

Global `dry_run` (or $TIERPILOT_DRY_RUN): proposals are validated, logged and counted, and every
write is a server-side dry-run; nothing changes. Clock, Kubernetes client, pod API, sleep and the
ZMQ context are injectable, so tests drive time and point everything at an emulator.
"""
from __future__ import annotations

import dataclasses
import datetime
import logging
import os
import threading
import time
from collections.abc import Callable, Mapping
from concurrent.futures import Executor
from pathlib import Path
from typing import TYPE_CHECKING, Any

from agent.collect.discovery import (
    CombinedTargets,
    FileTargets,
    KubernetesPodApi,
    KubernetesTargets,
    PodApi,
    StaticTargets,
    TargetSource,
)
from agent.collect.scheduler import JobSpec
from agent.runtime.app import Agent, run_until_signalled
from agent.runtime.clock import SteadyWallClock
from agent.runtime.peer_auth import PeerTokenError
from agent.settings import AgentSettings, SettingsError
from contracts.actuator import ActuationError
from contracts.jsonsafe import dumps
from contracts.knobs import DEFAULT_KNOBS, Knobs

if TYPE_CHECKING:  # imported where used: `tierpilot run` without KV events or tuner starts fast
    from agent.kvevents import KvEventManager
    from agent.runtime.tuning_bridge import StudyLastGood
    from agent.runtime.tuning_loop import TuningLoop
    from agent.runtime.workload_fit import ObservedWorkload

log = logging.getLogger("tierpilot.runtime")
TARGETS_ENV = "TIERPILOT_K8S_TARGETS"
KUBE_HINT = ("set actuation.kubeconfig or $KUBECONFIG; to see what the tuner would do without a cluster, "
             "use tuner.mode: shadow")


class RuntimeConfigError(SettingsError):
    """The settings are valid one by one but cannot be put together (names the key)."""


def _utcnow() -> datetime.datetime:
    return datetime.datetime.now(datetime.UTC)


@dataclasses.dataclass
class Runtime:
    """Everything `build_runtime` made. `start`/`stop`/`run_forever` manage the lifecycle."""

    settings: AgentSettings
    agent: Agent
    kv: KvEventManager | None = None
    tuning: TuningLoop | None = None
    actuator: Any = None  # agent.k8s.KubernetesActuator
    elector: Any = None  # agent.k8s.LeaseElector
    tuner_metrics: Any = None  # tuners.metrics.TunerMetrics
    actuation_metrics: Any = None  # agent.k8s.ActuationMetrics
    last_good_store: StudyLastGood | None = None
    kv_refresh: Callable[[], int] | None = None
    kv_feed: Callable[[], int] | None = None
    paying: Any = None  # tuners.planning.paying.Paying: the planner, counterfactual twin and calibrations
    fleet_store: Any = None  # what the tuner reads: agent.store, or the shards' FleetStore
    planning_store: Any = None  # fleet_store made robust (fleet_robust.RobustFleet): what the tuner plans and judges on
    fleet_overlap: Any = None  # sharded: the KV-event overlap merged from every shard (FleetOverlap)
    shard_peers: tuple[str, ...] = ()  # shard.peers without this replica's own URL
    plan_executor: Any = None  # where the tuner's plans run (a thread of their own by default)
    proposals: Any = None  # tuners.proposals.ProposalBook: moves outside tuner.apply, for a person
    shadow: Any = None  # tuners.shadow.ShadowLog: tuner.mode shadow's record of plans and scores
    block_recorder: Any = None  # agent.kvevents.rebuild.BlockRecorder: this replica's pods' block stream
    rebuilt_history: Any = None  # agent.kvevents.rebuild.RebuiltHistory over it (kind "rebuilt")
    _stop_elector: threading.Event = dataclasses.field(default_factory=threading.Event)
    _elector_thread: threading.Thread | None = None
    _started: list[Callable[[], None]] = dataclasses.field(default_factory=list)

    def start(self) -> None:
        """Start the KV subscriber, the re-apply guard, the elector, then the agent's loop."""
        try:
            if self.kv is not None:
                self.kv.start()
                self._started.append(self.kv.stop)
            if self.actuator is not None:
                self.actuator.start()
                self._started.append(self.actuator.stop)
            if self.elector is not None:
                self._stop_elector.clear()
                self._elector_thread = threading.Thread(target=self.elector.run, args=(self._stop_elector,),
                                                        name="tierpilot-lease", daemon=True)
                self._elector_thread.start()
                self._started.append(self._stop_elector_thread)
            if self.tuning is not None:  # runs after agent.stop (no more steps), before the actuator stops
                self._started.append(self.tuning.shutdown)
                if self.plan_executor is not None:  # a plan being priced is dropped, not waited for
                    self._started.append(lambda: self.plan_executor.shutdown(wait=False, cancel_futures=True))
            self.agent.start()
            self._started.append(self.agent.stop)
        except BaseException:
            self.stop()
            raise

    def _stop_elector_thread(self) -> None:
        self._stop_elector.set()
        if self._elector_thread is not None:
            self._elector_thread.join(15)  # the elector releases the Lease on its way out
            self._elector_thread = None

    def stop(self) -> None:
        """Stop what `start` started, newest first; safe to call twice."""
        while self._started:
            stop = self._started.pop()
            try:
                stop()
            except Exception:
                log.exception("while stopping")

    @property
    def overlap_source(self) -> Any:
        """Where the drift detector and the workload fit read the KV-event `reuse_ratio`: the
        shards' merged reading when sharded (never one shard's own), else the KV manager."""
        return self.fleet_overlap if self.fleet_overlap is not None else self.kv

    def run_forever(self, on_started: Callable[[], None] | None = None) -> None:
        """Start (then `on_started`, once it serves), block until SIGTERM or SIGINT, then stop cleanly."""
        run_until_signalled(self.start, self.stop, self.agent.is_alive, on_started=on_started)


# -- building --------------------------------------------------------------------------------
def build_runtime(settings: AgentSettings, *, api_client: Any = None, clock: Callable[[], float] | None = None,
                  monotonic: Callable[[], float] = time.monotonic, sleep: Callable[[float], None] = time.sleep,
                  now: Callable[[], datetime.datetime] = _utcnow, targets: TargetSource | None = None,
                  pod_api: PodApi | None = None, kv_context: Any = None,
                  env: Mapping[str, str] | None = None, plan_executor: Executor | None = None,
                  running_knobs: Callable[[], Knobs] | None = None) -> Runtime:
    """Compose the runtime from `settings` (see the module docstring). Raises RuntimeConfigError
    (or the subsystem's own error, naming the file and key) before anything starts. `clock` is the
    data clock (default: wall time that advances with `monotonic`, agent/runtime/clock.py).
    `plan_executor`: where the tuner's plans (twin warm start, transition planner) run; default a
    thread of their own, so a tuning step never waits on one (tests pass an inline executor).
    `running_knobs`: shadow mode's reader of the running configuration (default: tuner.shadow)."""
    env = os.environ if env is None else env
    clock = clock if clock is not None else SteadyWallClock(time.time, monotonic)
    shadow = settings.tuner.enabled and settings.tuner.mode == "shadow"
    act = actuation_settings(settings, env, required=not shadow) if settings.tuner.enabled else None  # errors first
    live_tuner = settings.tuner.enabled and not shadow  # shadow mode needs no Kubernetes
    needs_kube = (live_tuner or (settings.export.fleet == "leader" and settings.actuation.leader_election)
                  or (settings.kv_events.enabled and settings.kv_events.discovery
                      and settings.targets.kubernetes.enabled))
    if api_client is None and needs_kube:
        from agent.k8s.wiring import load_api_client

        kubeconfig = settings.actuation.kubeconfig
        api_client = load_api_client(str(kubeconfig) if kubeconfig else None, hint=KUBE_HINT)
    if (api_client is None and shadow and act is not None and running_knobs is None
            and settings.tuner.shadow.running_file is None):  # the shadow reads the targets when it may
        api_client = _read_only_client(settings)
    if pod_api is None and api_client is not None:
        from kubernetes import client as k8s

        pod_api = KubernetesPodApi(k8s.CoreV1Api(api_client))
    if targets is None and api_client is not None:
        targets = _targets(settings, pod_api)
    try:
        agent = Agent(settings, targets, clock=clock)
    except PeerTokenError as exc:  # shard.token_file unreadable or empty: refuse to start
        raise RuntimeConfigError(str(exc)) from None
    rt = Runtime(settings, agent)
    if settings.shard.count > 1:
        from agent.collect.shard import other_peers

        rt.shard_peers = other_peers(settings.shard.peers, env.get("POD_NAME") or env.get("HOSTNAME"))
    rt.fleet_store = _fleet_store(settings, agent, rt.shard_peers)
    if settings.kv_events.enabled:
        _add_kv_events(rt, settings, pod_api, clock, kv_context)
    if settings.tuner.enabled:
        _add_tuning(rt, settings, act, api_client, clock=clock, monotonic=monotonic, sleep=sleep, now=now,
                    plan_executor=plan_executor, running_knobs=running_knobs)
    if settings.export.fleet == "leader":
        _export_on_lease(rt, settings, api_client, monotonic=monotonic, now=now)
    return rt


def _read_only_client(settings: AgentSettings) -> Any:
    """Kubernetes credentials for shadow mode's reads of the targets, or None (then it assumes the
    targets file's fixed_knobs over the defaults, and says so)."""
    from agent.k8s.wiring import KubeconfigError, load_api_client

    kubeconfig = settings.actuation.kubeconfig
    try:
        return load_api_client(str(kubeconfig) if kubeconfig else None, hint=KUBE_HINT)
    except KubeconfigError as exc:
        log.warning("shadow mode: cannot read the targets (%s); the running configuration is the targets "
                    "file's fixed_knobs over the defaults (set tuner.shadow.running_file)", exc)
        return None


def _export_on_lease(rt: Runtime, settings: AgentSettings, api_client: Any, *, monotonic: Callable[[], float],
                     now: Callable[[], datetime.datetime]) -> None:
    """export.fleet=leader: only the Lease holder serves the fleet series (exporters/fleet.py). The
    tuner's elector when there is one; else one of its own over the same Lease settings."""
    if rt.elector is None:
        if not settings.actuation.leader_election or api_client is None:
            raise RuntimeConfigError("key 'export.fleet': 'leader' needs leader election (actuation.leader_election "
                                     "and a Kubernetes API); use 'all' for a single replica")
        from agent.k8s import KubeApi, LeaseElector
        from agent.k8s.settings import LeaseSettings

        a = settings.actuation
        lease = LeaseSettings(**({"name": a.lease_name} if a.lease_name else {}))
        namespace = a.lease_namespace or settings.targets.kubernetes.namespace
        if not namespace:
            raise RuntimeConfigError("key 'actuation.lease_namespace': export.fleet=leader needs the Lease's namespace")
        identity = a.identity or os.environ.get("POD_NAME") or os.uname().nodename
        rt.elector = LeaseElector(KubeApi(api_client, field_manager="tierpilot"), namespace, lease, identity,
                                  clock=monotonic, now=now)
    rt.agent.is_fleet_exporter = rt.elector.is_leader
    log.info("export.fleet=leader: fleet series served while %s holds the Lease", rt.elector.identity)


def _fleet_store(settings: AgentSettings, agent: Agent, peers: tuple[str, ...]) -> Any:
    """What the tuner, drift detector and workload fit read: this replica's store, or with
    `shard.peers` the fleet's (this shard's window plus every peer's /window)."""
    if settings.shard.count > 1 and peers:
        from agent.collect.fleetstore import FleetStore

        return FleetStore(agent.store, peers, agent.peer_fetch, timeout_s=settings.shard.peer_timeout_s,
                          strict=True)
    return agent.store


def _kv_shard(settings: AgentSettings) -> Callable[[str], bool]:
    """Whether this replica follows the KV events of a pod (the scrape shard's rule)."""
    count = settings.shard.count
    if count == 1:
        return lambda _pod: True
    from agent.collect.shard import shard_index, shard_of

    mine = shard_index(settings.shard.index, count)
    return lambda pod: shard_of(pod, count) == mine


def _targets(settings: AgentSettings, pod_api: PodApi | None) -> TargetSource:
    """The scrape targets; with `source: prometheus` the query API names the pods, so pods are
    not watched (targets.kubernetes then serves only the KV-event endpoints, listed)."""
    sources: list[TargetSource] = [StaticTargets(settings.targets.static)]
    if settings.targets.file is not None:
        sources.append(FileTargets(settings.targets.file))
    if settings.targets.kubernetes.enabled and pod_api is not None and settings.source == "scrape":
        sources.append(KubernetesTargets(pod_api, settings.targets.kubernetes))
    return CombinedTargets(sources)


def _add_kv_events(rt: Runtime, settings: AgentSettings, pod_api: PodApi | None,
                   clock: Callable[[], float], context: Any) -> None:
    from agent.kvevents import EndpointSpec, KvEventManager, KvEventsCollector
    from agent.runtime.tuning_bridge import feed_kv_counters, kv_endpoints_from_pods

    cfg = settings.kv_events
    kv = KvEventManager(cfg.manager_settings(), clock=clock, context=context)
    rt.kv = kv
    rt.agent.add_collector(KvEventsCollector(kv.snapshot), fleet=True)
    from agent.kvevents.store_curve import StoreCurveCollector, StoreStream

    stores = StoreStream(cfg.limits.capacity_curve_blocks)  # the GPU stores: what a CPU buffer of N GiB would hit
    kv.enable_store_curve(stores)
    curve = StoreCurveCollector(stores, settings.tiers.kv_bytes_per_token or 131072.0)
    rt.agent.add_collector(curve, fleet=True)
    rt.agent.add_job(JobSpec("kv_capacity_curve", curve.refresh_s, curve.rebuild))  # never in a render
    _add_block_recorder(rt, settings, kv, clock)
    interval = settings.scrape.interval_s
    rt.kv_feed = lambda: feed_kv_counters(rt.agent.store, kv, window_s=interval * 2.5, ts=clock())
    rt.agent.add_job(JobSpec("kv_counters", interval, rt.kv_feed))
    mine = _kv_shard(settings)
    if settings.shard.count > 1:
        kv.set_endpoints(tuple(s for s in cfg.endpoints if mine(s.pod)))
        _add_fleet_sketches(rt, settings, kv, clock)
    vllm = settings.targets.kubernetes.roles.get("vllm")
    if not (cfg.discovery and settings.targets.kubernetes.enabled and vllm is not None and pod_api is not None):
        if cfg.discovery and not cfg.endpoints:
            log.warning("kv_events: discovery needs targets.kubernetes with a vllm role; no endpoints configured")
        return
    static = tuple(cfg.endpoints)
    namespace = settings.targets.kubernetes.namespace

    def refresh() -> int:
        pods, _version = pod_api.list_pods(namespace, vllm.selector)
        found, errors = kv_endpoints_from_pods(pods, cfg.default_model)
        for err in errors:
            log.warning("kv_events: %s", err)
        merged: dict[str, EndpointSpec] = {s.pod: s for s in found}
        merged.update({s.pod: s for s in static})  # the config wins for a pod named in both
        kv.set_endpoints(tuple(s for s in merged.values() if mine(s.pod)))
        return len(merged)

    rt.kv_refresh = refresh
    rt.agent.add_job(JobSpec("kv_endpoints", cfg.discovery_interval_s, refresh, first_run_now=True))


def _add_block_recorder(rt: Runtime, settings: AgentSettings, kv: KvEventManager, clock: Callable[[], float]) -> None:
    """The block stream recorded for the planning workload rebuilt from it (agent/kvevents/rebuild/),
    with the counters of this replica's own pods."""
    from agent.kvevents.rebuild import BlockRecorder, RebuildCollector, RebuiltHistory, store_counts

    cfg = settings.kv_events
    recorder = BlockRecorder.from_settings(cfg.rebuild, group_idx=cfg.group_idx, clock=clock)
    kv.enable_block_recorder(recorder)
    rt.block_recorder = recorder
    local = RebuiltHistory.from_settings(recorder, store_counts(rt.agent.store), clock, cfg.rebuild)
    rt.rebuilt_history = local
    if settings.shard.count > 1:  # each replica rebuilds its pods; the leader plans on the merge
        from agent.kvevents.rebuild.merge import MergedHistory, peer_states, serve_state

        rt.agent.add_route("/kv/rebuilt", serve_state(local))
        rt.rebuilt_history = MergedHistory(local, peer_states(rt.shard_peers, rt.agent.peer_fetch,
                                                              settings.shard.peer_timeout_s))
    rt.agent.add_collector(RebuildCollector(recorder, lambda: local.outliers, lambda: local.counter_outliers),
                           fleet=True)


def _add_fleet_sketches(rt: Runtime, settings: AgentSettings, kv: KvEventManager,
                        clock: Callable[[], float]) -> None:
    """Sharded KV events: keep mergeable block sketches, serve them on /kv/sketch, and export
    the fleet-wide overlap, distinct blocks and duplication merged from every shard."""
    from agent.kvevents.fleet import BlockSketches, FleetBlocksCollector, state_json
    from agent.kvevents.fleet_overlap import FleetOverlap

    window_s = settings.kv_events.overlap_window_s
    kv.enable_block_sketches(BlockSketches(window_s=window_s, clock=clock))

    def serve(query: dict[str, str]) -> tuple[bytes, str]:
        try:
            w = float(query.get("window_s", window_s))
        except ValueError:
            raise ValueError(f"window_s must be a number of seconds, got {query['window_s']!r}") from None
        if not w > 0:
            raise ValueError("window_s must be positive")
        return state_json(kv.block_sketch_state(w)), "application/json"

    rt.agent.add_route("/kv/sketch", serve)
    fetch = rt.agent.peer_fetch  # with the replicas' token (peer_auth.py)
    rt.agent.add_collector(FleetBlocksCollector(kv.block_sketch_state, rt.shard_peers, fetch,
                                                settings.shard.peer_timeout_s, window_s))
    rt.fleet_overlap = FleetOverlap(kv.block_sketch_state, rt.shard_peers, fetch, settings.shard.peer_timeout_s)


def observed_workload(store: Any, kv: Any, window_s: float) -> ObservedWorkload:
    """The signals the synthetic warm-start workload is fitted to. Without KV events the
    overlap falls back to the cache's cumulative hit ratio (a lower bound)."""
    from agent.collect.window import bucket_increases, bucket_shares
    from agent.runtime.tuning_bridge import drift_signals, gpu_observations
    from agent.runtime.workload_fit import ObservedWorkload

    signals = drift_signals(store, kv, window_s)
    overlap = signals.get("reuse_ratio", signals.get("hit_ratio"))
    window = store.window(window_s)
    gpu = gpu_observations(window)
    return ObservedWorkload(signals.get("arrival_rate"), tuple(bucket_shares(bucket_increases(window, "prompt_length_tokens"))),
                            None if overlap is None else min(max(overlap, 0.0), 1.0),
                            gpu_tokens=int(gpu["gpu_tokens"]) if "gpu_tokens" in gpu else None,
                            requests_waiting=gpu.get("requests_waiting"), preemption_rate=gpu.get("preemption_rate"))


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


def _add_tuning(rt: Runtime, settings: AgentSettings, act: Any, api_client: Any, *,
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


__all__ = ["Runtime", "RuntimeConfigError", "actuation_settings", "build_runtime", "observed_workload",
           "twin_cluster_kw"]
