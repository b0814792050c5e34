"""`source: prometheus`: one agent cycle from a Prometheus-compatible query API instead of scraping
every pod. The I/O shell around prom/frame.py (the pure part). This is `aggregate: agent`: raw
series, normalised in the agent. The default, `aggregate: server` (prom/aggregate.py), lets
Prometheus aggregate per pod and reuses this class's fault handling and its raw read for pods
whose aggregate is not finite.

Per cycle and role group (see frame.plan), all at one evaluation time:
  1. `{__name__=~"<the mappings' wire names>",<selector>}`   lifetime totals and gauges;
  2. `up{<selector>}`                                         which targets Prometheus cannot scrape;
  3. `increase(<name>{<selector>}[<window>])` per counter or histogram name that exists.
The answers become per-pod payloads, go through the same mapping files into the same tier model,
feed the window store (so the tuner, drift detector and workload fit read the same API as with
direct scraping) and build the same snapshot, hence the same `tierpilot_*` series.

At the first successful cycle (`prometheus.backfill`), one range query per group fills the store
with the window's history at the scrape interval, so the tuner and the workload fit have a full
window at once instead of after `store.window_s`.

Faults: a query that fails (down, slow, HTTP error, `status: error`) marks every target of its
group down with the reason (`tierpilot_target_up 0`, `tierpilot_scrape_errors_total{reason}`);
the group's previous answers are reused for the snapshot and nothing is written to the store for
its pods, so no data is lost and no gap is invented. A target Prometheus itself reports as
`up == 0` is down with reason `target_down`.
"""
from __future__ import annotations

import asyncio
import logging
import ssl
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import aiohttp

from agent.collect.mapping import MappingSet
from agent.collect.normalise import normalise, resolve
from agent.collect.parse import Payload
from agent.collect.prom.api import PrometheusApi, QueryFailure, new_api_session
from agent.collect.prom.frame import (
    GroupKey,
    GroupPayloads,
    Labelling,
    RoleGroup,
    name_roles,
    normalise_groups,
    plan,
    split_vector,
    target_of,
    up_statuses,
    window_frame,
)
from agent.collect.snapshot import build_snapshot
from agent.collect.store import WindowStore
from agent.settings import AgentSettings
from contracts.redact import redact_text
from contracts.tier_model import Snapshot, Target, TargetStatus

log = logging.getLogger(__name__)
BACKFILL_ATTEMPTS = 3  # failed backfills before the window is left to fill as cycles run


class GroupResult:
    """What one role group's queries gave this cycle."""

    def __init__(self) -> None:
        self.payloads = GroupPayloads()
        self.down: dict[tuple[str, str], str] = {}
        self.failure: QueryFailure | None = None
        self.duration_s = 0.0


class PrometheusCycle:
    """State across cycles: the previous answers per group (reused when a query fails) and the
    lifetime error counts per target."""

    def __init__(self, settings: AgentSettings, mappings: MappingSet, store: WindowStore,
                 clock: Callable[[], float] = time.time, api: PrometheusApi | None = None):
        self.settings = settings
        self.mappings = mappings
        self.store = store
        self.clock = clock
        self.source = settings.prometheus
        self.api = api or PrometheusApi(self.source)
        self.groups = plan(mappings, self.source.roles)
        self.labelling = Labelling(self.source.pod_label, self.source.namespace_label)
        self.roles_by_name = name_roles(mappings)
        self.previous: dict[int, GroupResult] = {}
        self.errors: dict[str, dict[str, int]] = {}
        self.backfilled = not self.source.backfill
        self._backfill_attempts = 0
        self._session: aiohttp.ClientSession | None = None

    async def aclose(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    def _api_session(self) -> aiohttp.ClientSession | QueryFailure:
        """The query API's session; a TLS file that cannot be read (a CA, client certificate or
        key missing or malformed, e.g. while its Secret is rotated) is a reasoned failure of the
        cycle, `tls_error`, like a down endpoint."""
        if self._session is None or self._session.closed:
            try:
                self._session = new_api_session(self.source)
            except (OSError, ssl.SSLError) as exc:
                tls = self.source.tls
                files = ", ".join(str(f) for f in (tls.ca_file, tls.cert_file, tls.key_file) if f is not None)
                return QueryFailure("tls_error", f"cannot load the TLS files ({files}): {exc}", 0.0)
        return self._session

    def _failed(self, failure: QueryFailure) -> GroupResult:
        out = GroupResult()
        out.failure = failure
        return out

    # -- one group ------------------------------------------------------------------------------
    async def _query_group(self, session: aiohttp.ClientSession, group: RoleGroup, at: float) -> GroupResult:
        out = GroupResult()
        start = time.perf_counter()
        last, up = await asyncio.gather(self.api.query(session, group.last_query(), at),
                                        self.api.query(session, group.up_query(), at))
        failure = next((r for r in (last, up) if isinstance(r, QueryFailure)), None)
        if failure is not None:
            out.failure = failure
            out.duration_s = time.perf_counter() - start
            return out
        assert not isinstance(last, QueryFailure) and not isinstance(up, QueryFailure)
        split_vector(last, group, self.labelling, self.roles_by_name, out.payloads.last)
        out.down = up_statuses(up, group, self.labelling)
        present = sorted({n for p in out.payloads.last.values() for n in p.by_name} & group.counters)
        window_s = self.settings.store.window_s
        answers = await asyncio.gather(*(self.api.query(session, group.increase_query(n, window_s), at)
                                         for n in present))
        for name, res in zip(present, answers, strict=True):
            if isinstance(res, QueryFailure):
                out.failure = res
                break
            split_vector(res, group, self.labelling, self.roles_by_name, out.payloads.increase, name=name)
        out.duration_s = time.perf_counter() - start
        return out

    # -- the cycle -------------------------------------------------------------------------------
    async def _query_one(self, session: aiohttp.ClientSession, index: int, group: RoleGroup,
                         at: float) -> GroupResult:
        return await self._query_group(session, group, at)

    async def _query_all(self, now: float) -> list[GroupResult]:
        """Every group's answers at `now` (each failed alike when the session cannot be made), and
        the backfill at the first cycle whose queries all succeed."""
        session = self._api_session()
        if isinstance(session, QueryFailure):
            return [self._failed(session) for _ in self.groups]
        results = await asyncio.gather(*(self._query_one(session, i, g, now) for i, g in enumerate(self.groups)))
        if not self.backfilled and all(r.failure is None for r in results):
            await self._backfill(session, now)  # before this cycle's rows: the store is in time order
        return list(results)

    async def run(self, _session: Any = None, _targets: Sequence[Target] = ()) -> Snapshot:
        """One cycle (the agent's scrape session and target list are not used)."""
        start = time.perf_counter()
        now = self.clock()
        results = await self._query_all(now)
        merged = GroupPayloads()
        statuses: dict[str, TargetStatus] = {}
        stale_pods: set[str] = set()
        fresh_pods: set[str] = set()
        for i, (group, res) in enumerate(zip(self.groups, results, strict=True)):
            used = res
            if res.failure is not None:
                used = self.previous.get(i, GroupResult())
                stale_pods.update(pod for _, pod, _ in used.payloads.last)
            else:
                self.previous[i] = res
                fresh_pods.update(pod for _, pod, _ in res.payloads.last)
            merged.last.update(used.payloads.last)
            merged.increase.update(used.payloads.increase)
            statuses.update(self._statuses(group, res, used))
        grouped = normalise_groups(merged, self.source.url or "", self.mappings)
        for key, anomalies in grouped.anomalies.items():
            t = target_of(self.source.url or "", key)
            st = statuses.get(t.key)
            if st is not None and st.up:
                reason = next(iter(anomalies))
                for r, n in anomalies.items():
                    self._count(t, r, n)
                statuses[t.key] = TargetStatus(t, False, st.duration_s, reason,
                                               "; ".join(f"{r} ({n} series dropped)" for r, n in anomalies.items()),
                                               samples=st.samples, errors=dict(self.errors.get(t.key, {})))
        fresh = fresh_pods - stale_pods
        self.store.ingest([s for s in grouped.signals if s.pod in fresh], ts=now)
        return build_snapshot(
            window_frame(grouped.signals, grouped.increases, self.settings.store.window_s),
            list(statuses.values()), taken_at=now,
            kv_bytes_per_token=self.settings.tiers.kv_bytes_per_token,
            cpu_capacity_bytes=self.settings.cpu_capacity_bytes,
            cycle_duration_s=time.perf_counter() - start, store_rows=self.store.rows,
        )

    def _count(self, target: Target, reason: str, n: int = 1) -> None:
        errs = self.errors.setdefault(target.key, {})
        errs[reason] = errs.get(reason, 0) + n

    def _statuses(self, group: RoleGroup, res: GroupResult, used: GroupResult) -> dict[str, TargetStatus]:
        last = used.payloads.last
        return self._target_statuses(group, res, list(last), used.down,
                                     lambda key: last[key].lines if key in last else 0)

    def _target_statuses(self, group: RoleGroup, res: GroupResult, keys: list[GroupKey],
                         down: Mapping[tuple[str, str], str], samples_of: Callable[[GroupKey], int],
                         anomalies: Mapping[GroupKey, Mapping[str, int]] | None = None) -> dict[str, TargetStatus]:
        """One status per target of the group: the query's failure, `up == 0`, an anomaly of its
        series (counted per cycle), or up. Targets Prometheus reports down without series are
        listed too; with nothing known and a failed query, the pseudo-pod `prometheus`."""
        base = self.source.url or ""
        keys = list(keys)
        known = {(role, pod) for role, pod, _ in keys}
        for role, pod in down:
            if (role, pod) not in known and role:
                keys.append((role, pod, ""))
        if not keys and res.failure is not None:  # nothing known yet: the query endpoint itself
            keys = [(group.role or "vllm", "prometheus", "")]
        out: dict[str, TargetStatus] = {}
        for key in keys:
            t = target_of(base, key)
            samples = samples_of(key)
            found = (anomalies or {}).get(key)
            if res.failure is not None:
                self._count(t, res.failure.reason)
                st = TargetStatus(t, False, res.failure.duration_s, res.failure.reason,
                                  redact_text(f"Prometheus query failed: {res.failure.detail}"), samples=samples,
                                  errors=dict(self.errors.get(t.key, {})))
            elif (instance := down.get((key[0], key[1])) or down.get(("", key[1]))) is not None:
                self._count(t, "target_down")
                st = TargetStatus(t, False, res.duration_s, "target_down",
                                  f"Prometheus reports up == 0 for {instance}", samples=samples,
                                  errors=dict(self.errors.get(t.key, {})))
            elif found:
                for reason, n in found.items():
                    self._count(t, reason, n)
                st = TargetStatus(t, False, res.duration_s, next(iter(found)),
                                  "; ".join(f"{r} ({n} series dropped)" for r, n in found.items()),
                                  samples=samples, errors=dict(self.errors.get(t.key, {})))
            else:
                st = TargetStatus(t, True, res.duration_s, samples=samples,
                                  errors=dict(self.errors.get(t.key, {})))
            out[t.key] = st
        return out

    # -- backfill ------------------------------------------------------------------------------
    def _give_up_backfill_after_attempts(self) -> None:
        """After BACKFILL_ATTEMPTS failed backfills the window fills as cycles run: a fleet whose
        history cannot be read in time must not pay for it on every cycle."""
        if self._backfill_attempts >= BACKFILL_ATTEMPTS:
            log.warning("backfill from %s gave up after %d attempts; the window fills as cycles run",
                        self.source.url, self._backfill_attempts)
            self.backfilled = True

    async def _backfill(self, session: aiohttp.ClientSession, now: float) -> None:
        """Fill the store with the window's history (one range query per group)."""
        step = self.settings.scrape.interval_s
        start = now - self.settings.store.window_s
        end = now - step
        if end <= start:
            self.backfilled = True
            return
        answers = await asyncio.gather(*(self.api.query_range(session, g.last_query(), start, end, step)
                                         for g in self.groups))
        if any(isinstance(a, QueryFailure) for a in answers):
            self._backfill_attempts += 1
            self._give_up_backfill_after_attempts()
            return  # tried again next cycle (at most BACKFILL_ATTEMPTS times)
        by_ts: dict[float, dict[GroupKey, Payload]] = {}
        for group, matrix in zip(self.groups, answers, strict=True):
            assert not isinstance(matrix, QueryFailure)
            for item in matrix:
                labels = dict(item.get("metric") or {})
                name = labels.pop("__name__", "")
                for ts, value in item.get("values") or ():
                    vector = [{"metric": {**labels, "__name__": name}, "value": [ts, value]}]
                    split_vector(vector, group, self.labelling, self.roles_by_name,
                                 by_ts.setdefault(float(ts), {}))
        base = self.source.url or ""
        for ts in sorted(by_ts):
            signals = []
            for key, payload in by_ts[ts].items():
                signals.extend(normalise(target_of(base, key), payload, self.mappings).signals)
            self.store.ingest(resolve(signals, self.mappings), ts=ts)
        self.backfilled = True


__all__ = ["PrometheusCycle"]
