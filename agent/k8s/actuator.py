"""The Kubernetes actuator: `contracts.actuator.Actuator` over Deployments, ConfigMaps and the
HyperPod InferenceEndpointConfig. Thin orchestration; the decisions live in pure modules:
`targets.py` (what to write), `stores.py`/`patches.py` (how), `rollout.py` (when it is done),
`envsources.py` (what a container's environment holds); `writes.py` reads and writes the objects."""
from __future__ import annotations

import datetime
import logging
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any

from agent.k8s.api import KubeApi
from agent.k8s.backoff import Backoff
from agent.k8s.events import EventRecorder
from agent.k8s.last_good import LastGood
from agent.k8s.mapping import KindMapping, load_mappings
from agent.k8s.metrics import ActuationMetrics
from agent.k8s.patches import LAST_GOOD_ANNOTATION, annotations_patch
from agent.k8s.reapply import ReapplyGuard
from agent.k8s.rollout import ASSESSORS, wait_for_rollout
from agent.k8s.settings import ActuationSettings
from agent.k8s.targets import ENV_OF_FIELD, Target, workload_hash
from agent.k8s.writes import Writer, Written, rolled
from contracts.actuator import (
    ActuationError,
    ApplyResult,
    PermanentActuationError,
    RefusedConfigError,
    RetriableActuationError,
    RolloutTimeoutError,
    TargetGoneError,
)
from contracts.knobs import DEFAULT_KNOBS, KnobError, Knobs

log = logging.getLogger("tierpilot.k8s")


class KubernetesActuator:
    """Applies knobs to the configured targets, one change at a time (see docs/deploy.md)."""

    def __init__(self, api: KubeApi, settings: ActuationSettings, *,
                 mappings: Mapping[str, KindMapping] | None = None,
                 clock: Callable[[], float] = time.monotonic, sleep: Callable[[float], None] = time.sleep,
                 now: Callable[[], datetime.datetime] = lambda: datetime.datetime.now(datetime.UTC),
                 metrics: ActuationMetrics | None = None, is_leader: Callable[[], bool] | None = None,
                 on_mark_good: Callable[[Knobs, dict[str, str]], None] | None = None,
                 load_last_good: Callable[[], Knobs | None] | None = None,
                 on_progress: Callable[[str], None] | None = None) -> None:
        self.api, self.settings = api, settings
        maps = mappings or load_mappings()
        self.targets = tuple(Target.build(t, maps, settings) for t in settings.targets)
        self._clock, self._sleep, self._now = clock, sleep, now
        self.metrics = metrics or ActuationMetrics()
        self.metrics.dry_run = settings.dry_run
        self._is_leader = is_leader
        self._on_mark_good, self._load_last_good = on_mark_good, load_last_good
        self._progress = on_progress or (lambda msg: log.info("%s", msg))
        self.events = EventRecorder(api.create_event, identity=settings.identity, now=now)
        self.metrics.event_failures = lambda: self.events.failures
        self.backoff = Backoff(settings.backoff_base_s, settings.backoff_max_s)
        self.writer = Writer(api, settings, self.metrics, self.backoff, self._mark_gone)
        self.gone: set[str] = set()
        self._lock = threading.RLock()
        self._desired: dict[str, Knobs] = {}
        self._memory_last_good: Knobs | None = None
        self._pre_apply: list[Written] = []
        self.guard = ReapplyGuard(
            watch=lambda ref, t: api.watch(ref, timeout_s=t), check=self._drift, reapply=self._reapply,
            give_up=self._give_up, limit=settings.reapply_limit, window_s=settings.reapply_window_s,
            watch_timeout_s=settings.watch_timeout_s, clock=clock, sleep=sleep,
            backoff=Backoff(settings.backoff_base_s, settings.backoff_max_s))

    # -- lifecycle ------------------------------------------------------------------------------
    def start(self) -> None:
        """Start watching the objects this actuator changes (the re-apply guard's threads)."""
        self.guard.start()

    def stop(self) -> None:
        self.guard.stop()

    # -- queries --------------------------------------------------------------------------------
    @property
    def active(self) -> tuple[Target, ...]:
        return tuple(t for t in self.targets if t.label not in self.gone)

    def tunable_knobs(self) -> frozenset[str]:
        """Knobs some live target actuates (a knob coupled to an owned one included, e.g.
        l2_eviction under LMCache's cache_policy with a local-disk backend); the tuner should search
        only these."""
        return frozenset(k for t in self.active for k in t.knobs) | frozenset(self.coupled_knobs())

    def coupled_knobs(self) -> dict[str, str]:
        """{coupled knob: the knob that drives it} on the live targets (one dimension for the tuner)."""
        out: dict[str, str] = {}
        for t in self.active:
            if not t.mapping.couples:
                continue
            try:
                out.update(t.coupled(self.writer.read(t.ref, t)))
            except ActuationError as exc:
                log.info("%s: cannot read its couplings: %s", t.where, exc)
        return out

    def accepted_values(self) -> dict[str, tuple[str, ...]]:
        """Per enum knob, the values every target owning it can express (its deployment mode's)."""
        out: dict[str, tuple[str, ...]] = {}
        for t in self.active:
            for s in t.settings:
                if s.values is None:
                    continue
                mine = tuple(s.values)
                out[s.knob] = tuple(v for v in out[s.knob] if v in mine) if s.knob in out else mine
        return out

    def current(self) -> Knobs:
        values = {**DEFAULT_KNOBS.to_dict(), **self.settings.fixed_knobs}
        seen: set[str] = set()
        for t in self.active:
            for knob, value in t.knob_values(self.writer.read(t.ref, t)).items():
                if knob in seen:
                    if values[knob] != value:
                        log.warning("%s: %s=%r disagrees with another target (%r); keeping the first",
                                    t.where, knob, value, values[knob])
                    continue
                values[knob] = value
                seen.add(knob)
        try:
            return Knobs.from_mapping(values, source="live cluster")
        except KnobError as exc:
            raise PermanentActuationError(f"the live settings are not a valid configuration: {exc}") from None

    def last_good(self) -> Knobs | None:
        records = self._last_good_records()
        if records:
            return next(iter(records.values())).knobs
        if self._load_last_good is not None:
            return self._load_last_good()
        return self._memory_last_good

    # -- apply ----------------------------------------------------------------------------------
    def apply(self, knobs: Knobs, *, dry_run: bool = False) -> ApplyResult:
        dry = dry_run or self.settings.dry_run
        with self._lock:
            self._require_leader("apply")
            before = self.current()
            self._check_unowned(knobs, before)
            changed = before.diff(knobs)
            try:
                written = self._write_all(knobs, dry, "apply")
            except ActuationError as exc:
                self._count_failure("apply", exc)
                raise
            return self._finish("apply", knobs, written, changed, dry)

    def rollback(self) -> ApplyResult:
        with self._lock:
            self._require_leader("rollback")
            before = self.current()
            records = self._last_good_records()
            fallback = None if records else self._load_last_good() if self._load_last_good else self._memory_last_good
            if not records and fallback is None and not self._pre_apply:
                raise PermanentActuationError("nothing to roll back to: no configuration was marked good")
            try:
                written, knobs = self._restore(records, fallback)
            except ActuationError as exc:
                self._count_failure("rollback", exc)
                raise
            return self._finish("rollback", knobs, written, before.diff(knobs), self.settings.dry_run)

    def mark_good(self, knobs: Knobs) -> None:
        with self._lock:
            self._require_leader("mark_good")
            stamp = self._now().astimezone(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
            saved: dict[str, str] = {}
            for t in self.active:
                obj = self.writer.read(t.ref, t)
                wanted = {k: getattr(knobs, k) for k in t.knobs}
                live = t.knob_values(obj)
                # the live tokens express it: keep them exactly (a setting absent with no known default,
                # e.g. vLLM's offload block_size, is not read and was never written: its absence is kept)
                if all(live[k] == v for k, v in wanted.items() if k in live):
                    tokens = t.read_tokens(obj)
                    restart = {r.name: workload_hash(self.writer.read(r, t)) for r in t.restart_refs}
                else:
                    tokens = t.tokens_for(knobs, obj)
                    restart = {r.name: t.config_hash(obj, tokens) for r in t.restart_refs}
                record = LastGood(knobs, tokens, restart, stamp, self.settings.identity).to_json()
                self.writer.send(t, t.ref, annotations_patch({LAST_GOOD_ANNOTATION: record}, "mark good"),
                           self.settings.dry_run)
                saved[t.label] = record
            self._memory_last_good = knobs
            if self.settings.dry_run:
                self.metrics.result("*", "mark_good", "dry_run")
            else:
                self.metrics.success("*", "mark_good")
            if self._on_mark_good is not None:
                self._on_mark_good(knobs, saved)

    # -- the guard's callbacks ------------------------------------------------------------------
    def _target(self, label: str) -> Target:
        return next(t for t in self.targets if t.label == label)

    def _drift(self, label: str, obj: dict[str, Any]) -> list[str]:
        desired = self._desired.get(label)
        if desired is None:
            return []
        t = self._target(label)
        return t.drifted(self.writer.with_env(t, obj), {k: getattr(desired, k) for k in t.knobs})

    def _reapply(self, label: str, drifted: list[str]) -> None:
        with self._lock:
            t, knobs = self._target(label), self._desired[label]
            if self._is_leader is not None and not self._is_leader():
                return
            self.writer.write_target(t, knobs, dry=False, reason="re-apply after revert")
            self.metrics.reapplied(label)
            self.metrics.success(label, "reapply")
            self.events.record(t.ref, None, "reapply", f"re-applied {', '.join(drifted)} after a revert")

    def _give_up(self, label: str, drifted: list[str]) -> None:
        t = self._target(label)
        self.metrics.result(label, "reapply", "gave_up")
        self.events.record(t.ref, None, "reapply_gave_up",
                           f"{', '.join(drifted)} reverted again after {self.settings.reapply_limit} re-applies "
                           f"in {self.settings.reapply_window_s:.0f}s; no longer re-applying (another controller "
                           f"owns these settings)")

    # -- internals ------------------------------------------------------------------------------
    def _require_leader(self, operation: str) -> None:
        if self._is_leader is not None and not self._is_leader():
            self.metrics.result("*", operation, "not_leader")
            raise RetriableActuationError(f"{operation}: this replica ({self.settings.identity}) is a standby, "
                                          f"not the leader", delay_s=self.settings.lease.retry_period_s)

    def _check_unowned(self, knobs: Knobs, live: Knobs) -> None:
        owned = self.tunable_knobs()
        for knob, (have, want) in live.diff(knobs).items():
            if knob not in owned:
                raise RefusedConfigError(
                    f"{knob}={want!r}: no configured target actuates {knob} (it stays {have!r}); "
                    f"tunable knobs: {', '.join(sorted(owned)) or '(none)'}")

    def _mark_gone(self, t: Target) -> None:
        self.gone.add(t.label)
        self.metrics.gone(t.label)
        self.guard.untrack(t.label)
        log.warning("%s is gone (404): no longer tuned", t.where)

    def _write_all(self, knobs: Knobs, dry: bool, reason: str) -> list[Written]:
        for t in self.active:  # validate everything before the first write
            obj = self.writer.read(t.ref, t)
            tokens = t.tokens_for(knobs, obj)
            if tokens != t.read_tokens(obj):
                t.check_preconditions(obj)
            if t.mapping.overridden_by_env:
                problems = t.env_overrides(obj, tokens, obj.get(ENV_OF_FIELD) or {})
                if problems:
                    raise RefusedConfigError(
                        f"{t.where}: refusing a config-file change that environment variables would silently "
                        f"defeat (lmcache/v1/config.py applies LMCACHE_* after the file): {'; '.join(problems)}. "
                        f"Remove the variables, or manage these knobs with a deployment-env target")
            t.plan(obj, tokens, reason)
        written: list[Written] = []
        try:
            for i, t in enumerate(self.active):
                w = self.writer.write_target(t, knobs, dry, reason)
                if w is not None:
                    written.append(w)
                    if not dry and i + 1 < len(self.active):
                        # one target's rollout at a time: a fleet split over several Deployments
                        # keeps the others serving while one restarts (patched together, every one
                        # of them restarts at once). A failed rollout is recovered by _wait itself
                        self._wait(reason, written[-1:], recover=written)
        except RolloutTimeoutError:
            raise
        except ActuationError:
            if written and not dry:
                self.writer.put_back(written)
            raise
        return written

    def _last_good_records(self) -> dict[str, LastGood]:
        out: dict[str, LastGood] = {}
        for t in self.active:
            rec = LastGood.from_object(self.writer.read(t.ref, t), where=t.where)
            if rec is None:
                return {}
            out[t.label] = rec
        return out

    def _restore(self, records: dict[str, LastGood], fallback: Knobs | None) -> tuple[list[Written], Knobs]:
        written: list[Written] = []
        if records:
            knobs = next(iter(records.values())).knobs
            for i, t in enumerate(self.active):
                rec = records[t.label]
                w = self.writer.write_target(t, None, self.settings.dry_run, "rollback to last good",
                                       rec.tokens, {r.name: rec.restart.get(r.name) for r in t.restart_refs})
                written += [w] if w else []
                if w and not self.settings.dry_run and i + 1 < len(self.active):
                    self._wait("rollback", [w])  # one target's rollout at a time, as apply
            return written, knobs
        if fallback is not None:
            return self._write_all(fallback, self.settings.dry_run, "rollback to last good"), fallback
        for w in self._pre_apply:  # nothing marked good: put back what ran before the last apply
            x = self.writer.write_target(w.target, None, self.settings.dry_run, "rollback", w.tokens, w.restart)
            written += [x] if x else []
        return written, self.current()

    def _finish(self, operation: str, knobs: Knobs, written: list[Written],
                changed: dict[str, tuple[object, object]], dry: bool) -> ApplyResult:
        restarted = self.writer.restarting(written)
        summary = ", ".join(f"{k}: {a!r} -> {b!r}" for k, (a, b) in changed.items()) or "no knob changed"
        if dry:
            for w in written:
                self.events.record(w.target.ref, None, "dry_run", f"[dry-run] would {operation}: {summary}")
            self.metrics.result("*", operation, "dry_run")
            return ApplyResult(knobs, applied=False, dry_run=True, changed=changed, restarted=restarted,
                               message=f"dry-run: {len(written)} target(s) would change; {summary}")
        if not written:
            self.metrics.result("*", operation, "unchanged")
            self._track(knobs)
            return ApplyResult(knobs, applied=False, changed=changed, message="unchanged: targets already match")
        if operation == "apply":
            self._pre_apply = written
        for w in written:
            self.events.record(w.target.ref, None, "apply" if operation == "apply" else "rollback",
                               f"{operation}: {summary}")
        self._wait(operation, written)
        self._track(knobs)
        for w in written:
            self.metrics.success(w.target.label, operation)
        return ApplyResult(knobs, applied=True, changed=changed, restarted=restarted,
                           message=f"{operation}: {len(written)} target(s) changed; {summary}")

    def _track(self, knobs: Knobs) -> None:
        for t in self.active:
            self._desired[t.label] = knobs
            self.guard.track(t.label, t.ref)

    def _wait(self, operation: str, written: list[Written], recover: list[Written] | None = None) -> None:
        """Wait for each of `written`'s rollouts; a failed one recovers `recover` (default: `written`)."""
        for w in written:
            for ref in rolled(w):
                start = self._clock()
                state = wait_for_rollout(lambda r=ref, t=w.target: self.writer.read(r, t), ASSESSORS[ref.kind],
                                         timeout_s=self.settings.rollout_timeout_s,
                                         poll_s=self.settings.rollout_poll_s, clock=self._clock,
                                         sleep=self._sleep, on_progress=lambda m, r=ref: self._progress(f"{r}: {m}"))
                if state.done:
                    self.metrics.rollout_seconds(w.target.label, self._clock() - start)
                    continue
                result = "rollout_failed" if state.failed else "rollout_timeout"
                self.metrics.result(w.target.label, operation, result)
                note = self._recover(operation, written if recover is None else recover)
                raise RolloutTimeoutError(f"{ref}: rollout did not complete: {state.message}; {note}")

    def _recover(self, operation: str, written: list[Written]) -> str:
        """After a failed rollout: back to last good (or to what ran before this change)."""
        if operation != "apply":
            return "rollback itself did not roll out; left as is for a human"
        try:
            records = self._last_good_records()
            if records or self._memory_last_good is not None or self._load_last_good is not None:
                result = self.rollback()
                return f"rolled back to the last good configuration ({result.message})"
            self.writer.put_back(written)
            for w in written:
                self.events.record(w.target.ref, None, "rollback", "rollout failed: restored the previous settings")
            return "restored the settings from before this change"
        except ActuationError as exc:
            return f"rollback failed too: {exc}"

    def _count_failure(self, operation: str, exc: ActuationError) -> None:
        result = ("workload_gone" if isinstance(exc, TargetGoneError) else
                  "permanent_error" if isinstance(exc, PermanentActuationError) else
                  "rollout_timeout" if isinstance(exc, RolloutTimeoutError) else "retriable_error")
        self.metrics.result("*", operation, result)
