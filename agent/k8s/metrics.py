"""Actuation metrics: a small thread-safe state object and a prometheus Collector over it.

The agent registers `ActuationCollector` in its own CollectorRegistry (never the global one).
Names and labels are catalogued in docs/metrics.md, section "Actuation (agent/k8s)".
"""
from __future__ import annotations

import collections
import threading
from collections.abc import Callable, Iterator

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

OPERATIONS = ("apply", "rollback", "reapply", "mark_good")
# The result of a successful operation is named after it (dashboards and alerts key on
# result="applied" and result="rolled_back").
SUCCESS = {"apply": "applied", "rollback": "rolled_back", "reapply": "reapplied", "mark_good": "marked_good"}
RESULTS = (*SUCCESS.values(), "dry_run", "unchanged", "conflict_retried", "retriable_error", "permanent_error",
           "workload_gone", "rollout_timeout", "rollout_failed", "not_leader", "gave_up")


class ActuationMetrics:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._results: collections.Counter[tuple[str, str, str]] = collections.Counter()
        self._reapplied: collections.Counter[str] = collections.Counter()
        self._rollout_s: dict[str, float] = {}
        self._gone: set[str] = set()
        self._leader: dict[str, bool] = {}
        self._became_leader: collections.Counter[str] = collections.Counter()
        self.dry_run = False
        self.event_failures: Callable[[], int] = lambda: 0

    def result(self, target: str, operation: str, result: str) -> None:
        assert operation in OPERATIONS and result in RESULTS, (operation, result)
        with self._lock:
            self._results[(target, operation, result)] += 1

    def success(self, target: str, operation: str) -> None:
        self.result(target, operation, SUCCESS[operation])

    def reapplied(self, target: str) -> None:
        with self._lock:
            self._reapplied[target] += 1

    def rollout_seconds(self, target: str, seconds: float) -> None:
        with self._lock:
            self._rollout_s[target] = seconds

    def gone(self, target: str) -> None:
        with self._lock:
            self._gone.add(target)

    def leader(self, identity: str, leading: bool) -> None:
        with self._lock:
            if leading and not self._leader.get(identity, False):
                self._became_leader[identity] += 1
            self._leader[identity] = leading

    def snapshot(self) -> dict[str, object]:
        with self._lock:
            return {
                "results": dict(self._results), "reapplied": dict(self._reapplied),
                "rollout_s": dict(self._rollout_s), "gone": set(self._gone), "leader": dict(self._leader),
                "became_leader": dict(self._became_leader),
            }


class ActuationCollector(Collector):
    """Builds fresh families from the state on every scrape."""

    collector_name = "actuation"  # the `collector` label of tierpilot_collector_up

    def __init__(self, metrics: ActuationMetrics) -> None:
        self.metrics = metrics

    def describe(self) -> Iterator[Metric]:
        return iter(())

    def collect(self) -> Iterator[Metric]:
        snap = self.metrics.snapshot()
        results = CounterMetricFamily(
            "tierpilot_k8s_object_writes",
            "Writes to each Kubernetes object by operation and result (one tuner actuation writes several).",
            labels=["workload", "operation", "result"])
        for (target, op, res), n in sorted(snap["results"].items()):  # type: ignore[attr-defined]
            results.add_metric([target, op, res], n)
        yield results
        reapplied = CounterMetricFamily(
            "tierpilot_reapplied", "Settings re-applied after something (an operator) reverted them.",
            labels=["workload"])
        for target, n in sorted(snap["reapplied"].items()):  # type: ignore[attr-defined]
            reapplied.add_metric([target], n)
        yield reapplied
        rollout = GaugeMetricFamily(
            "tierpilot_rollout_duration_seconds", "Duration of the last completed rollout per tuned workload.",
            labels=["workload"], unit="")
        for target, s in sorted(snap["rollout_s"].items()):  # type: ignore[attr-defined]
            rollout.add_metric([target], s)
        yield rollout
        gone = GaugeMetricFamily("tierpilot_workload_gone", "1 when the tuned workload returned 404 and is no longer tuned.",
                                 labels=["workload"])
        for target in sorted(snap["gone"]):  # type: ignore[call-overload]
            gone.add_metric([target], 1)
        yield gone
        leader = GaugeMetricFamily("tierpilot_leader", "1 while this replica holds the leader Lease.",
                                   labels=["identity"])
        became = CounterMetricFamily("tierpilot_leader_acquired", "Times this replica became the leader.",
                                     labels=["identity"])
        for identity, leading in sorted(snap["leader"].items()):  # type: ignore[attr-defined]
            leader.add_metric([identity], 1.0 if leading else 0.0)
            became.add_metric([identity], snap["became_leader"].get(identity, 0))  # type: ignore[attr-defined]
        yield leader
        yield became
        # dry-run is served once, by the tuner's metrics (`tierpilot_dry_run{workload}`), which the
        # agent registers beside this collector with the same effective setting
        yield CounterMetricFamily("tierpilot_k8s_event_failures", "Kubernetes Events that could not be recorded.",
                                  value=self.metrics.event_failures())
