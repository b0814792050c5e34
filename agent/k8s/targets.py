"""One configured target: its owned settings, and the pure logic that reads knobs from its live
object and plans patches against it. No I/O here; `actuator.py` does the reads and sends."""
from __future__ import annotations

import dataclasses
import hashlib
from collections.abc import Mapping
from typing import Any

import yaml

from agent.k8s import stores, textconf
from agent.k8s.api import ObjectRef
from agent.k8s.envsources import EnvValue
from agent.k8s.mapping import KindMapping, RefusedValue, Setting
from agent.k8s.patches import CONFIG_HASH_ANNOTATION, Patch, resolve
from agent.k8s.settings import ActuationSettings, TargetSpec
from contracts.actuator import PermanentActuationError, RefusedConfigError
from contracts.knobs import Knobs

SESSION_KEY = "session_key"
# The actuator attaches to an `overridden_by_env` target's object what the containers of its restart
# workloads set: {workload: {container: {variable: envsources.EnvValue}}} (envsources.workload_env).
ENV_OF_FIELD = "x-tierpilot-restart-env"


@dataclasses.dataclass(frozen=True)
class Target:
    spec: TargetSpec
    mapping: KindMapping
    namespace: str

    @classmethod
    def build(cls, spec: TargetSpec, mappings: Mapping[str, KindMapping], settings: ActuationSettings) -> Target:
        return cls(spec=spec, mapping=mappings[spec.kind], namespace=settings.ns(spec))

    # -- identity --
    @property
    def ref(self) -> ObjectRef:
        return ObjectRef(self.mapping.resource, self.namespace, self.spec.name)

    @property
    def label(self) -> str:
        """A short stable id, used as the `target` metric label."""
        return f"{self.spec.kind}/{self.namespace}/{self.spec.name}"

    @property
    def where(self) -> str:
        extra = f" container {self.spec.container}" if self.spec.container else ""
        extra += f" key {self.spec.key}" if self.spec.key else ""
        return f"{self.ref}{extra}"

    @property
    def settings(self) -> tuple[Setting, ...]:
        owned = self.spec.knobs
        return tuple(s for s in self.mapping.settings if owned is None or s.knob in owned)

    @property
    def knobs(self) -> tuple[str, ...]:
        return tuple(s.knob for s in self.settings)

    @property
    def keys(self) -> list[str]:
        keys = [s.key for s in self.settings]
        if self.mapping.store == "router-config" and self.spec.session_key:
            keys.append(SESSION_KEY)
        return keys

    @property
    def restart_refs(self) -> tuple[ObjectRef, ...]:
        return tuple(ObjectRef(w.kind, self.namespace, w.name) for w in self.spec.restart)

    @property
    def rollout_refs(self) -> tuple[ObjectRef, ...]:
        """Objects whose rollout shows the change took effect."""
        effect = self.mapping.takes_effect
        if effect in ("rollout", "operator"):
            return (self.ref,)
        if effect == "restart-workloads":
            return self.restart_refs
        return ()  # hot-reload: only the workloads a change actually rolled (see restart_needed)

    # -- reading --
    def read_tokens(self, obj: Mapping[str, Any]) -> dict[str, str | None]:
        try:
            return stores.read_tokens(self.mapping.store, obj, self.keys, container=self.spec.container,
                                      data_key=self.spec.key, where=self.where)
        except stores.StoreError as exc:
            raise PermanentActuationError(str(exc)) from None

    def _text(self, obj: Mapping[str, Any]) -> str:
        return stores.file_text(obj, self.spec.key) if self.spec.key else ""

    def knob_values(self, obj: Mapping[str, Any]) -> dict[str, Any]:
        """The knob values the live object expresses (absent settings read as the component default)."""
        tokens = self.read_tokens(obj)
        text = self._text(obj)
        env = self.env_in_force(obj)
        out: dict[str, Any] = {}
        for s in self.settings:
            tok = tokens[s.key]
            if s.key in env:  # what runs is the variable LMCache applies over the file
                out[s.knob] = s.from_component(self._env_component(s, env[s.key]))
                continue
            override = self._override(s, obj)
            if override is None and tok is None and s.default is None:
                continue  # absent and no known default (e.g. LMCache MP --l1-size-gb): not read here
            try:
                if override is not None:  # what runs is the overriding flag's value, in knob units
                    value = s.from_component(float(override) * (s.scale or 1))
                else:
                    value = s.default if tok is None else s.from_component(
                        stores.decode(self.mapping.store, tok, text=text))
            except (ValueError, TypeError) as exc:
                raise PermanentActuationError(f"{self.where}: cannot read {s.knob}: {exc}") from None
            out[s.knob] = value
        for coupled, driver in self.coupled(obj).items():
            if driver in out:
                out[coupled] = out[driver]
        return out

    def coupled(self, obj: Mapping[str, Any]) -> dict[str, str]:
        """{coupled knob: the owned knob that drives it} in force on the live object, e.g. LMCache's
        cache_policy drives l2_eviction too while a local-disk backend (`local_disk`) is set."""
        if not self.mapping.couples:
            return {}
        try:
            found = stores.read_tokens(self.mapping.store, obj, list(self.mapping.couples),
                                       container=self.spec.container, data_key=self.spec.key, where=self.where)
        except stores.StoreError as exc:
            raise PermanentActuationError(str(exc)) from None
        out: dict[str, str] = {}
        for key, pairs in self.mapping.couples.items():
            tok = found.get(key)
            if tok is None or tok.strip().strip("'\"").lower() in ("", "null", "none", "~", "false"):
                continue
            out.update({c: d for c, d in pairs.items() if d in self.knobs})
        return out

    @property
    def env_names(self) -> list[str]:
        """The container variables that override this target's settings (LMCACHE_<KEY>), if any."""
        prefix = self.mapping.overridden_by_env
        return [prefix + s.key.upper() for s in self.settings] if prefix else []

    def env_overrides(self, obj: Mapping[str, Any], tokens: Mapping[str, str | None],
                      env_of: Mapping[str, Mapping[str, Mapping[str, EnvValue]]]) -> list[str]:
        """Settings this write changes that a container variable of a restart workload overrides
        (LMCache applies LMCACHE_<KEY> after the file), as readable messages. `env_of`: {workload:
        {container: what sets each variable}} (envsources.workload_env: env, valueFrom, envFrom; a
        source the agent could not read fails closed)."""
        prefix = self.mapping.overridden_by_env
        if not prefix:
            return []
        live = self.read_tokens(obj)
        problems = []
        for s in self.settings:
            if tokens.get(s.key, live[s.key]) == live[s.key]:
                continue
            var = prefix + s.key.upper()
            for name, containers in env_of.items():
                for cname, found in containers.items():
                    v = found.get(var)
                    if v is None:
                        continue
                    if v.origin == "env" or "(valueFrom" in v.origin:
                        how = "sets " + var + ("" if v.origin == "env" else f" from {v.origin}")
                    else:
                        verb = "takes" if v.certain else "may take"
                        origin = v.origin if v.certain else f"{v.origin.removesuffix(')')}; {v.why})"
                        how = f"{verb} {var} from {origin}"
                    problems.append(f"{s.knob} ({s.key}): container {cname} of {name} {how}, which overrides "
                                    f"the config file")
        return problems

    def env_in_force(self, obj: Mapping[str, Any]) -> dict[str, str]:
        """{setting key: the LMCACHE_<KEY> value the restart workloads run instead of the file's},
        from what the actuator attached (ENV_OF_FIELD: {workload: {container: variables}}). What
        runs must be one known value: a variable whose value cannot be known, or workloads that
        run different values, raise (never a guess)."""
        env_of = obj.get(ENV_OF_FIELD)
        if not env_of:
            return {}
        out: dict[str, str] = {}
        for s in self.settings:
            var = self.mapping.overridden_by_env + s.key.upper()
            runs: dict[str, str | None] = {}  # workload -> its value (None: the file's)
            for wl, containers in env_of.items():
                values: set[str] = set()
                for cname, found in containers.items():
                    v = found.get(var)
                    if v is not None and v.value is None:
                        raise PermanentActuationError(
                            f"{self.where}: cannot tell what runs for {s.knob} ({s.key}): container {cname} of {wl} "
                            f"{'takes' if v.certain else 'may take'} {var} from {v.origin}, and the agent cannot "
                            f"know its value: {v.why}; set {var} in a ConfigMap or in env, or leave {s.knob} out of "
                            f"this target's knobs")
                    values |= {v.value} if v is not None and v.value is not None else set()
                if len(values) > 1:
                    raise PermanentActuationError(f"{self.where}: the containers of {wl} set {var} to different "
                                                  f"values ({', '.join(sorted(values))})")
                runs[wl] = next(iter(values), None)
            if set(runs.values()) - {None}:
                if len(set(runs.values())) > 1:
                    raise PermanentActuationError(
                        f"{self.where}: the restart workloads run different {s.key}: " + ", ".join(
                            f"{wl} {var}={v}" if v is not None else f"{wl} the file's" for wl, v in runs.items()))
                out[s.key] = next(v for v in runs.values() if v is not None)
        return out

    def _env_component(self, s: Setting, value: str) -> Any:
        """The component value of an overriding variable (read as LMCache reads its env: a scalar)."""
        try:
            parsed = textconf.yaml_value(value)
            s.from_component(parsed)
            return parsed
        except (ValueError, TypeError, yaml.YAMLError) as exc:
            raise PermanentActuationError(f"{self.where}: cannot read {s.knob} from "
                                          f"{self.mapping.overridden_by_env}{s.key.upper()}={value!r}: {exc}") from None

    # -- planning --
    def check_preconditions(self, obj: Mapping[str, Any]) -> None:
        for ptr, expected in self.mapping.requires.items():
            actual = resolve(obj, ptr, None)
            if actual != expected:
                raise RefusedConfigError(
                    f"{self.where}: refusing to change {', '.join(self.knobs)}: {ptr} is {actual!r}, "
                    f"needs {expected!r} (InferenceEndpointConfig: intelligentRoutingSpec cannot be added "
                    f"to an existing deployment and `enabled` cannot be modified once set)"
                )

    def tokens_for(self, knobs: Knobs, obj: Mapping[str, Any]) -> dict[str, str | None]:
        """Tokens that express `knobs`; a live token meaning the same value is kept as is."""
        live = self.read_tokens(obj)
        text = self._text(obj)
        store = self.mapping.store
        env = self.env_in_force(obj)
        out: dict[str, str | None] = {}
        for coupled, driver in self.coupled(obj).items():
            if getattr(knobs, coupled) != getattr(knobs, driver):
                raise RefusedConfigError(
                    f"{self.where}: {driver}={getattr(knobs, driver)!r} and {coupled}={getattr(knobs, coupled)!r} are "
                    f"one setting here: LMCache's cache_policy drives the CPU tier and its local-disk backend "
                    f"(lmcache/v1/storage_backend/local_disk_backend.py); ask for the same policy for both")
        for s in self.settings:
            try:
                component = s.to_component(getattr(knobs, s.knob))
            except RefusedValue as exc:
                raise RefusedConfigError(f"{self.where}: {exc}") from None
            if s.multiple_of is not None:
                self._check_multiple(s, component, obj)
            if s.key in env and s.same(self._env_component(s, env[s.key]), component):
                out[s.key] = live[s.key]  # the variable already runs it: the file is not written
                continue
            override = self._override(s, obj)
            if override is not None:
                if s.same(float(override) * (s.scale or 1), component):
                    out[s.key] = live[s.key]  # already what runs: nothing to write
                    continue
                raise RefusedConfigError(
                    f"{self.where}: {s.knob}={getattr(knobs, s.knob)!r}: {s.overridden_by} {override} is set and "
                    f"vLLM writes it over {s.key} (vllm/config/vllm.py, _post_init_kv_transfer_config); remove "
                    f"the flag, or manage {s.knob} with a vllm-offload-args target")
            tok = live[s.key]
            if tok is None and s.default is not None and s.same(s.to_component(s.default), component):
                out[s.key] = None  # absent already means this value: do not write the default
                continue
            if tok is not None:
                try:
                    if s.same(stores.decode(store, tok, text=text), component):
                        out[s.key] = tok
                        continue
                except (ValueError, TypeError):
                    pass
            out[s.key] = stores.encode(store, component, text=text)
        if store == "router-config":
            out.update(self._session_tokens(knobs, live, text))
        return out

    def _override(self, s: Setting, obj: Mapping[str, Any]) -> str | None:
        """The token of the key that wins over `s` when set (vLLM's --kv-offloading-size), or None."""
        if s.overridden_by is None:
            return None
        try:
            return stores.read_tokens(self.mapping.store, obj, [s.overridden_by], container=self.spec.container,
                                      data_key=self.spec.key, where=self.where)[s.overridden_by]
        except stores.StoreError as exc:
            raise PermanentActuationError(str(exc)) from None

    def _check_multiple(self, s: Setting, component: int, obj: Mapping[str, Any]) -> None:
        """vLLM's offload `block_size` must be a multiple of the engine's `--block-size`; without
        that flag the engine's block size is its platform's choice, unknown here: refused."""
        try:
            tok = stores.read_tokens(self.mapping.store, obj, [s.multiple_of], container=self.spec.container,
                                     data_key=self.spec.key, where=self.where)[s.multiple_of]  # type: ignore[list-item]
        except stores.StoreError as exc:
            raise PermanentActuationError(str(exc)) from None
        if tok is None:
            raise RefusedConfigError(f"{self.where}: {s.knob}={component} needs {s.multiple_of} set explicitly (the "
                                     f"value must be a multiple of it, and the engine's default is not known here)")
        try:
            base = int(tok)
        except ValueError:
            raise PermanentActuationError(f"{self.where}: {s.multiple_of}={tok!r} is not an integer") from None
        if base <= 0 or component % base:
            raise RefusedConfigError(f"{self.where}: {s.knob}={component} cannot be expressed as {s.key}: it must "
                                     f"be a multiple of {s.multiple_of} {base}")

    def _session_tokens(self, knobs: Knobs, live: Mapping[str, str | None], text: str) -> dict[str, str | None]:
        if knobs.router != "session" or "router" not in self.knobs:
            return {}
        if self.spec.session_key:
            return {SESSION_KEY: stores.encode(self.mapping.store, self.spec.session_key, text=text)}
        if stores.text_get(self.mapping.store, text, SESSION_KEY) is None:
            raise RefusedConfigError(
                f"{self.where}: routing_logic=session needs session_key in the dynamic config; "
                f"set `session_key` on this target"
            )
        return {}

    def restart_needed(self, obj: Mapping[str, Any], tokens: Mapping[str, str | None]) -> bool:
        """Whether writing `tokens` needs the `restart` workloads rolled: always for kinds read at
        start, and for a hot-reload kind when a value in a setting's `restart_values` is entered or
        left (production-stack's watcher cannot build a kvaware router)."""
        if self.mapping.takes_effect == "restart-workloads":
            return True
        if self.mapping.takes_effect != "hot-reload":
            return False
        live, text = self.read_tokens(obj), self._text(obj)
        for s in self.settings:
            if not s.restart_values or tokens.get(s.key, live[s.key]) == live[s.key]:
                continue
            before = s.default if live[s.key] is None else self._knob_of(s, live[s.key], text)
            after = s.default if tokens[s.key] is None else self._knob_of(s, tokens[s.key], text)
            if before != after and (before in s.restart_values or after in s.restart_values):
                return True
        return False

    def _knob_of(self, s: Setting, token: str, text: str) -> Any:
        try:
            return s.from_component(stores.decode(self.mapping.store, token, text=text))
        except (ValueError, TypeError):
            return None

    def restart_refs_for(self, obj: Mapping[str, Any], tokens: Mapping[str, str | None]) -> tuple[ObjectRef, ...]:
        return self.restart_refs if self.restart_needed(obj, tokens) else ()

    def plan(self, obj: Mapping[str, Any], tokens: Mapping[str, str | None], reason: str) -> Patch:
        if self.mapping.takes_effect == "hot-reload" and not self.restart_refs and self.restart_needed(obj, tokens):
            values = sorted({v for s in self.settings for v in s.restart_values})
            raise RefusedConfigError(
                f"{self.where}: changing to or from {', '.join(values)} cannot be hot-reloaded (production-stack's "
                f"dynamic-config watcher rebuilds the router with only session_key: "
                f"src/vllm_router/routers/routing_logic.py); name the router Deployment in this target's `restart`")
        for ptr in self.mapping.immutable:
            if any(key == ptr or key.startswith(ptr + "/") for key in tokens):
                raise RefusedConfigError(f"{self.where}: {ptr} cannot be updated; refusing to write it")
        try:
            return stores.plan_tokens(self.mapping.store, obj, tokens, container=self.spec.container,
                                      data_key=self.spec.key, where=self.where, reason=reason)
        except stores.StoreError as exc:
            raise PermanentActuationError(str(exc)) from None

    def config_hash(self, obj: Mapping[str, Any], tokens: Mapping[str, str | None]) -> str:
        """The pod-template annotation that rolls the restart workloads after a file change."""
        text = stores.text_set(self.mapping.store, self._text(obj), tokens) if self.spec.key else ""
        return hashlib.sha256(text.encode()).hexdigest()[:16]

    def drifted(self, obj: Mapping[str, Any], desired: Mapping[str, Any]) -> list[str]:
        """Knobs whose live value differs from `desired` (e.g. reverted by an operator)."""
        live = self.knob_values(obj)
        return sorted(k for k, v in desired.items() if k in live and live[k] != v)


def workload_hash(obj: Mapping[str, Any]) -> str | None:
    return resolve(obj, "/spec/template/metadata/annotations", {}).get(CONFIG_HASH_ANNOTATION)
