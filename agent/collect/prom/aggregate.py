"""`source: prometheus` with `aggregate: server` (the default): one agent cycle in which
Prometheus does the per-pod normalisation (prom/plan.py) and the agent only reads small answers
column-wise (prom/table.py). The I/O shell; the faults are source.PrometheusCycle's.

Per cycle and role group, all at one evaluation time:
  1. `/api/v1/label/__name__/values` of the group's series over the window, and `up{<selector>}`:
     which mapped names exist (the index only; no samples read), which targets are down;
  2. per part of every rule whose names exist, its expression (prom/plan.py), `concurrency` at a
     time: one small series per target, model (and bucket) and rule;
  3. a target with a NaN or infinite aggregate is read the exact way (its raw series through the
     mapping files, promsource's agent-side path), so its anomaly is reported and counted and its
     valid series kept.
The rows of every group are resolved across sources and written to the window store
(column-wise), which differences them between cycles as it does a direct scrape's; the snapshot
is built from the store's window, as ScrapeCycle builds it. At the first cycle (`backfill`) the
same queries at a few past instants across the window give the store its history, so increases
and rates over the window exist at once.
"""
from __future__ import annotations

import asyncio
import math
import re
import time
from collections.abc import Sequence
from typing import Any

import aiohttp
import polars as pl

from agent.collect.normalise import normalise
from agent.collect.parse import Payload
from agent.collect.prom.api import QueryFailure
from agent.collect.prom.frame import GroupKey, RoleGroup, split_vector, target_of, up_statuses
from agent.collect.prom.plan import Part, compile_group, quote
from agent.collect.prom.source import GroupResult, PrometheusCycle
from agent.collect.prom.table import (
    FRAME_SCHEMA,
    AnswerDecoder,
    part_labels,
    part_rows,
    resolve_frame,
    signals_frame,
    stage_frame,
)
from agent.collect.snapshot import build_snapshot
from contracts.tier_model import Snapshot, Target, TargetStatus


def backfill_instants(now: float, window_s: float, interval_s: float, earliest: float | None = None) -> list[float]:
    """The window's start (or Prometheus' first sample of the targets, when later: a baseline
    before anything it saw happened), then now - interval x 2^k for k = ..., 2, 1, 0 after it:
    fine history where the window's rates are read first, about log2(window / interval) + 1
    instants in all (6 for 300 s at 15 s)."""
    start = now - window_s if earliest is None else max(now - window_s, earliest)
    out, back = [start], max(interval_s, 1e-3)
    while now - back > start:
        out.append(now - back)
        back *= 2
    return sorted(out)


def first_sample_query(group: RoleGroup, window_s: float, interval_s: float) -> str:
    """When Prometheus first scraped any of the group's targets within the window (`up`). The
    subquery's steps sit on multiples of its resolution in absolute time, so a resolution of the
    scrape interval would see nothing of a Prometheus younger than one step: the resolution is
    the window over 300 steps (1 s for the default window), never coarser than the interval."""
    step = max(1, min(math.ceil(interval_s), math.ceil(window_s / 300)))
    return f"min(min_over_time(timestamp({group.up_query()})[{max(1, math.ceil(window_s))}s:{step}s]))"


class AggregatedResult(GroupResult):
    """One group's answers: rows of lifetime values per target, model, signal and bucket."""

    def __init__(self) -> None:
        super().__init__()
        self.last = pl.DataFrame(schema=FRAME_SCHEMA)
        self.anomalies: dict[GroupKey, dict[str, int]] = {}
        self.series: dict[GroupKey, int] = {}  # rows read per target (after aggregation)

    def targets(self) -> list[GroupKey]:
        return list(self.series)


class AggregatedCycle(PrometheusCycle):
    """PrometheusCycle whose queries Prometheus aggregates per pod, model and rule."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.decoder = AnswerDecoder(self.labelling, self.mappings)
        self._parts: dict[tuple[int, frozenset[str]], tuple[Part, ...]] = {}
        self.last_timings: dict[str, float] = {}

    def _compiled(self, index: int, group: RoleGroup, present: frozenset[str]) -> tuple[Part, ...]:
        key = (index, present)
        parts = self._parts.get(key)
        if parts is None:
            if len(self._parts) > 64:
                self._parts.clear()
            parts = self._parts[key] = compile_group(group, self.mappings, self.labelling, present)
        return parts

    def _failed(self, failure: QueryFailure) -> AggregatedResult:
        out = AggregatedResult()
        out.failure = failure
        return out

    async def _query_parts(self, session: aiohttp.ClientSession, parts: list[Part], group: RoleGroup,
                     at: float) -> list[pl.DataFrame] | QueryFailure:
        """One query for parts that ask the same (two mappings of one engine reading the same
        series, e.g. vLLM V0's and V1's TTFT histogram): its answer's rows for each of them."""
        promql = parts[0].query
        got = await self.api.query_body(session, promql, at)
        if isinstance(got, QueryFailure):
            return got
        body, _ = got
        result = self.decoder.decode(body)
        if result is None:
            return QueryFailure("query_error", f"unexpected answer to {promql[:120]!r}", 0.0)
        labels = [label for p in parts for label in part_labels(p, group.role, self.labelling)]
        cols = self.decoder.columns(result, labels)
        return [part_rows(p, cols, group.role, self.labelling, self.roles_by_name) for p in parts]

    async def _query_aggregated(self, session: aiohttp.ClientSession, index: int, group: RoleGroup,
                                at: float) -> AggregatedResult:
        out = AggregatedResult()
        start = time.perf_counter()
        window_s = self.settings.store.window_s
        names, up = await asyncio.gather(
            self.api.label_values(session, "__name__", group.last_query(), at - window_s, at),
            self.api.query(session, group.up_query(), at))
        failure = next((r for r in (names, up) if isinstance(r, QueryFailure)), None)
        if failure is not None:
            out.failure, out.duration_s = failure, time.perf_counter() - start
            return out
        assert not isinstance(names, QueryFailure) and not isinstance(up, QueryFailure)
        out.down = up_statuses(up, group, self.labelling)
        parts = self._compiled(index, group, frozenset(names) & frozenset(group.names))
        same: dict[str, list[Part]] = {}
        for p in parts:
            same.setdefault(p.query, []).append(p)
        answers = await asyncio.gather(*(self._query_parts(session, ps, group, at) for ps in same.values()))
        failure = next((a for a in answers if isinstance(a, QueryFailure)), None)
        if failure is not None:
            out.failure, out.duration_s = failure, time.perf_counter() - start
            return out
        stage = stage_frame((p, rows) for ps, got in zip(same.values(), answers, strict=True)
                            for p, rows in zip(ps, got, strict=True))  # type: ignore[arg-type]
        out.last = stage.frame
        if stage.suspects:
            await self._read_exactly(session, group, stage.suspects, at, out)
        counts = out.last.group_by(["role", "pod", "namespace"]).len()
        out.series = {(r, p, ns): n for r, p, ns, n in counts.iter_rows()}
        out.duration_s = time.perf_counter() - start
        return out

    async def _read_exactly(self, session: aiohttp.ClientSession, group: RoleGroup,
                            suspects: frozenset[tuple[str, str, str]], at: float, out: AggregatedResult) -> None:
        """The suspect targets through the agent-side path: raw series, mapping files, anomalies."""
        lab = self.labelling
        pods = sorted({pod for _, pod, _ in suspects})
        regex = "|".join(re.sub(r"([\\.+*?()|\[\]{}^$])", r"\\\1", p) for p in pods)  # RE2 literals
        extra = f"{lab.pod_label}=~{quote(regex)}"
        narrowed = RoleGroup(group.role, f"{group.selector},{extra}" if group.selector else extra,
                             group.names, group.counters)
        answer = await self.api.query(session, narrowed.last_query(), at)
        if isinstance(answer, QueryFailure):
            out.failure = answer
            return
        payloads: dict[GroupKey, Payload] = {}
        split_vector(answer, narrowed, lab, self.roles_by_name, payloads)
        drop = pl.DataFrame(list(suspects), schema={"role": pl.String(), "pod": pl.String(),
                                                    "namespace": pl.String()}, orient="row")
        out.last = out.last.join(drop, on=["role", "pod", "namespace"], how="anti")
        base = self.source.url or ""
        exact = []
        for key, payload in payloads.items():
            res = normalise(target_of(base, key), payload, self.mappings)
            exact.append(_with_target(signals_frame(res.signals), key))
            if res.anomalies:
                out.anomalies[key] = res.anomalies
        out.last = pl.concat([out.last, *exact], how="vertical_relaxed")

    # -- backfill ------------------------------------------------------------------------------
    async def _backfill(self, session: aiohttp.ClientSession, now: float) -> None:
        """Give the store the window's history at once: the same aggregated queries evaluated at
        past instants (backfill_instants: one scrape interval back, then twice as far each time,
        the last at the window's start), each a cycle's worth of Prometheus work, once; an instant
        before Prometheus has data costs one index lookup. Tried on at most
        source.BACKFILL_ATTEMPTS cycles, then left to the cycles themselves."""
        self._backfill_attempts += 1
        window, interval = self.settings.store.window_s, self.settings.scrape.interval_s
        firsts = await asyncio.gather(*(self.api.query(session, first_sample_query(g, window, interval), now)
                                        for g in self.groups))
        if any(isinstance(f, QueryFailure) for f in firsts):
            self._give_up_backfill_after_attempts()
            return
        starts = [float(item["value"][1]) for f in firsts for item in f]  # type: ignore[union-attr]
        if not starts:  # Prometheus has nothing of these targets yet
            self.backfilled = True
            return
        instants = backfill_instants(now, window, interval, earliest=min(starts))
        frames: list[tuple[float, pl.DataFrame]] = []
        for at in instants:
            results = await asyncio.gather(*(self._query_aggregated(session, i, g, at)
                                             for i, g in enumerate(self.groups)))
            if any(r.failure is not None for r in results):
                self._give_up_backfill_after_attempts()
                return  # nothing half-written: tried again next cycle
            frame = pl.concat([r.last for r in results], how="vertical_relaxed")
            if frame.height:
                frames.append((at, resolve_frame(frame, self.mappings)))
        for at, frame in sorted(frames, key=lambda f: f[0]):
            self.store.ingest_frame(frame, ts=at)
        self.backfilled = True

    # -- the cycle -------------------------------------------------------------------------------
    async def _query_one(self, session: aiohttp.ClientSession, index: int, group: RoleGroup,
                         at: float) -> AggregatedResult:
        return await self._query_aggregated(session, index, group, at)

    async def run(self, _session: Any = None, _targets: Sequence[Target] = ()) -> Snapshot:
        start = time.perf_counter()
        now = self.clock()
        results: list[AggregatedResult] = await self._query_all(now)  # type: ignore[assignment]
        queried = time.perf_counter()
        lasts = []
        statuses: dict[str, TargetStatus] = {}
        fresh: list[pl.DataFrame] = []
        for i, (group, res) in enumerate(zip(self.groups, results, strict=True)):
            used = res
            if res.failure is not None:
                previous = self.previous.get(i)
                used = previous if isinstance(previous, AggregatedResult) else AggregatedResult()
            else:
                self.previous[i] = res
                fresh.append(res.last)
            lasts.append(used.last)
            statuses.update(self._target_statuses(group, res, used.targets(), used.down,
                                                  lambda key, u=used: u.series.get(key, 0), used.anomalies))
        last = resolve_frame(pl.concat(lasts, how="vertical_relaxed"), self.mappings)
        if fresh:  # a failed group's pods keep their rows in the store: nothing new, nothing lost
            fresh_pods = pl.concat(fresh, how="vertical_relaxed").select("pod").unique()
            self.store.ingest_frame(last.join(fresh_pods, on="pod", how="semi"), ts=now)
        snap = build_snapshot(
            self.store.window(now=now), list(statuses.values()), taken_at=now,
            live_pods=set(last["pod"].unique().to_list()),
            kv_bytes_per_token=self.settings.tiers.kv_bytes_per_token,
            cpu_capacity_bytes=self.settings.cpu_capacity_bytes,
            cycle_duration_s=time.perf_counter() - start, store_rows=self.store.rows,
        )
        end = time.perf_counter()
        self.last_timings = {"queries_s": queried - start, "agent_s": end - queried, "total_s": end - start}
        return snap


def _with_target(frame: pl.DataFrame, key: GroupKey) -> pl.DataFrame:
    role, _pod, namespace = key
    return frame.with_columns(role=pl.lit(role), namespace=pl.lit(namespace))


__all__ = ["AggregatedCycle"]
