"""The Kubernetes actuator: `contracts.actuator.Actuator` over Deployments, ConfigMaps and the
HyperPod InferenceEndpointConfig. Thin orchestration; the decisions live in pure modules:
`targets.py` (what to write), `stores.py`/`patches.py` (how), `rollout.py` (when it is done)."""
from __future__ import annotations

import dataclasses
import datetime
import logging
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from agent.k8s import stores
from agent.k8s.api import ConflictError, KubeApi, ObjectRef
from agent.k8s.backoff import Backoff
from agent.k8s.events import EventRecorder
from agent.k8s.mapping import KindMapping, load_mappings
from agent.k8s.metrics import ActuationMetrics
from agent.k8s.patches import (
    CONFIG_HASH_ANNOTATION,
    LAST_GOOD_ANNOTATION,
    Patch,
    annotations_patch,
    json_patch,
    op_remove,
    op_test,
    pointer,
    resolve,
    template_annotations_patch,
)
from agent.k8s.reapply import ReapplyGuard
from agent.k8s.rollout import ASSESSORS, wait_for_rollout
from agent.k8s.settings import ActuationSettings
from agent.k8s.targets import LastGood, Target, envfrom_refs, workload_hash
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


@dataclasses.dataclass(frozen=True)
class _Written:
    """A target as it was before this change: enough to put it back exactly."""

    target: Target
    tokens: Mapping[str, str | None]
    restart: Mapping[str, str | None]


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
        self.gone: set[str] = set()
        self._lock = threading.RLock()
        self._desired: dict[str, Knobs] = {}
        self._memory_last_good: Knobs | None = None
        self._pre_apply: list[_Written] = []
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
                out.update(t.coupled(self._read(t.ref, t)))
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
            for knob, value in t.knob_values(self._read(t.ref, t)).items():
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
                obj = self._read(t.ref, t)
                wanted = {k: getattr(knobs, k) for k in t.knobs}
                live = t.knob_values(obj)
                # the live tokens express it: keep them exactly (a setting absent with no known default,
                # e.g. vLLM's offload block_size, is not read and was never written: its absence is kept)
                if all(live[k] == v for k, v in wanted.items() if k in live):
                    tokens = t.read_tokens(obj)
                    restart = {r.name: workload_hash(self._read(r, t)) for r in t.restart_refs}
                else:
                    tokens = t.tokens_for(knobs, obj)
                    restart = {r.name: t.config_hash(obj, tokens) for r in t.restart_refs}
                record = LastGood(knobs, tokens, restart, stamp, self.settings.identity).to_json()
                self._send(t, t.ref, annotations_patch({LAST_GOOD_ANNOTATION: record}, "mark good"),
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
        return t.drifted(obj, {k: getattr(desired, k) for k in t.knobs})

    def _reapply(self, label: str, drifted: list[str]) -> None:
        with self._lock:
            t, knobs = self._target(label), self._desired[label]
            if self._is_leader is not None and not self._is_leader():
                return
            self._write_target(t, knobs, dry=False, reason="re-apply after revert")
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

    def _read(self, ref: ObjectRef, t: Target) -> dict[str, Any]:
        try:
            obj = self.api.read(ref)
            return self._with_env_from(obj, t) if ref == t.ref and t.mapping.store == "env" else obj
        except TargetGoneError:
            self._mark_gone(t)
            raise
        except RetriableActuationError as exc:
            raise RetriableActuationError(str(exc), delay_s=self.backoff.next_delay()) from None

    def _with_env_from(self, obj: dict[str, Any], t: Target) -> dict[str, Any]:
        """`obj` with the managed variables its container takes through `envFrom` (Kubernetes
        precedence: a later source overrides an earlier one; `env` overrides both, in stores.env_read)."""
        containers = resolve(obj, "/spec/template/spec/containers", []) or []
        chosen = [c for c in containers if t.spec.container in (None, c.get("name"))]
        if len(chosen) != 1 or not chosen[0].get("envFrom"):
            return obj
        ns = str(resolve(obj, "/metadata/namespace", "") or "")
        keys = self._envfrom_keys([{"metadata": {"namespace": ns}, "spec": {"template": {"spec": {
            "containers": chosen}}}}])
        found: dict[str, tuple[str | None, str]] = {}
        for kind, name, prefix, _optional in envfrom_refs(chosen[0]):
            known = keys.get((kind, ns, name))
            data = self._envfrom_data(kind, ns, name) if known else {}
            for var in t.keys:
                if not var.startswith(prefix):
                    continue
                if known is None:
                    found[var] = (None, f"{kind} {ns}/{name}")
                elif var[len(prefix):] in data:
                    found[var] = (str(data[var[len(prefix):]]), f"{kind} {ns}/{name}")
        return {**obj, stores.ENV_FROM_FIELD: found} if found else obj

    def _envfrom_data(self, kind: str, ns: str, name: str) -> Mapping[str, Any]:
        try:
            return self.api.read(ObjectRef(kind, ns, name)).get("data") or {}
        except ActuationError:
            return {}

    def _envfrom_keys(self, workloads: Iterable[Mapping[str, Any]]) -> dict[tuple[str, str, str], frozenset[str] | None]:
        """(kind, namespace, name) -> key names of every ConfigMap the workloads' containers take
        `envFrom`; None where unknown (a Secret: never read; a ConfigMap that cannot be read). An
        optional ConfigMap that does not exist provides nothing."""
        out: dict[tuple[str, str, str], frozenset[str] | None] = {}
        for wl in workloads:
            ns = str(resolve(wl, "/metadata/namespace", "") or "")
            for c in resolve(wl, "/spec/template/spec/containers", []) or []:
                for kind, name, _prefix, optional in envfrom_refs(c):
                    key = (kind, ns, name)
                    if key in out or kind != "ConfigMap":
                        out.setdefault(key, None)
                        continue
                    try:
                        cm = self.api.read(ObjectRef("ConfigMap", ns, name))
                    except TargetGoneError:
                        out[key] = frozenset() if optional else None
                        continue
                    except ActuationError:
                        out[key] = None
                        continue
                    out[key] = frozenset(cm.get("data") or {}) | frozenset(cm.get("binaryData") or {})
        return out

    def _mark_gone(self, t: Target) -> None:
        self.gone.add(t.label)
        self.metrics.gone(t.label)
        self.guard.untrack(t.label)
        log.warning("%s is gone (404): no longer tuned", t.where)

    def _send(self, t: Target, ref: ObjectRef, patch: Patch, dry: bool) -> dict[str, Any]:
        try:
            out = self.api.patch(ref, patch, dry_run=dry)
        except TargetGoneError:
            if ref == t.ref:
                self._mark_gone(t)
            raise
        except ConflictError:
            raise
        except RetriableActuationError as exc:
            raise RetriableActuationError(str(exc), delay_s=self.backoff.next_delay()) from None
        self.backoff.reset()
        return out

    def _write(self, t: Target, ref: ObjectRef, make: Callable[[dict[str, Any]], Patch], dry: bool
               ) -> tuple[dict[str, Any], Patch]:
        """Read, plan, send; on a conflict (409 / failed test) re-read and re-plan, bounded."""
        for attempt in range(self.settings.conflict_retries + 1):
            obj = self._read(ref, t)
            patch = make(obj)
            if patch.empty:
                return obj, patch
            try:
                self._send(t, ref, patch, dry)
                return obj, patch
            except ConflictError as exc:
                self.metrics.result(t.label, "apply", "conflict_retried")
                log.info("%s: %s; re-reading (attempt %d)", ref, exc, attempt + 1)
        raise RetriableActuationError(f"{ref}: still conflicting after {self.settings.conflict_retries} re-reads",
                                      delay_s=self.backoff.next_delay())

    def _write_target(self, t: Target, knobs: Knobs | None, dry: bool, reason: str,
                      tokens: Mapping[str, str | None] | None = None,
                      restart: Mapping[str, str | None] | None = None) -> _Written | None:
        """Write `knobs` (or exact `tokens`) to one target, then roll its restart workloads."""
        planned: dict[str, Any] = {}

        def make(obj: dict[str, Any]) -> Patch:
            want = dict(tokens) if tokens is not None else t.tokens_for(knobs, obj)  # type: ignore[arg-type]
            if t.mapping.requires and want != t.read_tokens(obj):
                t.check_preconditions(obj)
            planned.update(obj=obj, tokens=want)
            return t.plan(obj, want, reason)

        obj, patch = self._write(t, t.ref, make, dry)
        before = _Written(t, t.read_tokens(obj), {})
        restart_before: dict[str, str | None] = {}
        refs = t.restart_refs if restart is not None or patch.empty else t.restart_refs_for(obj, planned["tokens"])
        for ref in refs:
            if restart is not None and ref.name not in restart:
                continue  # this write did not roll it (a hot-reload change)
            value = restart[ref.name] if restart is not None else (
                None if patch.empty else t.config_hash(planned["obj"], planned["tokens"]))
            if restart is None and patch.empty:
                continue
            wobj, _wpatch = self._write(t, ref, lambda w, v=value: _restart_patch(w, v), dry)
            restart_before[ref.name] = workload_hash(wobj)
        if patch.empty and not restart_before:
            return None
        return dataclasses.replace(before, restart=restart_before)

    def _write_all(self, knobs: Knobs, dry: bool, reason: str) -> list[_Written]:
        for t in self.active:  # validate everything before the first write
            obj = self._read(t.ref, t)
            tokens = t.tokens_for(knobs, obj)
            if tokens != t.read_tokens(obj):
                t.check_preconditions(obj)
            if t.mapping.overridden_by_env:
                workloads = {str(r): self._read(r, t) for r in t.restart_refs}
                problems = t.env_overrides(obj, tokens, workloads, self._envfrom_keys(workloads.values()))
                if problems:
                    raise RefusedConfigError(
                        f"{t.where}: refusing a config-file change that environment variables would silently "
                        f"defeat (lmcache/v1/config.py applies LMCACHE_* after the file): {'; '.join(problems)}. "
                        f"Remove the variables, or manage these knobs with a deployment-env target")
            t.plan(obj, tokens, reason)
        written: list[_Written] = []
        try:
            for t in self.active:
                w = self._write_target(t, knobs, dry, reason)
                if w is not None:
                    written.append(w)
        except ActuationError:
            if written and not dry:
                self._put_back(written)
            raise
        return written

    def _put_back(self, written: list[_Written]) -> None:
        for w in reversed(written):
            try:
                self._write_target(w.target, None, False, "undo partial change", w.tokens, w.restart)
            except ActuationError as exc:
                log.error("%s: could not undo a partial change: %s", w.target.where, exc)

    def _last_good_records(self) -> dict[str, LastGood]:
        out: dict[str, LastGood] = {}
        for t in self.active:
            rec = LastGood.from_object(self._read(t.ref, t), where=t.where)
            if rec is None:
                return {}
            out[t.label] = rec
        return out

    def _restore(self, records: dict[str, LastGood], fallback: Knobs | None) -> tuple[list[_Written], Knobs]:
        written: list[_Written] = []
        if records:
            knobs = next(iter(records.values())).knobs
            for t in self.active:
                rec = records[t.label]
                w = self._write_target(t, None, self.settings.dry_run, "rollback to last good",
                                       rec.tokens, {r.name: rec.restart.get(r.name) for r in t.restart_refs})
                written += [w] if w else []
            return written, knobs
        if fallback is not None:
            return self._write_all(fallback, self.settings.dry_run, "rollback to last good"), fallback
        for w in self._pre_apply:  # nothing marked good: put back what ran before the last apply
            x = self._write_target(w.target, None, self.settings.dry_run, "rollback", w.tokens, w.restart)
            written += [x] if x else []
        return written, self.current()

    def _finish(self, operation: str, knobs: Knobs, written: list[_Written],
                changed: dict[str, tuple[object, object]], dry: bool) -> ApplyResult:
        restarted = self._restarting(written)
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

    def _restarting(self, written: list[_Written]) -> tuple[str, ...]:
        out: list[str] = []
        for w in written:
            for ref in _rolled(w):
                if ref.kind not in ("Deployment", "StatefulSet"):
                    out.append(f"{ref.kind.lower()}/{ref.namespace}/{ref.name}")
                    continue
                try:
                    labels = self.api.read(ref).get("spec", {}).get("selector", {}).get("matchLabels") or {}
                    selector = ",".join(f"{k}={v}" for k, v in sorted(labels.items()))
                    pods = self.api.list_pod_names(ref.namespace, selector) if selector else []
                except ActuationError as exc:
                    log.info("cannot list the pods of %s: %s", ref, exc)
                    pods = []
                out += [f"pod/{ref.namespace}/{p}" for p in pods] or [f"{ref.kind.lower()}/{ref.namespace}/{ref.name}"]
        return tuple(dict.fromkeys(out))

    def _wait(self, operation: str, written: list[_Written]) -> None:
        for w in written:
            for ref in _rolled(w):
                start = self._clock()
                state = wait_for_rollout(lambda r=ref, t=w.target: self._read(r, t), ASSESSORS[ref.kind],
                                         timeout_s=self.settings.rollout_timeout_s,
                                         poll_s=self.settings.rollout_poll_s, clock=self._clock,
                                         sleep=self._sleep, on_progress=lambda m, r=ref: self._progress(f"{r}: {m}"))
                if state.done:
                    self.metrics.rollout_seconds(w.target.label, self._clock() - start)
                    continue
                result = "rollout_failed" if state.failed else "rollout_timeout"
                self.metrics.result(w.target.label, operation, result)
                note = self._recover(operation, written)
                raise RolloutTimeoutError(f"{ref}: rollout did not complete: {state.message}; {note}")

    def _recover(self, operation: str, written: list[_Written]) -> str:
        """After a failed rollout: back to last good (or to what ran before this change)."""
        if operation != "apply":
            return "rollback itself did not roll out; left as is for a human"
        try:
            records = self._last_good_records()
            if records or self._memory_last_good is not None or self._load_last_good is not None:
                result = self.rollback()
                return f"rolled back to the last good configuration ({result.message})"
            self._put_back(written)
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


def _rolled(w: _Written) -> tuple[ObjectRef, ...]:
    """What shows a write took effect: the target's rollout refs, or for a hot-reload target the
    restart workloads this write actually rolled (a switch to or from a restart-only value)."""
    refs = w.target.rollout_refs
    if w.target.mapping.takes_effect == "hot-reload":
        refs = tuple(r for r in w.target.restart_refs if r.name in w.restart)
    return refs


def _restart_patch(workload: Mapping[str, Any], value: str | None) -> Patch:
    """Set the config-hash pod-template annotation (strategic merge), or remove it exactly: a JSON
    Patch that also drops the annotations map if it was ours alone (strategic merge would leave {})."""
    current = workload_hash(workload)
    if current == value:
        return Patch("strategic", {}, "restart (unchanged)")
    if value is not None:
        return template_annotations_patch({CONFIG_HASH_ANNOTATION: value}, "roll pods to read the new config")
    annotations = workload["spec"]["template"]["metadata"]["annotations"]
    ptr = "/spec/template/metadata/annotations"
    target = ptr if len(annotations) == 1 else pointer("spec", "template", "metadata", "annotations",
                                                       CONFIG_HASH_ANNOTATION)
    return json_patch([op_test(pointer("spec", "template", "metadata", "annotations", CONFIG_HASH_ANNOTATION),
                               current), op_remove(target)], "restore the pod template")
