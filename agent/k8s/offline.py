"""What a targets file accepts, worked out offline (no cluster): pure functions over the actuator's
settings and the knob mapping, the same mapping the actuator writes with.

- `acceptance(settings, mappings)`: per owned knob, the values every owning target can express
  (enums: the mapping's `values`; numbers: any), and the value of each knob no target owns.
  `tierpilot tune --targets F` searches only inside it.
- `refusals(settings, mappings, knobs)`: every reason the actuator would refuse `knobs`, one line
  each, naming the target and the setting. `tierpilot k8s check --targets F --config best.yaml`
  prints them.
"""
from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from agent.k8s.mapping import KindMapping, RefusedValue
from agent.k8s.settings import ActuationSettings, TargetSpec
from contracts.knobs import DEFAULT_KNOBS, Knobs
from tuners.space import TargetAcceptance


def _owned(spec: TargetSpec, mapping: KindMapping) -> tuple[str, ...]:
    return tuple(k for k in mapping.knobs if spec.knobs is None or k in spec.knobs)


def _where(settings: ActuationSettings, spec: TargetSpec) -> str:
    return f"{spec.kind} {settings.ns(spec)}/{spec.name}"


def acceptance(settings: ActuationSettings, mappings: Mapping[str, KindMapping], *,
               source: str = "targets") -> TargetAcceptance:
    """The knobs the targets own with the values they accept, and the fixed value of the rest."""
    accepts: dict[str, tuple[Any, ...] | None] = {}
    above: dict[str, float] = {}
    for spec in settings.targets:
        m = mappings[spec.kind]
        for knob in _owned(spec, m):
            setting = m.setting(knob)
            if setting.above is not None:  # in the knob's unit: the component's bound over its scale
                bound = setting.above / (setting.scale or 1)
                above[knob] = max(above.get(knob, bound), bound)
            values = tuple(setting.values) if setting.type == "enum" and setting.values is not None else None
            if knob not in accepts:
                accepts[knob] = values
            elif values is not None:  # every owner writes the value: each must express it
                prior = accepts[knob]
                accepts[knob] = values if prior is None else tuple(v for v in prior if v in values)
    defaults = DEFAULT_KNOBS.to_dict()
    fixed = {k: settings.fixed_knobs.get(k, v) for k, v in defaults.items() if k not in accepts}
    return TargetAcceptance(accepts, fixed, source, above)


def refusals(settings: ActuationSettings, mappings: Mapping[str, KindMapping], knobs: Knobs) -> list[str]:
    """Why the actuator would refuse `knobs`: a value a target cannot express, or a change to a
    knob no target owns (compared with `fixed_knobs`, else the default). Empty: it would apply."""
    out: list[str] = []
    owned: set[str] = set()
    for spec in settings.targets:
        m = mappings[spec.kind]
        for knob in _owned(spec, m):
            owned.add(knob)
            setting = m.setting(knob)
            try:
                setting.to_component(getattr(knobs, knob))
            except RefusedValue as exc:
                out.append(f"{_where(settings, spec)}: {exc}")
    defaults = DEFAULT_KNOBS.to_dict()
    for knob, value in knobs.to_dict().items():
        if knob in owned:
            continue
        keep = settings.fixed_knobs.get(knob, defaults[knob])
        if value != keep:
            out.append(f"{knob}={value!r}: no target owns {knob}; the cluster keeps {keep!r} "
                       f"(fixed_knobs or the default). Owned knobs: {', '.join(sorted(owned)) or '(none)'}")
    return out
