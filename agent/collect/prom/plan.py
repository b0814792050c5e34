"""`source: prometheus`, server-side aggregation: the mapping files compiled into PromQL that
gives the normalised signals themselves, one small series per pod, model (and `le`) and rule.
Pure functions, no I/O (prom/source.py sends the queries, prom/table.py reads the answers).

For every rule of every mapping a role group can hold (frame.plan), and every part of it
(a counter or gauge value; a histogram's `_bucket`, `_sum` and `_count`), one expression:

    sum by (<pod>, <namespace>, instance, job, <model labels>[, le]) (SEL)

where SEL is the rule's series: its wire name (with the mapping's prefix aliases), its `where`
label filter, `<reject label>=""` for each reject label, and the group's selector. This is what
`normalise.py` computes per pod from a scraped payload (filter, group by model, aggregate the
other labels away: the data-parallel `engine` above all), moved into the query engine, so the
answer holds only what the tier model needs and the agent never builds a Python object per raw
series. The aggregation follows the rule: `sum`; `max` (with `0 * sum` added, so a NaN or Inf
series still shows as NaN); `mean` as a `sum` and a `count` part, divided by the agent (exact
when one pod's series span several model labels). Rules whose value comes from a label
(`value_from_label`, vLLM's `cache_config_info`) are read raw: one series per engine.

Only lifetime values are read: the window store differences them between cycles, exactly as it
does for a direct scrape (an `increase()` would read every series' samples over the whole window
again on every cycle, three selections per series with series born inside the window counted).
An aggregated value that is NaN or +-Inf means a raw series of that pod is invalid: the agent then
reads that pod the exact way (raw series through normalise.py), so its anomaly is counted and
its valid series kept, as with a direct scrape.
"""
from __future__ import annotations

from dataclasses import dataclass

from agent.collect.mapping import Mapping, MappingSet, MetricRule
from agent.collect.prom.frame import Labelling, RoleGroup
from contracts.tier_model import ROLES, Role

PARTS = ("value", "bucket", "sum", "count", "mean_sum", "mean_count", "raw")


@dataclass(frozen=True, slots=True)
class Part:
    """One expression of one rule: what it reads and what the agent makes of its answer."""

    qid: int
    mapping: Mapping
    rule: MetricRule
    part: str  # one of PARTS
    names: tuple[str, ...]  # wire names it selects
    query: str  # PromQL of the lifetime value (a gauge's current value)

    @property
    def signal(self) -> str:
        suffix = {"sum": ":sum", "count": ":count"}.get(self.part, "")
        return self.rule.signal + suffix

    @property
    def kind(self) -> str:
        return "gauge" if self.rule.type == "gauge" else "counter"

    @property
    def roles(self) -> frozenset[str]:
        return frozenset(self.mapping.roles)


def quote(value: str) -> str:
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n") + '"'


def _selector(names: tuple[str, ...], rule: MetricRule, mapping: Mapping, group: RoleGroup) -> str:
    matchers = [f"{k}={quote(v)}" for k, v in sorted(rule.where.items())]
    matchers += [f'{label}=""' for label in mapping.reject_labels]
    if group.selector:
        matchers.append(group.selector)
    if len(names) == 1:
        return f"{names[0]}{{{','.join(matchers)}}}"
    regex = "|".join(names)  # wire names are [a-zA-Z0-9_:] only: nothing to escape
    return f"{{{','.join([f'__name__=~{quote(regex)}', *matchers])}}}"


def by_labels(lab: Labelling, mapping: Mapping, bucket: bool, role_known: bool = False) -> tuple[str, ...]:
    """What a rule's series are grouped by: the target (pod, namespace, instance; `job` too
    when it may name the role), the mapping's model labels, and `le` for buckets."""
    out: list[str] = []
    for label in (lab.pod_label, lab.namespace_label, "instance", *(() if role_known else ("job",)),
                  *mapping.model_labels,
                  *(("le",) if bucket else ())):
        if label not in out:
            out.append(label)
    return tuple(out)


def _parts_of(rule: MetricRule, mapping: Mapping, base_names: tuple[str, ...]) -> list[tuple[str, tuple[str, ...]]]:
    if rule.type == "histogram":
        parts = [("bucket", "_bucket")] if rule.buckets else []
        parts += [("sum", "_sum"), ("count", "_count")]
        return [(p, tuple(n + sfx for n in base_names)) for p, sfx in parts]
    if rule.value_from_label is not None:
        return [("raw", base_names)]
    if rule.aggregation == "mean":
        return [("mean_sum", base_names), ("mean_count", base_names)]
    return [("value", base_names)]


def compile_group(group: RoleGroup, mappings: MappingSet, lab: Labelling,
                  present: frozenset[str] | None = None) -> tuple[Part, ...]:
    """Every part of every rule the group's mappings hold, as PromQL. `present`: the wire names
    that exist (rules reading none of them are left out)."""
    maps = mappings.mappings if group.role is None else mappings.by_role.get(group.role, ())
    out: list[Part] = []
    for mapping in maps:
        for rule in mapping.metrics:
            base_names, wire = mappings.rule_names[id(rule)]
            if present is not None and wire.isdisjoint(present):
                continue
            for part, names in _parts_of(rule, mapping, base_names):
                if present is not None:
                    names = tuple(n for n in names if n in present) or names
                sel = _selector(names, rule, mapping, group)
                by = ", ".join(by_labels(lab, mapping, part == "bucket", group.role is not None))
                if part == "raw":
                    query = sel
                elif part == "mean_count":
                    query = f"count by ({by}) ({sel})"
                elif rule.aggregation == "max" and part != "count":
                    query = f"max by ({by}) ({sel}) + 0 * sum by ({by}) ({sel})"
                else:
                    query = f"sum by ({by}) ({sel})"
                out.append(Part(len(out), mapping, rule, part, names, query))
    return tuple(out)


def decode_labels(lab: Labelling, mappings: MappingSet) -> tuple[str, ...]:
    """Every label an answer can carry that the agent reads."""
    out: list[str] = []
    extra = [lbl for m in mappings.mappings for lbl in m.model_labels]
    extra += [r.value_from_label for m in mappings.mappings for r in m.metrics if r.value_from_label]
    for label in (lab.pod_label, lab.namespace_label, "instance", "job", "le", *extra):
        if label not in out:
            out.append(label)
    return tuple(out)


def default_role(part: Part, roles_by_name: dict[str, Role]) -> Role | None:
    """The role a series of this part has when the group has no role and `job` names none: the
    role the part's wire names identify (frame.name_roles), else its mapping's first."""
    return next((roles_by_name[n] for n in part.names if n in roles_by_name),
                next((r for r in ROLES if r in part.mapping.roles), None))


__all__ = ["PARTS", "Part", "by_labels", "compile_group", "decode_labels", "default_role", "quote"]
