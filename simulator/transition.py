"""A configuration change in the middle of a replay: what getting there costs.

`switch_replay` serves a workload on one twin with `before` until `switch_at_s`, then applies
`after` there the way a rollout does: the twin is reconfigured (CPU and L2 tiers keep what fits;
after a chunk-size change nothing resident matches a prompt any more, so L2 is unreadable until
it refills) and, when `restart_pods`, every pod restarts one after the other, each down for
`downtime_s` (requests routed to it queue) and back with cold GPU and CPU caches. It returns the
TTFT (s) of the requests that arrive from `measure_from_s` on.

Compared with a replay that keeps `before`, and with a warm replay of `after`, this prices a
change: its transition cost and its steady-state benefit (`tuners.planning.planner`).
"""
from __future__ import annotations

import numpy as np
import polars as pl

from contracts.knobs import Knobs
from simulator.cluster import ClusterSpec
from simulator.profile import HardwareProfile
from simulator.records import check_workload, iter_requests
from simulator.twin import Twin


def switch_replay(workload: pl.DataFrame, cluster: ClusterSpec, before: Knobs, after: Knobs, *, switch_at_s: float,
                  restart_pods: bool, downtime_s: float = 0.0, measure_from_s: float | None = None,
                  profile: HardwareProfile | str | None = None) -> np.ndarray:
    """TTFT (s) of the requests arriving at or after `measure_from_s` (default: the switch)."""
    frame = check_workload(workload)
    measure_from = switch_at_s if measure_from_s is None else measure_from_s
    twin = Twin(cluster, before, profile)
    restarts: list[tuple[float, int]] = []
    switched = False
    out: list[float] = []
    for req in iter_requests(frame):
        t = req.timestamp_ms / 1000.0
        if not switched and t >= switch_at_s:
            switched = True
            twin.reconfigure(after)
            if restart_pods:
                restarts = [(switch_at_s + i * downtime_s, i) for i in range(len(twin.pod_names))]
        while restarts and restarts[0][0] <= t:
            at, pod = restarts.pop(0)
            twin.restart_pod(pod, at, down_s=downtime_s)
        o = twin.submit(req)
        if t >= measure_from:
            out.append(o.ttft_s)
    return np.asarray(out, dtype=float)


__all__ = ["switch_replay"]
