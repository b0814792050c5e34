"""The knob -> setting mapping (`mappings.yaml`), loaded once into frozen records.

Pure conversions between a knob value (`contracts.knobs.Knobs`) and the component's own value
(`LRU` for LMCache, `lru` for Curvine, an int of tokens...). The text encoding of that value in
its store (env var, YAML line, TOML line, JSON) is the stores' business (`agent/k8s/stores.py`).
"""
from __future__ import annotations

import dataclasses
import functools
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml

from contracts.knobs import Knobs

MAPPINGS_FILE = Path(__file__).with_name("mappings.yaml")
SETTING_TYPES = ("int", "float", "enum")
STORES = ("env", "args", "args-json", "yaml-lines", "toml-lines", "router-config", "json-pointer")
TAKES_EFFECT = ("rollout", "restart-workloads", "hot-reload", "operator")
RESOURCES = ("Deployment", "StatefulSet", "ConfigMap", "InferenceEndpointConfig")
KNOB_NAMES = tuple(f.name for f in dataclasses.fields(Knobs))


class MappingError(ValueError):
    """mappings.yaml is malformed. The message names the file, kind and key."""


class RefusedValue(ValueError):
    """A knob value the target cannot express (e.g. l2_eviction=s3fifo on Curvine)."""


@dataclasses.dataclass(frozen=True)
class Setting:
    """One knob as one setting of one target kind."""

    knob: str
    key: str
    type: str
    default: Any
    values: Mapping[str, str] | None = None  # knob value -> component spelling (enums)
    restart_values: tuple[str, ...] = ()  # hot-reload kinds: knob values that need a restart to enter or leave
    scale: float | None = None  # component value = knob value x scale (e.g. GiB -> bytes)
    above: float | None = None  # the component refuses values <= this (e.g. a CPU tier of 0 bytes)
    multiple_of: str | None = None  # key of another setting of the same store the value must divide by
    overridden_by: str | None = None  # key of the same store that, when set, wins over this one (in knob units)

    def to_component(self, knob_value: Any) -> Any:
        """The component's value for a knob value; RefusedValue names the supported values."""
        if self.above is not None and knob_value * (self.scale or 1) <= self.above:
            raise RefusedValue(f"{self.knob}={knob_value!r} cannot be expressed as {self.key}: it must be above "
                               f"{self.above:g}")
        if self.scale is not None:
            scaled = knob_value * self.scale
            return round(scaled) if self.type == "int" else float(scaled)
        if self.type == "enum":
            assert self.values is not None
            if knob_value not in self.values:
                raise RefusedValue(
                    f"{self.knob}={knob_value!r} cannot be expressed as {self.key}; "
                    f"supported: {', '.join(self.values)}"
                )
            return self.values[knob_value]
        if self.type == "int":
            return int(knob_value)
        return float(knob_value)

    def from_component(self, value: Any) -> Any:
        """The knob value for a component value (enum match is case-insensitive, as LMCache's)."""
        if self.type == "enum":
            assert self.values is not None
            for knob_value, spelled in self.values.items():
                if str(value).lower() == spelled.lower():
                    return knob_value
            raise ValueError(
                f"{self.key}={value!r} has no {self.knob} equivalent; known: {', '.join(self.values.values())}"
            )
        if isinstance(value, bool):
            raise TypeError(f"{self.key}={value!r} is not a number")
        if self.scale is not None:
            return float(value) / self.scale
        if self.type == "int":
            if isinstance(value, float) and not value.is_integer():
                raise ValueError(f"{self.key}={value!r} is not an integer")
            return int(value)
        return float(value)

    def same(self, a: Any, b: Any) -> bool:
        """Whether two component values mean the same thing ('LRU' == 'lru', 5 == 5.0)."""
        try:
            return self.from_component(a) == self.from_component(b)
        except (ValueError, TypeError):
            return a == b


@dataclasses.dataclass(frozen=True)
class KindMapping:
    kind: str
    description: str
    resource: str
    store: str
    takes_effect: str
    settings: tuple[Setting, ...]
    immutable: tuple[str, ...] = ()
    requires: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    # env-var prefix that overrides this kind's file keys (LMCache: LMCACHE_<KEY> beats the file)
    overridden_by_env: str | None = None
    # setting key whose presence couples knobs: {key: {coupled knob: knob that drives it}}
    couples: Mapping[str, Mapping[str, str]] = dataclasses.field(default_factory=dict)

    @property
    def knobs(self) -> tuple[str, ...]:
        return tuple(s.knob for s in self.settings)

    def setting(self, knob: str) -> Setting:
        for s in self.settings:
            if s.knob == knob:
                return s
        raise KeyError(f"{self.kind} has no setting for knob {knob!r}; it maps: {', '.join(self.knobs)}")


def _fail(src: str, where: str, msg: str) -> MappingError:
    return MappingError(f"{src}: {where}: {msg}")


def _choice(src: str, where: str, value: Any, choices: tuple[str, ...]) -> str:
    if value not in choices:
        raise _fail(src, where, f"invalid value {value!r}; valid choices: {', '.join(choices)}")
    return str(value)


def parse_mappings(data: Any, *, source: str = "mappings.yaml") -> dict[str, KindMapping]:
    if not isinstance(data, Mapping) or not data:
        raise MappingError(f"{source}: expected a mapping of target kinds")
    kinds: dict[str, KindMapping] = {}
    for kind, spec in data.items():
        if not isinstance(spec, Mapping):
            raise _fail(source, kind, "expected a mapping")
        allowed = {"description", "resource", "store", "takes_effect", "settings", "immutable", "requires",
                   "overridden_by_env", "couples"}
        unknown = sorted(set(spec) - allowed)
        if unknown:
            raise _fail(source, kind, f"unknown key(s) {', '.join(unknown)}; valid keys: {', '.join(sorted(allowed))}")
        settings = []
        for i, s in enumerate(spec.get("settings") or []):
            where = f"{kind}.settings[{i}]"
            if not isinstance(s, Mapping):
                raise _fail(source, where, "expected a mapping")
            knob = _choice(source, where + ".knob", s.get("knob"), KNOB_NAMES)
            typ = _choice(source, where + ".type", s.get("type"), SETTING_TYPES)
            if not isinstance(s.get("key"), str) or not s["key"]:
                raise _fail(source, where + ".key", "must be a non-empty string")
            values = s.get("values")
            if typ == "enum":
                if not isinstance(values, Mapping) or not values:
                    raise _fail(source, where + ".values", "an enum needs a mapping knob value -> spelling")
                values = {str(k): str(v) for k, v in values.items()}
                if s.get("default") is not None and s.get("default") not in values:
                    raise _fail(source, where + ".default", f"must be one of {', '.join(values)} or null")
            elif values is not None:
                raise _fail(source, where + ".values", f"only enums take values (type is {typ})")
            restart_values = tuple(str(v) for v in s.get("restart_values") or ())
            bad = [v for v in restart_values if values is None or v not in values]
            if bad:
                raise _fail(source, where + ".restart_values", f"{bad} are not values of this enum")
            settings.append(Setting(knob=knob, key=s["key"], type=typ, default=s.get("default"), values=values,
                                    restart_values=restart_values, **_numeric_rules(source, where, s, typ)))
        if not settings:
            raise _fail(source, kind, "no settings")
        knobs = [s.knob for s in settings]
        if len(set(knobs)) != len(knobs):
            raise _fail(source, kind, "a knob is mapped twice")
        kinds[kind] = KindMapping(
            kind=kind,
            description=" ".join(str(spec.get("description", "")).split()),
            resource=_choice(source, f"{kind}.resource", spec.get("resource"), RESOURCES),
            store=_choice(source, f"{kind}.store", spec.get("store"), STORES),
            takes_effect=_choice(source, f"{kind}.takes_effect", spec.get("takes_effect"), TAKES_EFFECT),
            settings=tuple(settings),
            immutable=tuple(spec.get("immutable") or ()),
            requires=dict(spec.get("requires") or {}),
            overridden_by_env=spec.get("overridden_by_env"),
            couples=_couples(source, kind, spec.get("couples"), knobs),
        )
    return kinds


def _numeric_rules(src: str, where: str, s: Mapping[str, Any], typ: str) -> dict[str, Any]:
    """A setting's optional `scale`, `above`, `multiple_of` and `overridden_by` (numbers only)."""
    out: dict[str, Any] = {}
    for name in ("scale", "above"):
        v = s.get(name)
        if v is None:
            continue
        if typ == "enum" or isinstance(v, bool) or not isinstance(v, (int, float)) or (name == "scale" and v <= 0):
            raise _fail(src, f"{where}.{name}", f"must be a {'positive ' if name == 'scale' else ''}number on an "
                                                 f"int or float setting, got {v!r}")
        out[name] = float(v)
    m = s.get("multiple_of")
    if m is not None:
        if typ != "int" or not isinstance(m, str) or not m:
            raise _fail(src, f"{where}.multiple_of", "must name a key (a flag) and needs type int")
        out["multiple_of"] = m
    o = s.get("overridden_by")
    if o is not None:
        if typ == "enum" or not isinstance(o, str) or not o:
            raise _fail(src, f"{where}.overridden_by", "must name a key (a flag) of a number setting")
        out["overridden_by"] = o
    return out


def _couples(src: str, kind: str, raw: Any, knobs: list[str]) -> dict[str, dict[str, str]]:
    out: dict[str, dict[str, str]] = {}
    for key, pairs in (raw or {}).items():
        if not isinstance(pairs, Mapping):
            raise _fail(src, f"{kind}.couples.{key}", "expected a mapping {coupled knob: driving knob}")
        for coupled, driver in pairs.items():
            _choice(src, f"{kind}.couples.{key}", coupled, KNOB_NAMES)
            if driver not in knobs:
                raise _fail(src, f"{kind}.couples.{key}", f"{driver!r} is not a knob of this kind")
        out[str(key)] = {str(c): str(d) for c, d in pairs.items()}
    return out


def load_mappings(path: str | Path | None = None) -> dict[str, KindMapping]:
    """The mapping file, parsed once per path (the records are frozen; the dict is a fresh copy)."""
    return dict(_load_cached(str(Path(path) if path else MAPPINGS_FILE)))


@functools.lru_cache(maxsize=8)
def _load_cached(path: str) -> dict[str, KindMapping]:
    p = Path(path)
    try:
        data = yaml.safe_load(p.read_text())
    except OSError as exc:
        raise MappingError(f"{p}: cannot read: {exc.strerror or exc}") from None
    except yaml.YAMLError as exc:
        raise MappingError(f"{p}: not valid YAML: {exc}") from None
    return parse_mappings(data, source=str(p))
