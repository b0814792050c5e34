"""Job bodies. The scrape cycle: fetch every target concurrently, parse, normalise, resolve sources
per pod, append to the window store, and compute the next snapshot. No scheduling here.

Fault handling per target (the agent never stops for one bad target):
- a fetch failure or a malformed payload marks the target down, counts the reason, and starts
  its back-off; its pod's last samples stay in the window, nothing else is touched;
- NaN/Inf values are dropped and counted as `invalid_value`; a counter that went down (a
  restart) is counted as `counter_reset`, and every counter of that target (histogram buckets
  included) counts its new value as the increase since the restart. In both
  cases the target is marked down (`tierpilot_target_up 0`, reason = the fault) for that cycle,
  so the fault is visible where operators look first; the payload's valid series are still kept,
  and the next clean scrape marks it up again;
- a payload over a per-target limit (`scrape.sample_limit`, `label_limit`,
  `label_name_length_limit`, `label_value_length_limit`) is refused whole, as Prometheus fails such
  a scrape: the target is down with reason `sample_limit`, `label_limit`, `label_length` or
  `metric_name_length`;
- a series repeated in one payload (same name and label set) is a fault, `duplicate_series`:
  the first occurrence is kept, the repeats are dropped (never summed), the target is down for
  that cycle;
- a target over its cardinality budget (`scrape.max_models_per_target`,
  `max_series_per_target`; agent/collect/budget.py) keeps its most active models' series and
  stays up, with the warning and count `model_budget` / `series_budget`; one log line each time
  a target goes over or back within its budget.
"""
from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import aiohttp

from agent.collect.budget import Budget, CardinalityBudget
from agent.collect.lmcache_check import DETAIL as LMCACHE_DETAIL
from agent.collect.lmcache_check import REASON as LMCACHE_REASON
from agent.collect.lmcache_check import missing_lmcache
from agent.collect.mapping import MappingSet
from agent.collect.normalise import Normalised, normalise, resolve
from agent.collect.parse import Limits, ParseError, Payload, parse
from agent.collect.resets import CounterResetDetector
from agent.collect.roles import KIND_NAMES, KIND_ROLES, detect_kind, detect_role, seen_summary
from agent.collect.scrape import Backoff, FetchFailure, fetch
from agent.collect.shapes import Shapes
from agent.collect.snapshot import build_snapshot
from agent.collect.store import WindowStore
from agent.settings import AgentSettings
from contracts.redact import redact_text
from contracts.tier_model import AUTO_ROLE, Signal, Snapshot, Target, TargetStatus

THREAD_PARSE_CHARS = 1 << 20  # payloads above this are parsed off the event loop

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class TargetOutcome:
    status: TargetStatus
    signals: tuple[Signal, ...]
    restarted: bool = False  # its counters went down since its previous scrape: a new process
    at: float | None = None  # data-clock time the request went out (the page is rendered then)
    known: tuple[str, ...] = ()  # models whose counters ran before they were first kept (budget)


def _unmapped_detail(role: str, text: str, lines: int, types: dict[str, str]) -> str:
    """What a payload that fed no signal held (it is parsed again in full: a rare, misconfigured case)."""
    try:
        full = parse(text).by_name
    except ParseError:
        full = {name: [] for name in types}
    kind = detect_kind(full)
    looks = ""
    if kind and KIND_ROLES[kind] != role:
        looks = f" (it looks like {KIND_NAMES[kind]}: give role {KIND_ROLES[kind]})"
    elif kind:
        looks = f" ({KIND_NAMES[kind]}, but none of the names the mappings read)"
    return f"no {role} mapping matched{looks}; " + seen_summary(full, lines)


class ScrapeCycle:
    """State carried across cycles: back-off, error counts, reset detection, last statuses."""

    def __init__(self, settings: AgentSettings, mappings: MappingSet, store: WindowStore,
                 clock: Callable[[], float] = time.time, monotonic: Callable[[], float] = time.monotonic):
        self.settings = settings
        self.mappings = mappings
        self.store = store
        self.clock = clock
        self.backoff = Backoff(settings.scrape.backoff_base_s, settings.scrape.backoff_max_s, monotonic)
        self.resets = CounterResetDetector()
        self.errors: dict[str, dict[str, int]] = {}
        self.statuses: dict[str, TargetStatus] = {}
        sc = settings.scrape
        self.limits = Limits(samples=sc.sample_limit, labels=sc.label_limit,
                             label_name_length=sc.label_name_length_limit,
                             label_value_length=sc.label_value_length_limit)
        self.detected: dict[str, str] = {}  # URL of a target given without a role -> detected role
        self.budget = CardinalityBudget(Budget(sc.max_models_per_target, sc.max_series_per_target))
        self.over_budget: dict[str, tuple[bool, bool]] = {}  # target -> (models over, series over)
        self.shapes = Shapes(mappings, self.limits)  # payload shapes seen: parse and normalise together

    def _count(self, target: Target, reason: str, n: int = 1) -> dict[str, int]:
        errs = self.errors.setdefault(target.key, {})
        errs[reason] = errs.get(reason, 0) + n
        return dict(errs)

    def process(self, target: Target, text: str, duration_s: float, content_type: str = "") -> TargetOutcome:
        """Parse and normalise one fetched payload (pure apart from the counters). A payload served
        as OpenMetrics (`content_type`) must end with `# EOF`."""
        warnings: list[tuple[str, str]] = []
        if target.role == AUTO_ROLE and target.url in self.detected:
            target = dataclasses.replace(target, role=self.detected[target.url])  # type: ignore[arg-type]
        openmetrics = content_type.lower().startswith("application/openmetrics-text")
        try:
            if target.role == AUTO_ROLE or openmetrics:
                wanted = None if target.role == AUTO_ROLE else self.mappings.wanted.get(target.role)
                payload = parse(text, wanted, self.limits, openmetrics=openmetrics)
            else:  # parse and normalise together (a payload of a shape seen before: both at once)
                read = self.shapes.read(text, target)
        except ParseError as exc:  # LimitExceeded too: its reason is sample_limit, label_limit, ...
            return self._failed(target, exc.reason, str(exc), duration_s)
        if target.role == AUTO_ROLE or openmetrics:
            return self.process_payload(target, payload, duration_s, text=text, warnings=warnings)
        types = read.payload.types if read.payload is not None else {}
        return self._judged(target, read.result, read.lines, read.duplicates, duration_s, text=text, types=types,
                            warnings=warnings)

    def process_payload(self, target: Target, payload: Payload, duration_s: float, *, text: str | None = None,
                        warnings: list[tuple[str, str]] | None = None) -> TargetOutcome:
        """Normalise one parsed payload (`process` after parsing; an in-process target, such as the
        simulated-clock harness's emulated pods, hands its samples over without the text)."""
        warnings = [] if warnings is None else warnings
        if target.role == AUTO_ROLE:
            role = detect_role(payload.by_name)
            if role is None:
                warnings.append(("no_mapped_series", "role not detected from the payload; "
                                 + seen_summary(payload.by_name, payload.lines)))
            else:
                self.detected[target.url] = role
                target = dataclasses.replace(target, role=role)
        return self._judged(target, normalise(target, payload, self.mappings), payload.lines, payload.duplicates,
                            duration_s, text=text, types=payload.types, warnings=warnings)

    def _judged(self, target: Target, result: Normalised, lines: int, duplicates: int, duration_s: float, *,
                text: str | None, types: dict[str, str], warnings: list[tuple[str, str]]) -> TargetOutcome:
        """The outcome of one normalised payload: its budget, faults, resets and status."""
        known = self._hold_to_budget(target, result, warnings)
        if not result.signals and not warnings:
            detail = (_unmapped_detail(target.role, text, lines, types) if text is not None
                      else f"no {target.role} mapping matched")
            warnings.append(("no_mapped_series", detail))
        faults: list[tuple[str, str]] = []  # (reason, detail)
        if duplicates:
            self._count(target, "duplicate_series", duplicates)
            faults.append(("duplicate_series",
                           f"duplicate_series ({duplicates} repeated series dropped, first kept)"))
        for reason, n in result.anomalies.items():
            self._count(target, reason, n)
            faults.append((reason, f"{reason} ({n} series dropped)"))
        went_down = self.resets.observe(target.key, result.signals)
        restarted = self.resets.restarted(target.key)  # a new process, not one odd series
        if went_down:
            self._count(target, "counter_reset")
            faults.append(("counter_reset", "counter_reset (counters went down: a restart)"))
        self.backoff.succeeded(target.key)
        status = TargetStatus(target, not faults, duration_s, faults[0][0] if faults else "",
                              "; ".join(detail for _, detail in faults), samples=lines,
                              errors=dict(self.errors.get(target.key, {})), warnings=tuple(warnings))
        return TargetOutcome(status, tuple(result.signals), restarted, known=known)

    def _hold_to_budget(self, target: Target, result: Normalised,
                        warnings: list[tuple[str, str]]) -> tuple[str, ...]:
        """Cut `result.signals` to the target's cardinality budget; warn, count and log the cut.
        Returns the models let in that may have been dropped before."""
        cut = self.budget.apply(target.key, result.signals)
        result.signals = cut.signals
        sc = self.settings.scrape
        if cut.models_dropped:
            self._count(target, "model_budget", cut.models_dropped)
            detail = (f"model_budget ({cut.models_dropped} of {cut.models_seen} models dropped: over "
                      f"scrape.max_models_per_target {sc.max_models_per_target}; the most active kept)")
            warnings.append(("model_budget", detail))
        if cut.series_dropped:
            self._count(target, "series_budget", cut.series_dropped)
            detail = (f"series_budget ({cut.series_dropped} series dropped: over scrape.max_series_per_target "
                      f"{sc.max_series_per_target})")
            warnings.append(("series_budget", detail))
        state = (cut.models_dropped > 0, cut.series_dropped > 0)
        if state != self.over_budget.get(target.key, (False, False)):
            if any(state):
                log.warning("target %s (pod %s) is over its cardinality budget: %s", target.key, target.pod,
                            "; ".join(d for r, d in warnings if r in ("model_budget", "series_budget")))
            else:
                log.info("target %s (pod %s) is within its cardinality budget again", target.key, target.pod)
        if any(state):
            self.over_budget[target.key] = state
        else:
            self.over_budget.pop(target.key, None)
        return cut.readmitted

    def _failed(self, target: Target, reason: str, detail: str, duration_s: float) -> TargetOutcome:
        detail = redact_text(detail)
        errors = self._count(target, reason)
        self.backoff.failed(target.key)
        return TargetOutcome(TargetStatus(target, False, duration_s, reason, detail, errors=errors), ())

    async def scrape_target(self, session: aiohttp.ClientSession, target: Target) -> TargetOutcome:
        sent = self.clock()
        res = await fetch(session, target.url, timeout_s=self.settings.scrape.timeout_s,
                          max_body_bytes=self.settings.scrape.max_body_bytes)
        if isinstance(res, FetchFailure):
            return self._failed(target, res.reason, res.detail, res.duration_s)
        # A target renders its page as the request arrives (as Prometheus, stamp the sample with
        # the request's time): the answer can come back much later from a busy agent, and each
        # target's request goes out at its own time within the cycle.
        if len(res.text) > THREAD_PARSE_CHARS:
            # a big payload is parsed in a worker thread: the interpreter switches threads every
            # few ms, so /metrics, /healthz and SIGTERM stay served while it runs (the state it
            # touches is keyed by this target, which no other task of the cycle handles)
            outcome = await asyncio.to_thread(self.process, target, res.text, res.duration_s, res.content_type)
        else:
            outcome = self.process(target, res.text, res.duration_s, res.content_type)
        return dataclasses.replace(outcome, at=sent)

    def forget_gone(self, targets: Sequence[Target]) -> None:
        live = {t.key for t in targets}
        for key in [k for k in self.statuses if k not in live]:
            self.statuses.pop(key, None)
            self.errors.pop(key, None)
            self.backoff.forget(key)
            self.resets.forget(key)
            self.budget.forget(key)
            self.over_budget.pop(key, None)

    async def run(self, session: aiohttp.ClientSession, targets: Sequence[Target]) -> Snapshot:
        """One full cycle over `targets`; returns the new snapshot."""
        start = time.perf_counter()
        fetched_at = self.clock()  # the cycle's time when no target answered
        self.forget_gone(targets)
        due = [t for t in targets if self.backoff.ready(t.key)]
        outcomes = await asyncio.gather(*(self.scrape_target(session, t) for t in due))
        signals: list[Signal] = []
        restarted: set[tuple[str, str]] = set()  # (pod, source) of targets whose process restarted
        read_at: dict[tuple[str, str], float] = {}  # (pod, source) -> when its target was read
        known: set[tuple[str, str]] = set()  # (pod, model) let in by a budget after running unseen
        missing = missing_lmcache([(o.status.target, o.signals) for o in outcomes], self.settings.tiers.lmcache)
        for out in outcomes:
            status = out.status
            if status.target.url in missing:
                status = dataclasses.replace(status, warnings=(*status.warnings, (LMCACHE_REASON, LMCACHE_DETAIL)))
            self.statuses[status.target.key] = status
            signals.extend(out.signals)
            if out.restarted:
                restarted.update((s.pod, s.source) for s in out.signals)
            if out.at is not None:
                read_at.update(((s.pod, s.source), out.at) for s in out.signals)
            known.update((status.target.pod, m) for m in out.known)
        scraped = {o.status.target.key for o in outcomes}
        for t in targets:  # skipped while backing off: still down, reason kept
            if t.key not in scraped:
                prev = self.statuses.get(t.key)
                self.statuses[t.key] = TargetStatus(
                    t, False, 0.0, prev.reason if prev else "backoff", "skipped: backing off",
                    errors=dict(self.errors.get(t.key, {})), skipped=True)
        now = max(read_at.values(), default=fetched_at)  # the newest data; the window ends here
        self.store.ingest(resolve(signals, self.mappings), ts=now, restarted=restarted, read_at=read_at,
                          known=known)
        statuses = [self.statuses[t.key] for t in targets]
        return build_snapshot(
            self.store.window(now=now), statuses, taken_at=now, live_pods={t.pod for t in targets},
            kv_bytes_per_token=self.settings.tiers.kv_bytes_per_token,
            cpu_capacity_bytes=self.settings.cpu_capacity_bytes,
            cycle_duration_s=time.perf_counter() - start, store_rows=self.store.rows,
        )
