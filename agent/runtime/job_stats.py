"""`tierpilot_job_runs_total{task, outcome}`: the scheduler's record of every job run."""
from __future__ import annotations

import threading
from collections.abc import Iterator

from prometheus_client.core import CounterMetricFamily, Metric
from prometheus_client.registry import Collector


class JobStats(Collector):
    """`tierpilot_job_runs_total{task, outcome}` (`task`, not `job`: Prometheus' own `job` label
    names the scrape job, and with honor_labels an exported `job` would replace it)."""

    def __init__(self) -> None:
        self.counts: dict[tuple[str, str], int] = {}
        self._lock = threading.Lock()

    def record(self, job: str, outcome: str) -> None:
        with self._lock:
            self.counts[(job, outcome)] = self.counts.get((job, outcome), 0) + 1

    def collect(self) -> Iterator[Metric]:
        fam = CounterMetricFamily("tierpilot_job_runs", "Scheduled job runs by task and outcome (ok/error/skipped).",
                                  labels=["task", "outcome"])
        with self._lock:
            for (job, outcome), n in sorted(self.counts.items()):
                fam.add_metric([job, outcome], float(n))
        yield fam
