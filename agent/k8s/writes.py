"""Reading and writing one target's objects for the actuator (actuator.py): a read that knows
what the container's environment holds (envsources.py), a patch sent with backoff, re-read and
re-planned on a conflict, the restart workloads rolled after a file change, and a partial change
put back."""
from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable, Mapping
from typing import Any

from agent.k8s import envsources
from agent.k8s.api import ConflictError, KubeApi, ObjectRef
from agent.k8s.backoff import Backoff
from agent.k8s.metrics import ActuationMetrics
from agent.k8s.patches import (
    CONFIG_HASH_ANNOTATION,
    Patch,
    json_patch,
    op_remove,
    op_test,
    pointer,
    template_annotations_patch,
)
from agent.k8s.settings import ActuationSettings
from agent.k8s.targets import ENV_OF_FIELD, Target, workload_hash
from contracts.actuator import ActuationError, RetriableActuationError, TargetGoneError
from contracts.knobs import Knobs

log = logging.getLogger("tierpilot.k8s")


@dataclasses.dataclass(frozen=True)
class Written:
    """A target as it was before this change: enough to put it back exactly."""

    target: Target
    tokens: Mapping[str, str | None]
    restart: Mapping[str, str | None]


class Writer:
    """The actuator's reads and writes of target objects (one per actuator)."""

    def __init__(self, api: KubeApi, settings: ActuationSettings, metrics: ActuationMetrics, backoff: Backoff,
                 on_gone: Callable[[Target], None]) -> None:
        self.api, self.settings, self.metrics, self.backoff, self.on_gone = api, settings, metrics, backoff, on_gone

    def read(self, ref: ObjectRef, t: Target) -> dict[str, Any]:
        try:
            obj = self.api.read(ref)
            return self.with_env(t, obj) if ref == t.ref else obj
        except TargetGoneError:
            self.on_gone(t)
            raise
        except RetriableActuationError as exc:
            raise RetriableActuationError(str(exc), delay_s=self.backoff.next_delay()) from None

    def with_env(self, t: Target, obj: dict[str, Any]) -> dict[str, Any]:
        """The target's object with what the environment of the containers it configures holds:
        its own container (env-store kinds), or those of its restart workloads, whose variables
        override the file (`overridden_by_env`, targets.ENV_OF_FIELD)."""
        if t.mapping.store == "env":
            return envsources.with_env(self.api.read, obj, t.spec.container, t.keys)
        if not t.mapping.overridden_by_env:
            return obj
        env_of = {str(r): envsources.workload_env(self.api.read, self.read(r, t), t.env_names)
                  for r in t.restart_refs}
        return {**obj, ENV_OF_FIELD: env_of}

    def send(self, t: Target, ref: ObjectRef, patch: Patch, dry: bool) -> dict[str, Any]:
        try:
            out = self.api.patch(ref, patch, dry_run=dry)
        except TargetGoneError:
            if ref == t.ref:
                self.on_gone(t)
            raise
        except ConflictError:
            raise
        except RetriableActuationError as exc:
            raise RetriableActuationError(str(exc), delay_s=self.backoff.next_delay()) from None
        self.backoff.reset()
        return out

    def write(self, t: Target, ref: ObjectRef, make: Callable[[dict[str, Any]], Patch], dry: bool
               ) -> tuple[dict[str, Any], Patch]:
        """Read, plan, send; on a conflict (409 / failed test) re-read and re-plan, bounded."""
        for attempt in range(self.settings.conflict_retries + 1):
            obj = self.read(ref, t)
            patch = make(obj)
            if patch.empty:
                return obj, patch
            try:
                self.send(t, ref, patch, dry)
                return obj, patch
            except ConflictError as exc:
                self.metrics.result(t.label, "apply", "conflict_retried")
                log.info("%s: %s; re-reading (attempt %d)", ref, exc, attempt + 1)
        raise RetriableActuationError(f"{ref}: still conflicting after {self.settings.conflict_retries} re-reads",
                                      delay_s=self.backoff.next_delay())

    def write_target(self, t: Target, knobs: Knobs | None, dry: bool, reason: str,
                      tokens: Mapping[str, str | None] | None = None,
                      restart: Mapping[str, str | None] | None = None) -> Written | None:
        """Write `knobs` (or exact `tokens`) to one target, then roll its restart workloads."""
        planned: dict[str, Any] = {}

        def make(obj: dict[str, Any]) -> Patch:
            want = dict(tokens) if tokens is not None else t.tokens_for(knobs, obj)  # type: ignore[arg-type]
            if t.mapping.requires and want != t.read_tokens(obj):
                t.check_preconditions(obj)
            planned.update(obj=obj, tokens=want)
            return t.plan(obj, want, reason)

        obj, patch = self.write(t, t.ref, make, dry)
        before = Written(t, t.read_tokens(obj), {})
        restart_before: dict[str, str | None] = {}
        refs = t.restart_refs if restart is not None or patch.empty else t.restart_refs_for(obj, planned["tokens"])
        for ref in refs:
            if restart is not None and ref.name not in restart:
                continue  # this write did not roll it (a hot-reload change)
            value = restart[ref.name] if restart is not None else (
                None if patch.empty else t.config_hash(planned["obj"], planned["tokens"]))
            if restart is None and patch.empty:
                continue
            wobj, _wpatch = self.write(t, ref, lambda w, v=value: restart_patch(w, v), dry)
            restart_before[ref.name] = workload_hash(wobj)
        if patch.empty and not restart_before:
            return None
        return dataclasses.replace(before, restart=restart_before)

    def put_back(self, written: list[Written]) -> None:
        for w in reversed(written):
            try:
                self.write_target(w.target, None, False, "undo partial change", w.tokens, w.restart)
            except ActuationError as exc:
                log.error("%s: could not undo a partial change: %s", w.target.where, exc)

    def restarting(self, written: list[Written]) -> tuple[str, ...]:
        out: list[str] = []
        for w in written:
            for ref in rolled(w):
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


def rolled(w: Written) -> tuple[ObjectRef, ...]:
    """What shows a write took effect: the target's rollout refs, or for a hot-reload target the
    restart workloads this write actually rolled (a switch to or from a restart-only value)."""
    refs = w.target.rollout_refs
    if w.target.mapping.takes_effect == "hot-reload":
        refs = tuple(r for r in w.target.restart_refs if r.name in w.restart)
    return refs


def restart_patch(workload: Mapping[str, Any], value: str | None) -> Patch:
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
