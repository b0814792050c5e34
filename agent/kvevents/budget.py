"""How the KV-event memory budgets are shared out (pure): which endpoints are watched (at most
`limits.max_models` models), and each engine's share of its pod's and of the fleet's budgets,
whatever the pods' data-parallel sizes say. The manager applies a plan whenever discovery
changes the fleet."""
from __future__ import annotations

import dataclasses
from collections.abc import Collection, Sequence

from agent.kvevents.settings import EndpointSpec, KvEventsSettings
from agent.kvevents.signals import EngineId

MIN_RCVHWM = 8  # messages libzmq may queue per engine, whatever the byte share says


@dataclasses.dataclass(frozen=True)
class StreamPlan:
    specs: tuple[EndpointSpec, ...]  # the endpoints watched
    skipped_models: tuple[str, ...]  # models beyond max_models, not indexed
    endpoints: dict[EngineId, tuple[str, str | None, str]]  # engine -> (endpoint, replay, topic)
    caps: dict[EngineId, tuple[int, int]]  # engine -> (resident, history) entries
    rcvhwm: dict[EngineId, int]  # engine -> ZMQ receive high-water mark
    pending_bytes: int  # live bytes one engine may queue behind a replay
    queue_bytes: int  # wire bytes one engine may hold between its socket and the index
    shadow_per_model: int  # L2 shadow entries per model

    @property
    def models(self) -> set[str]:
        return {eid.model for eid in self.endpoints}


def plan_streams(wanted: Sequence[EndpointSpec], settings: KvEventsSettings,
                 indexed_models: Collection[str] = ()) -> StreamPlan:
    """Models already indexed keep their place, then new ones in the order given."""
    limits = settings.limits
    order = list(dict.fromkeys(spec.model for spec in wanted))
    ranked = sorted(order, key=lambda m: (m not in indexed_models, order.index(m)))
    keep = set(ranked[:limits.max_models])
    specs = tuple(spec for spec in wanted if spec.model in keep)
    n_engines = max(1, sum(spec.dp_size for spec in specs))
    queue_share = settings.queue_bytes // n_engines
    # libzmq's own receive queue counts messages, not bytes: hold no more of the largest
    # allowed message than the engine's queue share (at least MIN_RCVHWM), so a flood of big
    # messages waits in the publisher (its SNDHWM), not in the agent's memory
    by_bytes = max(MIN_RCVHWM, queue_share // settings.max_message_bytes)
    endpoints, caps, hwm = {}, {}, {}
    for spec in specs:
        for eid, ep, rp in spec.engines():
            endpoints[eid] = (ep, rp, spec.topic)
            caps[eid] = limits.engine_caps(spec.dp_size, n_engines)
            hwm[eid] = max(1, min(settings.rcvhwm // spec.dp_size, by_bytes))
    models = max(1, len(keep))
    return StreamPlan(specs, tuple(sorted(set(order) - keep)), endpoints, caps, hwm,
                      settings.replay_pending_bytes // n_engines, queue_share, max(2, limits.shadow_l2 // models))
