"""The least-privilege Role, derived from the code: every KubeApi method declares its verb and
resource (`@uses`), the target settings name the objects, and the agent's pod discovery
(agent/collect/discovery.py) lists and watches pods. `required_rules` renders the rules a Role needs; the
deploy/ overlays are checked against it (no wildcards, no verb the code never uses, nothing missing).

    python -m agent.k8s.rbac deploy/overlays/plain-vllm/targets.yaml   # prints the Role rules
"""
from __future__ import annotations

import collections
import inspect
import sys
from typing import Any

import yaml

from agent.k8s.api import RESOURCES, TARGETS, ApiCall, KubeApi
from agent.k8s.mapping import load_mappings
from agent.k8s.settings import ActuationSettings, TargetSpec, load_settings
from contracts.knobs import ROUTER_KNOBS

# The agent's pod discovery (agent/collect/discovery.py) lists pods by label selector and then watches them.
DISCOVERY_CALLS = (ApiCall("list", "Pod", named=False), ApiCall("watch", "Pod", named=False))


def api_calls() -> list[ApiCall]:
    """The (verb, resource) declarations of every KubeApi method."""
    return [fn.__api_call__ for _, fn in inspect.getmembers(KubeApi, inspect.isfunction)
            if hasattr(fn, "__api_call__")]


def used_verbs() -> dict[str, set[str]]:
    """resource plural (or TARGETS) -> verbs some code path uses."""
    out: dict[str, set[str]] = collections.defaultdict(set)
    for call in [*api_calls(), *DISCOVERY_CALLS]:
        plural = TARGETS if call.resource == TARGETS else RESOURCES[call.resource].plural
        out[plural].add(call.verb)
    return dict(out)


def writable(spec: TargetSpec, mapping: Any, writes: str) -> bool:
    """Whether the tuner may write this target: `writes` is what it changes without a person
    (tuner.apply: all, hot = only targets that own a router knob, none; shadow mode writes none)."""
    if writes == "all":
        return True
    if writes == "hot":
        owned = spec.knobs if spec.knobs is not None else mapping.knobs
        return bool(set(owned) & ROUTER_KNOBS)
    if writes == "none":
        return False
    raise ValueError(f"writes: {writes!r}; valid: none, hot, all")


def required_rules(settings: ActuationSettings, *, pod_watch: bool = True, writes: str = "all",
                   events: bool = True) -> list[dict[str, Any]]:
    """The Role rules the agent needs in `settings.namespace`, resourceNames wherever possible.
    `pod_watch=False`: no pod discovery for scrape targets (`source: prometheus`), so pods are
    only listed (the KV-event endpoints, the pods a change restarts). `writes` (`writable`): a
    target the tuner may not write is only read (get); its restart workloads are not touched.
    `events=False` (shadow mode): no Events are recorded, and none when no target is writable."""
    mappings = load_mappings()
    target_verbs = sorted(used_verbs()[TARGETS])
    named: dict[tuple[str, str], dict[str, set[str]]] = collections.defaultdict(lambda: collections.defaultdict(set))
    any_writable = False
    for spec in settings.targets:
        if settings.ns(spec) != settings.namespace:
            raise ValueError(f"target {spec.name}: namespace {spec.namespace} differs from {settings.namespace}; "
                             f"one Role per namespace")
        info = RESOURCES[mappings[spec.kind].resource]
        for src in spec.env_sources:  # what the pods take from them is read, never written
            sinfo = RESOURCES[src.kind]
            named[(sinfo.group, sinfo.plural)][src.name].add("get")
        if not writable(spec, mappings[spec.kind], writes):
            named[(info.group, info.plural)][spec.name].add("get")  # what runs now, nothing more
            continue
        any_writable = True
        named[(info.group, info.plural)][spec.name].update(target_verbs)
        for w in spec.restart:  # restart workloads are read and patched, never watched
            winfo = RESOURCES[w.kind]
            named[(winfo.group, winfo.plural)][w.name].update({"get", "patch"})
    rules: list[dict[str, Any]] = []
    for (group, plural), names in sorted(named.items()):
        by_verbs: dict[tuple[str, ...], list[str]] = collections.defaultdict(list)
        for name, verbs in names.items():
            by_verbs[tuple(sorted(verbs))].append(name)
        for verbs, objs in sorted(by_verbs.items()):
            rules.append({"apiGroups": [group], "resources": [plural], "resourceNames": sorted(objs),
                          "verbs": list(verbs)})
    rules.extend(_fixed_rules(settings, pod_watch, events=events and any_writable))
    return rules


def _fixed_rules(settings: ActuationSettings, pod_watch: bool = True, *, events: bool = True) -> list[dict[str, Any]]:
    calls = [*api_calls(), *(c for c in DISCOVERY_CALLS if pod_watch or c.verb != "watch")]
    rules: list[dict[str, Any]] = []
    for kind in ("Pod", "Event", "Lease") if events else ("Pod", "Lease"):
        info = RESOURCES[kind]
        unnamed = sorted({c.verb for c in calls if c.resource == kind and not c.named})
        named = sorted({c.verb for c in calls if c.resource == kind and c.named})
        if unnamed:
            rules.append({"apiGroups": [info.group], "resources": [info.plural], "verbs": unnamed})
        if named:
            names = [settings.lease.name] if kind == "Lease" else []
            rule: dict[str, Any] = {"apiGroups": [info.group], "resources": [info.plural]}
            if names:
                rule["resourceNames"] = names
            rules.append({**rule, "verbs": named})
    return rules


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print(__doc__.strip().splitlines()[-1], file=sys.stderr)
        return 2
    print(yaml.safe_dump({"rules": required_rules(load_settings(argv[0]))}, sort_keys=False), end="")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
