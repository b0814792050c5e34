"""The whole agent, composed from settings: what `tierpilot run` starts.

    runtime = build_runtime(load_settings("agent.yaml"))
    runtime.run_forever()          # or start() ... stop(); SIGTERM/SIGINT stop it cleanly

Pieces (each built only when its section asks for it; the KV-event ones in `kv_events.py`, the
tuner's in `tuning.py`):

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
from typing import TYPE_CHECKING, Any

from agent.collect.discovery import KubernetesPodApi, PodApi, TargetSource
from agent.runtime.app import Agent
from agent.runtime.assembly.errors import RuntimeConfigError
from agent.runtime.assembly.kv_events import add_kv_events, observed_workload
from agent.runtime.assembly.tuning import actuation_settings, add_tuning, twin_cluster_kw, twin_unmodelled
from agent.runtime.clock import SteadyWallClock
from agent.runtime.lifecycle import run_until_signalled
from agent.runtime.peer_auth import PeerTokenError
from agent.runtime.sources import targets_from_settings
from agent.settings import AgentSettings
from contracts.knobs import Knobs

if TYPE_CHECKING:  # imported where used: `tierpilot run` without KV events or tuner starts fast
    from agent.kvevents import KvEventManager
    from agent.runtime.tuning_bridge import StudyLastGood
    from agent.runtime.tuning_loop import TuningLoop

log = logging.getLogger("tierpilot.runtime")
KUBE_HINT = ("set actuation.kubeconfig or $KUBECONFIG; to see what the tuner would do without a cluster, "
             "use tuner.mode: shadow")


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
        targets = targets_from_settings(settings, pod_api)  # a pod watch through the injected API
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
        add_kv_events(rt, settings, pod_api, clock, kv_context)
    if settings.tuner.enabled:
        add_tuning(rt, settings, act, api_client, clock=clock, monotonic=monotonic, sleep=sleep, now=now,
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


__all__ = ["Runtime", "RuntimeConfigError", "actuation_settings", "build_runtime", "observed_workload",
           "twin_cluster_kw", "twin_unmodelled"]
