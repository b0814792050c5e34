"""Shadow mode (`tuner.mode: shadow`): the tuner plans exactly as the live one would, with no
Kubernetes access, and applies nothing.

- The fleet is read as always (static targets, a targets file, or a Prometheus: `source`).
- The running configuration comes from `tuner.shadow.running_file` (a knobs YAML your deploy
  pipeline keeps, re-read at every look, so a change made by anyone is seen); else, with a targets
  file and Kubernetes credentials, from the targets themselves (get only: the Helm chart's shadow
  install grants no other verb on them); else the targets file's `fixed_knobs` over the defaults.
  Tests and the emulator inject their own reader.
- `ShadowActuator` stands where the Kubernetes actuator stands: it reports that configuration and
  owns the knobs the targets file owns (read offline, no cluster), or every knob without one. It
  never writes: the guardrails run with apply `none`, so every move the planner makes is recorded.
- `tuners.shadow.ShadowLog` keeps every plan, what a live tuner with `tuner.apply` would have done,
  and scores each change of the running configuration against its prediction; it is exported
  (`tierpilot_tuner_shadow_*`), in /healthz (`info.tuner_shadow`) and, with `tuner.shadow.log_file`,
  written as JSON lines.
"""
from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from agent.collect.scheduler import JobSpec
from contracts.actuator import ApplyResult, PermanentActuationError
from contracts.jsonsafe import dumps
from contracts.knobs import DEFAULT_KNOBS, KnobError, Knobs
from tuners.space import TargetAcceptance

log = logging.getLogger("tierpilot.shadow")


class ShadowActuator:
    """An `Actuator` that reads the running configuration and writes nothing (see the module docstring)."""

    def __init__(self, running: Callable[[], Knobs], tunable: frozenset[str],
                 coupled: Callable[[], dict[str, str]] = dict) -> None:
        self._running = running
        self._tunable = tunable
        self._coupled = coupled
        self._last_good: Knobs | None = None

    def current(self) -> Knobs:
        return self._running()

    def apply(self, knobs: Knobs, *, dry_run: bool = False) -> ApplyResult:
        if dry_run:
            return ApplyResult(knobs, applied=False, dry_run=True, changed=self.current().diff(knobs),
                               message="shadow: not applied")
        raise PermanentActuationError("shadow mode applies nothing (tuner.mode: shadow)")

    def last_good(self) -> Knobs | None:
        return self._last_good

    def mark_good(self, knobs: Knobs) -> None:
        self._last_good = knobs

    def rollback(self) -> ApplyResult:
        now = self.current()
        return ApplyResult(now, applied=False, message="shadow: nothing to roll back")

    def tunable_knobs(self) -> frozenset[str]:
        return self._tunable

    def coupled_knobs(self) -> dict[str, str]:
        return self._coupled()  # read from the live objects when the targets are readable

    def start(self) -> None:
        pass

    def stop(self) -> None:
        pass


def open_acceptance() -> TargetAcceptance:
    """Without a targets file: every knob may move to any value the search space offers."""
    return TargetAcceptance({k: None for k in DEFAULT_KNOBS.to_dict()}, {}, "tuner.mode shadow")


class RunningFile:
    """The running configuration from a knobs YAML, re-read at every call; a file that cannot be
    read or is invalid keeps the last good reading (and says so once per distinct problem)."""

    def __init__(self, path: Path | None, fallback: Knobs) -> None:
        self.path = path
        self._last = fallback
        self._problem = ""

    def __call__(self) -> Knobs:
        if self.path is None:
            return self._last
        try:
            self._last = Knobs.from_yaml_file(self.path)
            self._problem = ""
        except KnobError as exc:
            if str(exc) != self._problem:
                self._problem = str(exc)
                log.warning("tuner.shadow.running_file: %s; keeping %s", exc, self._last.to_dict())
        return self._last


def fallback_knobs(act: Any) -> Knobs:
    """The defaults with the targets file's fixed_knobs (when there is one)."""
    fixed: Mapping[str, Any] = act.fixed_knobs if act is not None else {}
    return Knobs.from_mapping({**DEFAULT_KNOBS.to_dict(), **fixed}, source="actuation.targets_file fixed_knobs")


def shadow_actuator(settings: Any, act: Any, running: Callable[[], Knobs] | None,
                    api_client: Any = None) -> ShadowActuator:
    """The shadow's actuator. The running configuration: `running` (injected), else the running
    file, else the targets read through `api_client` (get only: the Kubernetes actuator's reads,
    never its writes or watches), else the fallback."""
    coupled: Callable[[], dict[str, str]] = dict
    if act is not None:
        from agent.k8s.mapping import load_mappings
        from agent.k8s.offline import acceptance

        tunable = frozenset(acceptance(act, load_mappings(), source="actuation.targets_file").accepts)
    else:
        tunable = frozenset(DEFAULT_KNOBS.to_dict())
    reader = running
    if reader is None and settings.tuner.shadow.running_file is None and act is not None and api_client is not None:
        from agent.k8s import build_actuator

        reads = build_actuator(api_client, act.model_copy(update={"dry_run": True}))  # never started
        reader, coupled = reads.current, reads.coupled_knobs
        tunable = reads.tunable_knobs()
    if reader is None:
        reader = RunningFile(settings.tuner.shadow.running_file, fallback_knobs(act))
    return ShadowActuator(reader, tunable, coupled)


def add_shadow_log(rt: Any, settings: Any, *, clock: Callable[[], float], namespace: str) -> None:
    """The shadow record over the planner's plans (see the module docstring). Needs the planner."""
    from agent.runtime.tuning_bridge import StoreWindowSource
    from tuners.shadow import ShadowLog

    t = settings.tuner
    if rt.paying is None:
        log.warning("tuner.mode shadow without the planner (tuner.planner.enabled false or a running "
                    "configuration the twin cannot replay): no plans to record")
        return
    sh = t.shadow
    writer = _jsonl_writer(sh.log_file) if sh.log_file is not None else None
    rt.shadow = ShadowLog(scope=t.apply, plans=rt.paying.planner.history, running=rt.actuator.current,
                          ttft=StoreWindowSource(rt.planning_store), settle_s=sh.settle_s if sh.settle_s is not None
                          else t.live.settle_s, window_s=sh.window_s if sh.window_s is not None else t.live.window_s,
                          min_requests=t.live.min_requests, keep=sh.keep, log=writer, target=namespace)
    rt.agent.add_collector(rt.shadow)
    # the Lease holder keeps the record (a standby makes no plans and would score changes twice)
    rt.agent.add_job(JobSpec("shadow", t.step_interval_s, lambda: rt.shadow.update(clock()) if rt.tuning.leading else 0))
    rt.agent.add_health_info("tuner_shadow", rt.shadow.summary)
    log.info("shadow mode: planning as a live tuner with apply %s would; nothing is applied%s", t.apply,
             f"; record in {sh.log_file}" if sh.log_file else "")


def _jsonl_writer(path: Path) -> Callable[[str, Mapping[str, Any]], None]:
    """Append one JSON line per record (`{"kind": ..., ...}`); a write that fails is logged, not raised."""
    path.parent.mkdir(parents=True, exist_ok=True)

    def write(kind: str, record: Mapping[str, Any]) -> None:
        try:
            with path.open("a") as f:
                f.write(dumps({"kind": kind, **record}, default=str) + "\n")
        except OSError as exc:
            log.warning("tuner.shadow.log_file %s: %s", path, exc.strerror or exc)

    return write


__all__ = ["RunningFile", "ShadowActuator", "add_shadow_log", "open_acceptance", "shadow_actuator"]
