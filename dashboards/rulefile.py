"""Prometheus rule records and their two renderings from one source: a plain rules file (what
`promtool check rules` and Prometheus read) and a Prometheus-Operator `PrometheusRule` object."""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any, Literal

import yaml

Severity = Literal["critical", "warning", "info"]
ALERT_NAME = re.compile(r"^[A-Z][A-Za-z0-9]+$")
RECORD_NAME = re.compile(r"^[a-z_][a-z0-9_]*(:[a-z0-9_]+)+$")
DURATION = re.compile(r"^\d+[smhdw]$")


class RuleError(ValueError):
    """A rule that would not load, or that breaks the project's conventions."""


@dataclass(frozen=True)
class Record:
    """A recording rule, named `level:metric:operations`."""

    record: str
    expr: str

    def __post_init__(self) -> None:
        if not RECORD_NAME.match(self.record):
            raise RuleError(f"recording rule {self.record!r}: name must look like level:metric:operations")

    def to_dict(self) -> dict[str, Any]:
        return {"record": self.record, "expr": self.expr}


@dataclass(frozen=True)
class Alert:
    """An alerting rule. `runbook` is the anchor of its section in docs/runbooks.md."""

    alert: str
    expr: str
    severity: Severity
    summary: str
    description: str
    runbook: str
    for_: str = "0m"
    labels: tuple[tuple[str, str], ...] = field(default=())

    def __post_init__(self) -> None:
        if not ALERT_NAME.match(self.alert):
            raise RuleError(f"alert {self.alert!r}: name must be CamelCase")
        if not DURATION.match(self.for_):
            raise RuleError(f"alert {self.alert!r}: for={self.for_!r} is not a duration like 5m")
        for key in ("summary", "description", "runbook"):
            if not getattr(self, key).strip():
                raise RuleError(f"alert {self.alert!r}: {key} is required")

    def to_dict(self, runbook_base_url: str) -> dict[str, Any]:
        out: dict[str, Any] = {"alert": self.alert, "expr": self.expr}
        if self.for_ not in ("0m", "0s"):
            out["for"] = self.for_
        out["labels"] = {"severity": self.severity, **dict(self.labels)}
        out["annotations"] = {
            "summary": self.summary,
            "description": self.description,
            "runbook_url": f"{runbook_base_url}#{self.runbook}",
        }
        return out


@dataclass(frozen=True)
class Group:
    name: str
    rules: tuple[Record | Alert, ...]
    interval: str = ""

    def to_dict(self, runbook_base_url: str) -> dict[str, Any]:
        out: dict[str, Any] = {"name": self.name}
        if self.interval:
            out["interval"] = self.interval
        out["rules"] = [r.to_dict(runbook_base_url) if isinstance(r, Alert) else r.to_dict()
                        for r in self.rules]
        return out


def alerts(groups: tuple[Group, ...]) -> list[Alert]:
    return [r for g in groups for r in g.rules if isinstance(r, Alert)]


def check_unique(groups: tuple[Group, ...]) -> None:
    names = [g.name for g in groups]
    dup = sorted({n for n in names if names.count(n) > 1})
    if dup:
        raise RuleError(f"duplicate rule group names {dup}")
    alert_names = [a.alert for a in alerts(groups)]
    dup = sorted({n for n in alert_names if alert_names.count(n) > 1})
    if dup:
        raise RuleError(f"duplicate alert names {dup}")


def rules_document(groups: tuple[Group, ...], runbook_base_url: str) -> dict[str, Any]:
    check_unique(groups)
    return {"groups": [g.to_dict(runbook_base_url) for g in groups]}


def prometheus_rule(groups: tuple[Group, ...], runbook_base_url: str, *, name: str = "tierpilot",
                    namespace: str = "") -> dict[str, Any]:
    """The same groups as a `monitoring.coreos.com/v1` PrometheusRule."""
    metadata: dict[str, Any] = {"name": name}
    if namespace:
        metadata["namespace"] = namespace
    metadata["labels"] = {"app.kubernetes.io/name": "tierpilot", "app.kubernetes.io/component": "alerting"}
    return {
        "apiVersion": "monitoring.coreos.com/v1",
        "kind": "PrometheusRule",
        "metadata": metadata,
        "spec": rules_document(groups, runbook_base_url),
    }


class _Dumper(yaml.SafeDumper):
    pass


def _str(dumper: yaml.SafeDumper, value: str) -> yaml.ScalarNode:
    style = "|" if "\n" in value else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", value, style=style)


_Dumper.add_representer(str, _str)


def to_yaml(document: dict[str, Any], header: str) -> str:
    body = yaml.dump(document, Dumper=_Dumper, sort_keys=False, width=1000, allow_unicode=True)
    comment = "".join(f"# {line}\n" if line else "#\n" for line in header.splitlines())
    return comment + body
