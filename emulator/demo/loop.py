"""`tierpilot demo`: the whole loop on an emulated cluster, on 127.0.0.1 only.

Pieces (each owned by its subsystem): the digital twin drives emulated vLLM/LMCache/Curvine
endpoints in scaled real time (`emulator.cluster`); each pod publishes the twin's block events
on its own ZMQ PUB/ROUTER ports (`emulator.cluster.kv_publisher`); the agent scrapes, normalises,
stores and exports unified metrics (`emulator.demo.agent_stack` over `agent/` and `exporters/`) and
follows the KV events (`agent.kvevents`); the tuning controller (`tuners.controller`) detects
drift, warm-starts from the twin on the recent workload and runs live trials through the local
actuator with the guardrails on. The demo records everything (`Recorder`; the timeline from
its own thread, `emulator.demo.timeline_sampler`), shows it live (rich) and writes the report
(`emulator.demo.outcome`), also when interrupted.
"""
from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

import optuna
import polars as pl
from rich.console import Console, Group
from rich.live import Live

from agent.kvevents import EndpointSpec
from agent.runtime.paying_runtime import latency_points
from agent.runtime.tuning.build import TuningIO, build_tuning
from agent.runtime.tuning_bridge import StoreWindowSource
from contracts.knobs import DEFAULT_KNOBS, Knobs
from contracts.tier_model import Target
from emulator.cluster.catalogue import CURVINE_IO_S_BUCKETS
from emulator.cluster.driver import ScaledRealtimeDriver
from emulator.cluster.fleet import ClusterSpec, EmulatedCluster, pod_names
from emulator.cluster.kv_publisher import TwinEventPublisher, open_pod_publishers
from emulator.cluster.local_actuator import LocalActuator
from emulator.cluster.paced_clock import CpuGate, PacedClock, thread_cpu_clock
from emulator.cluster.pod_metrics import PodIdentity
from emulator.cluster.timeline import DemoEvent, Disturbance, Recorder
from emulator.cluster.twin_adapter import TwinPortAdapter
from emulator.demo.accuracy import AccuracyMeter
from emulator.demo.agent_stack import DemoAgent
from emulator.demo.console import (
    Renderable,
    endpoint_lines,
    event_text,
    logs_above_live_view,
    progress_line,
    render_view,
)
from emulator.demo.deployment import DEMO_TTFT_BUCKETS, MODEL_NAME, demo_deployment, restarts_pods
from emulator.demo.outcome import DemoResult, demo_outcome
from emulator.demo.report import verdict_lines
from emulator.demo.settings import DemoSettings, DemoSettingsError
from emulator.demo.timeline_sampler import TimelineSampler
from emulator.demo.tuner_taps import InjectingWarmStart, RecordingEvaluator
from emulator.demo.workload import DemoWorkload, build_workload
from simulator.cluster import ClusterSpec as TwinClusterSpec
from simulator.records import iter_requests
from simulator.twin import Twin
from tuners.capacity_export import publish_capacity_curves
from tuners.controller import StepReport
from tuners.metrics import TunerMetrics
from tuners.objective import Evaluation
from tuners.payoff import answer_line, scorecard_lines
from tuners.planning.plan_runner import background_executor

log = logging.getLogger("tierpilot.demo")

DEFAULT_TIME_SCALE = 20.0  # trace-seconds per wall-second
SPAN_SHARE = 0.95  # the workload fills this share of the run; the rest is the verdict
PROGRESS_EVERY_S = 10.0  # wall seconds between progress lines without the live view
REGRESSION_KNOBS = Knobs(chunk_tokens=2048, cpu_gib=0.0, l2_min_prompt_tokens=4096)
# The demo's pods run vLLM with `custom_histogram_buckets` for TTFT (25 ms steps up to 1.5 s, then
# coarser), so quantiles from the buckets can tell a 10% change; vLLM's defaults jump 0.5 -> 0.75 -> 1.
L2_BOUNDS_S = CURVINE_IO_S_BUCKETS  # Curvine FUSE read latency buckets, seconds
STATE_EVENTS = {"drift": "drift", "trial_started": "apply", "rolled_back": "rollback", "improved": "keep",
                "told": "trial", "baseline_done": "info", "failed": "error", "rejected": "error",
                "dry_run": "trial", "stopped": "error"}


class Demo:
    """Builds the emulated world, runs it for `settings.duration_s`, writes the report."""

    def __init__(self, settings: DemoSettings, console: Console | None = None,
                 wall_clock: Callable[[], float] = time.monotonic) -> None:
        self.s = settings
        self.console = console or Console()
        self.wall = wall_clock
        self.scale = settings.time_scale or DEFAULT_TIME_SCALE
        # the tuner's settings: tuner.yaml, on this fleet, with this seed and the emulated pods' downtime
        self.deployment = demo_deployment(settings.pods, settings.seed, tuner={
            "planner": {"restart_downtime_s": settings.restart_downtime_s * self.scale}})
        self.tuner = self.deployment.settings.tuner
        self.recorder = Recorder(window_trace_s=self.tuner.drift.window_s * 2)
        self.names = pod_names(settings.pods)
        self.twin_cluster = TwinClusterSpec(pods=settings.pods, pod_names=self.names)
        self.status = "starting"
        self._t0 = wall_clock()
        # the cluster's clock waits for the control loop: a busy machine slows the run, never skips steps
        self.paced = PacedClock(max_lead_s=2 * self.tuner.step_interval_s / self.scale, wall=wall_clock)
        self._trial_seq = 0
        self._boundary_knobs: Knobs | None = None  # what phase 1 ended with

    # -- wiring --------------------------------------------------------------------------------
    def _build(self) -> None:
        s = self.s
        self.workload: DemoWorkload = build_workload(s.duration_s * self.scale * SPAN_SHARE, s.seed,
                                                     str(s.trace) if s.trace else None)
        caps = self.twin_cluster.capacities(DEFAULT_KNOBS)
        identity = PodIdentity(model_name=MODEL_NAME, kv_bytes_per_token=caps.kv_bytes_per_token,
                               num_gpu_blocks=caps.gpu_tokens // 16, ttft_buckets=DEMO_TTFT_BUCKETS)
        self.cluster = EmulatedCluster(ClusterSpec(pods=s.pods, identity=identity,
                                                   restart_downtime_s=s.restart_downtime_s, base_port=s.pods_port),
                                       sleep=self.paced.sleep)
        try:
            self.cluster.start()  # binds the ports the agent's static targets point at
        except OSError as exc:
            self.cluster.stop()
            raise DemoSettingsError(f"--pods-port {s.pods_port}: cannot listen on 127.0.0.1 ports {s.pods_port}.."
                                    f"{s.pods_port + 2 * s.pods}: {exc.strerror or exc}; give another port or 0 "
                                    f"for free ports") from None
        self.publishers = open_pod_publishers(self.names, model=MODEL_NAME)
        self.kv_sink = TwinEventPublisher(self.publishers, clock_offset=0.0, tokens="empty")
        self.twin = Twin(self.twin_cluster, DEFAULT_KNOBS, event_sink=self.kv_sink)
        self.port = TwinPortAdapter(self.twin, list(iter_requests(self.workload.frame)))
        starts = self.workload.phase_starts_s
        self.driver = ScaledRealtimeDriver(
            self.port, self.cluster, self.recorder, time_scale=self.scale,
            phase_of=lambda t: sum(1 for p in starts[1:] if t >= p), on_step=self._driver_step, clock=self.paced)
        self.cluster.on_restart(self._restart_publisher)
        self.accuracy = AccuracyMeter(self.tuner.drift.window_s, self.recorder.recorded_between, self.recorder.evictions_at,
                                      ttft_bounds=DEMO_TTFT_BUCKETS, l2_bounds_s=L2_BOUNDS_S)

        self.actuator = LocalActuator(self.cluster, reconfigure=self._reconfigure, dry_run=s.dry_run,
                                      state_file=s.report_dir / "last-good.yaml")
        self.tuner_metrics = TunerMetrics(target="demo")
        self.plan_executor = background_executor()  # plans priced beside the control loop, never in its tick
        targets = [Target(url=t["url"], role=t["role"], pod=t["pod"]) for t in self.cluster.targets()]
        kv_endpoints = [EndpointSpec(pod=n, model=MODEL_NAME, endpoint=p.endpoint, replay_endpoint=p.replay_endpoint,
                                     topic=f"kv@{n}@") for n, p in self.publishers.items()]
        self.agent = DemoAgent(targets, clock=self.driver.trace_now, port=s.agent_port, kv_endpoints=kv_endpoints,
                               kv_bytes_per_token=caps.kv_bytes_per_token, window_s=self.tuner.drift.window_s,
                               extra_collectors=(self.tuner_metrics,), wall_of=self._wall_of)
        # the tuner reads what `tierpilot run`'s would: the agent's robust view of its store and the
        # workload rebuilt from the pods' block streams, never the request frame the cluster serves
        self.view, workload = self.agent.tuner_inputs(self.deployment.settings)
        view, step_s = self.view, self.tuner.planner.calibration_step_s
        tuning = build_tuning(self.deployment.settings, TuningIO(
            actuator=self.actuator, space=self.deployment.space(), window_source=StoreWindowSource(view),
            workload=workload, twin_cluster=lambda: self.twin_cluster, clock=self.driver.trace_now,
            metrics=self.tuner_metrics, storage=optuna.storages.InMemoryStorage(), restarts=restarts_pods,
            latency_points=lambda since, until: latency_points(view, since, until, step_s),
            plan_executor=self.plan_executor, dry_run=s.dry_run,
            wrap_evaluator=lambda ev: RecordingEvaluator(ev, self._twin_trial),
            wrap_warm_start=lambda warm: InjectingWarmStart(
                warm, REGRESSION_KNOBS if s.inject_regression else None, self._warm_candidates, self._new_study,
                lambda knobs: any(r.knobs == knobs for r in self.actuator.history))))
        self.space = tuning.space
        self.guardrails = tuning.guardrails
        self.controller = tuning.new_controller()
        self.planner = tuning.planner
        # a plan priced beside the loop holds the cluster's clock while the machine starves it
        plan_thread = self.plan_executor.submit(threading.get_ident).result()  # its one worker, started
        self.plan_gate = CpuGate(lambda: self.controller.plans.running, self.paced,
                                 cpu=thread_cpu_clock(plan_thread))

    def _driver_step(self) -> None:
        """After each driver step (its thread, its lock held): flush the KV events, and mark the
        workload's shift the step it happens, stamped with the shift's own time."""
        self.kv_sink.flush_step()
        starts = self.workload.phase_starts_s
        if self._boundary_knobs is None and len(starts) > 1 and self.driver.trace_now() >= starts[1]:
            self._boundary_knobs = self._tuned_now()
            self._event("phase", "the workload shifts: " + self.workload.labels[1], at_trace_s=starts[1])

    def _wall_of(self, cluster_t: float) -> float:
        """The wall time (unix seconds) of cluster time `cluster_t`."""
        return time.time() - (self.driver.trace_now() - cluster_t) / self.scale

    def _restart_publisher(self, pod: str) -> None:
        """A restarted engine publishes from sequence 0; its first batch says the cache is empty."""
        with self.driver.lock:
            self.publishers[pod].restart()
            self.kv_sink.flush_step()
        self.recorder.add_disturbance(Disturbance(self.driver.trace_now(), "restart", pod))

    def _reconfigure(self, knobs: Knobs) -> None:
        self.recorder.add_disturbance(Disturbance(self.driver.trace_now(), "config", ""))
        self.driver.reconfigure(knobs)

    # -- recording helpers -------------------------------------------------------------------------
    def _event(self, kind: str, message: str, at_trace_s: float | None = None) -> None:
        """Record (and without the live view, print) an event, stamped now or at cluster time
        `at_trace_s` (a moment just passed, in wall time too)."""
        now = self.driver.trace_now()
        at = now if at_trace_s is None else min(at_trace_s, now)
        wall_s = self.wall() - self._t0 - (now - at) / self.scale
        self.recorder.add_event(DemoEvent(wall_s, at, kind, message))
        if not self.s.live_view:  # the live view lists them; without it, they are progress lines
            self.console.print(f"[{wall_s:5.0f} s] {kind}: {message}", soft_wrap=True,
                               highlight=False, markup=False)

    def _new_study(self) -> None:
        """A tuning phase opens (start or drift): its twin and live trials form a new study."""
        self.recorder.study_marks.append((self._trial_seq, f"study {len(self.recorder.study_marks)}"))

    def _twin_trial(self, ev: Evaluation) -> None:
        self.recorder.trials.append((self._trial_seq, ev.ttft_p95_s, "twin"))
        self._trial_seq += 1

    def _warm_candidates(self, cands: list[Knobs]) -> None:
        for c in cands:
            diff = DEFAULT_KNOBS.diff(c)
            self._event("info", "warm start enqueued: " + (", ".join(f"{k}={b}" for k, (_a, b) in diff.items())
                                                          or "defaults"))

    def _on_report(self, rep: StepReport) -> None:
        kind = STATE_EVENTS.get(rep.state)
        if rep.state == "trial_started":
            diff = DEFAULT_KNOBS.diff(self.actuator.current())
            msg = f"trial {rep.trial}: " + (", ".join(f"{k}={b}" for k, (_a, b) in diff.items()) or "defaults")
            self._event(kind or "apply", msg + (" (dry run)" if self.s.dry_run else ""))
            return
        if rep.state in ("rolled_back", "improved", "told", "baseline_done"):
            rec = self._trial_record(rep.trial)
            if rec is not None:
                state = "rolled_back" if rep.state == "rolled_back" else "complete"
                self.recorder.trials.append((self._trial_seq, rec.value, state))
                self._trial_seq += 1
        if rep.state == "drift":
            self.status = "drift: re-tuning"

        if kind is not None:
            self._event(kind, event_text(rep.state, rep.trial, rep.message))

    def _trial_record(self, number: int | None):
        tuner = self.controller.tuner
        if tuner is None or number is None:
            return None
        for t in tuner.trials():
            if t.number == number:
                return t
        return None

    def _tuned_now(self) -> Knobs:
        """The configuration tierpilot stands behind now: the running one, unless a trial is still
        being judged (then the last good one)."""
        if self.controller.candidate is not None or self.controller.evaluator.pending is not None:
            return self.actuator.last_good() or DEFAULT_KNOBS
        return self.actuator.current()

    def _publish_curves(self, now: float):
        """The capacity curves over everything served so far, at the knobs in force, on the
        agent's metrics (`tierpilot_tier_capacity_hit_ratio`); returns them (None before traffic)."""
        history = self.workload.frame.filter(pl.col("timestamp_ms") <= int(now * 1000))
        return publish_capacity_curves(self.tuner_metrics, history, self.twin_cluster, self.actuator.current())

    def _endpoint_lines(self) -> list[str]:
        return endpoint_lines(self.cluster, self.publishers)

    def _progress(self, last: list[float]) -> None:
        """Without the live view: one line every PROGRESS_EVERY_S wall seconds."""
        now = self.wall()
        if now - last[0] < PROGRESS_EVERY_S:
            return
        last[0] = now
        phase = sum(1 for p in self.workload.phase_starts_s[1:] if self.driver.trace_now() >= p)
        self.console.print(progress_line(now - self._t0, self.s.duration_s, phase, self.workload.labels[phase],
                                         self.driver.served, self.status), soft_wrap=True, highlight=False,
                           markup=False)

    def _view(self) -> Group:
        return render_view(self.recorder, knobs=self.actuator.current(), status=self.status,
                           wall_s=self.wall() - self._t0, duration_s=self.s.duration_s, agent_url=self.agent.url,
                           max_events=max(3, min(10, self.console.height - 20)))

    # -- the run ---------------------------------------------------------------------------------
    def run(self) -> DemoResult:
        self._build()
        interrupted = False
        try:
            self.agent.start()
            if self.agent.port_message:
                self.console.print(f"[yellow]{self.agent.port_message}[/yellow]")
            self.console.print(f"tierpilot demo: {self.s.pods} emulated pods, {self.workload.frame.height} requests "
                               f"over {self.workload.span_s / 60:.1f} cluster-minutes at {self.scale:g}x; "
                               f"agent metrics on {self.agent.url}")
            for line in self._endpoint_lines():
                self.console.print(line, soft_wrap=True, highlight=False)
            time.sleep(0.3)  # ZMQ slow joiner: let the subscribers connect before events flow
            self._t0 = self.wall()
            self.driver.start()
            self.status = "learning the workload"
            if self.s.live_view:
                with Live(Renderable(self._view), console=self.console, refresh_per_second=4, transient=False), \
                        logs_above_live_view(self.console):
                    self._loop()
            else:
                self._loop()
        except KeyboardInterrupt:
            interrupted = True
            self.console.print("[yellow]interrupted: stopping and writing the partial report[/yellow]")
        finally:
            self._shutdown()
        return self._finish(interrupted)

    def _loop(self) -> None:
        """Until the stream ends: on a busy machine the paced clock stretches the run (the report
        says by how much); Ctrl-C stops it with a partial report."""
        sampler = TimelineSampler(recorder=self.recorder, workload=self.workload, agent=self.agent,
                                  accuracy=self.accuracy, window_s=self.tuner.drift.window_s,
                                  trace_now=self.driver.trace_now, wall=self.wall, t0=self._t0,
                                  publish_curves=self._publish_curves)
        sampler.start()
        last_progress = [self.wall()]
        try:
            while self.driver.trace_now() < self.workload.span_s and not self.driver.finished:
                if self.plan_gate():
                    self.paced.tick()
                if not self.s.live_view:
                    self._progress(last_progress)
                if self.driver.error is not None:
                    raise RuntimeError(f"the twin driver failed: {self.driver.error}") from self.driver.error
                if self.driver.trace_now() >= self.tuner.drift.window_s:  # the agent has a window
                    signals = self.agent.drift_signals(self.tuner.drift.window_s, self.view)
                    rep = self.controller.step(self.driver.trace_now(), signals)
                    self._on_report(rep)
                    if self.status.startswith("learning") and rep.state != "baseline":
                        self.status = "tuning"
                self.paced.sleep(self.tuner.step_interval_s / self.scale, gate=self.plan_gate)
        finally:
            sampler.stop()

    def _shutdown(self) -> None:
        self.plan_executor.shutdown(wait=False, cancel_futures=True)
        self.driver.stop()
        for stop in (self.agent.stop, self.cluster.stop):
            try:
                stop()
            except Exception:
                log.exception("while stopping")
        try:
            self.kv_sink.flush_step()
        finally:
            for pub in self.publishers.values():
                pub.close()

    def _finish(self, interrupted: bool) -> DemoResult:
        self.status = "writing the report"
        final = self._tuned_now()
        return demo_outcome(self.s, scale=self.scale, tuner=self.tuner, recorder=self.recorder,
                            workload=self.workload, twin_cluster=self.twin_cluster,
                            tuned=[self._boundary_knobs or final, final], interrupted=interrupted,
                            prediction_errors=self.controller.prediction_errors, planner=self.planner,
                            accuracy=self.accuracy, paced=self.paced, served=self.driver.served,
                            agent_url=self.agent.url,
                            capacity_curves=lambda: self._publish_curves(self.driver.trace_now()))


def run_demo(settings: DemoSettings, console: Console | None = None) -> DemoResult:
    console = console or Console()
    result = Demo(settings, console).run()
    lines = [answer_line(result.scores), *scorecard_lines(result.scores)] if result.scores else \
        verdict_lines(result.verdicts)
    for line in lines:
        console.print(line, soft_wrap=True)  # table rows stay one line each, whatever the width
    console.print(f"report: {result.report_path}")
    return result
