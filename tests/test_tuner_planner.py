"""Pricing a live change on the twin (tuners/planning/planner.py), judging it against the twin's
counterfactual for the same window, and the drift detector's trend / refractory / size checks."""
from __future__ import annotations

import math

import numpy as np
import optuna
import pytest

from contracts.knobs import Knobs
from tests.support.tuner_fakes import FakeActuator, FakeClock, FakeFleet
from tests.support.tuner_settings import (
    controller_settings,
    drift_settings,
    guardrail_settings,
    horizon_settings,
    live_settings,
    plan_settings,
)
from tuners.controller import TuningController
from tuners.drift import SignalDetector
from tuners.guardrails import Guardrails
from tuners.live import LiveEvaluator
from tuners.metrics import TunerMetrics
from tuners.objective import TtftObservations
from tuners.payoff import TtftSummary
from tuners.planning.horizon import RegimeHorizon
from tuners.planning.planner import (
    TransitionPlanner,
    decide,
    horizon_outcome,
    net_gain,
    weighted_p95_mean,
)
from tuners.space import Choice, DeploymentLimits, SearchSpace
from tuners.stats import scale_observations

optuna.logging.set_verbosity(optuna.logging.WARNING)


# -- the arithmetic ---------------------------------------------------------------------------
def test_weighted_p95_and_mean() -> None:
    v = np.arange(1.0, 101.0)
    p95, mean = weighted_p95_mean(v, np.ones(100))
    assert p95 == 95.0 and mean == pytest.approx(50.5)
    # the same values, the top half weighted 3x: the mean moves up, the p95 too
    w = np.where(v > 50, 3.0, 1.0)
    p95w, meanw = weighted_p95_mean(v, w)
    assert meanw == pytest.approx((sum(range(1, 51)) + 3 * sum(range(51, 101))) / 200)
    assert p95w > p95


def test_horizon_weights_the_transition_by_its_share_of_the_horizon() -> None:
    transition, steady = np.full(10, 2.0), np.full(40, 1.0)
    # 100 s of transition in a 1,000 s horizon: 10% of the requests at 2 s
    p95, mean = horizon_outcome(transition, steady, 100.0, 1000.0)
    assert mean == pytest.approx(1.1) and p95 == 2.0  # exactly 10% above 1 s: p95 in the slow part
    p95, mean = horizon_outcome(transition, steady, 40.0, 1000.0)  # 4%: p95 stays at 1 s
    assert mean == pytest.approx(1.04) and p95 == 1.0


def test_net_gain_counts_the_transition() -> None:
    stay = np.full(100, 1.0)
    steady = np.full(100, 0.8)  # 20% better once warm
    cold = np.full(100, 3.0)  # while pods restart with empty caches
    g95, gmean = net_gain(stay, steady, steady, 150.0, 900.0)
    assert g95 == pytest.approx(0.2) and gmean == pytest.approx(0.2)
    # a short horizon: the transition's cost outweighs the gain
    g95, gmean = net_gain(stay, cold, steady, 150.0, 300.0)
    assert gmean == pytest.approx(1 - (0.5 * 3.0 + 0.5 * 0.8)) and gmean < 0 and g95 < 0
    # a long horizon: it pays back (the mean; the p95 still sees the 150 s of cold requests)
    g95, gmean = net_gain(stay, cold, steady, 150.0, 15000.0)
    assert gmean == pytest.approx(1 - (0.01 * 3.0 + 0.99 * 0.8)) and gmean > 0.15
    assert g95 == pytest.approx(0.2)


# -- deciding on a twin -------------------------------------------------------------------------
DEFAULT = Knobs()
KV = DEFAULT.replace(router="kvaware")
BIG = KV.replace(chunk_tokens=512)


class ScriptedTwin:
    """A PlanningTwin with hand-made TTFT per configuration; a restart makes the window slow."""

    transition_s = 150.0

    def __init__(self, steady: dict[Knobs, float], restart_ttft: float) -> None:
        self._steady = steady
        self.restart_ttft = restart_ttft
        self.calls: list[tuple] = []

    def steady(self, knobs: Knobs) -> np.ndarray:
        return np.full(100, self._steady[knobs])

    def switch(self, before: Knobs, after: Knobs, *, restart: bool) -> np.ndarray:
        self.calls.append((before, after, restart))
        return np.full(100, self.restart_ttft if restart else self._steady[after])


def restarts(a: Knobs, b: Knobs) -> bool:
    return a.chunk_tokens != b.chunk_tokens or a.cpu_gib != b.cpu_gib


def test_decide_prices_restarts_and_sorts_accepted_first() -> None:
    twin = ScriptedTwin({DEFAULT: 1.0, KV: 0.9, BIG: 0.8}, restart_ttft=4.0)
    out = decide(twin, KV, [BIG], restarts=restarts, margin=0.03, horizon_s=900.0)
    assert len(out) == 1 and out[0].restart and not out[0].accepted and out[0].gain_mean < 0
    out = decide(twin, KV, [BIG], restarts=restarts, margin=0.03, horizon_s=90_000.0)
    assert out[0].accepted
    hot = decide(twin, DEFAULT, [DEFAULT, KV], restarts=lambda a, b: False, margin=0.01, horizon_s=900.0)
    assert [d.knobs for d in hot] == [KV] and hot[0].accepted and not hot[0].restart  # the running one is skipped


class ListSearch:
    def __init__(self, found: list[Knobs]) -> None:
        self.found = found

    def candidates(self, k: int) -> list[Knobs]:
        return self.found[:k]


def test_planner_decides_the_hot_router_first_and_prices_restarts_against_it() -> None:
    session = DEFAULT.replace(router="session")
    twin = ScriptedTwin({DEFAULT: 1.0, KV: 0.9, session: 1.1, DEFAULT.replace(router="prefixaware"): 0.95,
                         BIG: 0.5}, restart_ttft=0.85)  # cold for a while, but no slower than staying
    planner = TransitionPlanner(lambda: twin, lambda: DEFAULT, restarts=restarts,
                                routers=("roundrobin", "session", "prefixaware", "kvaware"),
                                search=ListSearch([DEFAULT.replace(chunk_tokens=512)]),
                                settings=plan_settings(horizon_s=900.0, margin=0.03))
    plan = planner.candidates(3)
    assert plan == [KV, BIG]  # the search's candidate took the chosen router
    assert (KV, BIG, True) in twin.calls  # priced from the hot change, with its restarts
    hot = [d for d in planner.decisions if not d.restart]
    assert {d.knobs.router for d in hot} == {"session", "prefixaware", "kvaware"}


def test_planner_holds_when_nothing_pays() -> None:
    twin = ScriptedTwin({DEFAULT: 1.0, KV: 1.0, DEFAULT.replace(router="session"): 1.2,
                         DEFAULT.replace(router="prefixaware"): 1.05, DEFAULT.replace(chunk_tokens=512): 0.97},
                        restart_ttft=3.0)
    planner = TransitionPlanner(lambda: twin, lambda: DEFAULT, restarts=restarts,
                                routers=("roundrobin", "session", "prefixaware", "kvaware"),
                                search=ListSearch([DEFAULT.replace(chunk_tokens=512)]), settings=plan_settings())
    assert planner.candidates(3) == []
    assert all(not d.accepted for d in planner.decisions)


def test_planner_prices_every_l2_eviction_policy_the_search_did_not_propose() -> None:
    """The search's short window ranks L2 eviction policies by noise: every policy the space offers
    is priced at every plan, and the one that pays is applied even when the search never drew it."""
    s3 = KV.replace(l2_eviction="s3fifo")
    twin = ScriptedTwin({KV: 1.0, DEFAULT: 1.2, KV.replace(l2_eviction="lfu"): 0.98, s3: 0.9,
                         KV.replace(l2_eviction="arc"): 0.95, BIG: 1.01}, restart_ttft=3.0)
    kw = {"restarts": restarts, "routers": ("roundrobin", "kvaware"), "search": ListSearch([BIG]),
          "settings": plan_settings(horizon_s=900.0, margin=0.03)}
    planner = TransitionPlanner(lambda: twin, lambda: KV, every_value={"l2_eviction": ("lru", "lfu", "s3fifo", "arc")},
                                **kw)
    assert planner.candidates(3) == [s3]
    priced = {d.knobs.l2_eviction for d in planner.decisions if d.knobs.router == "kvaware"}
    assert priced == {"lru", "lfu", "s3fifo", "arc"}  # the running LRU through BIG, the three others on their own
    alone = TransitionPlanner(lambda: twin, lambda: KV, **kw)
    assert alone.candidates(3) == []  # the search's candidate alone does not pay
    lfu = next(d for d in planner.decisions if d.knobs == KV.replace(l2_eviction="lfu"))
    assert not lfu.accepted and lfu.reason == ("settled gain under the 3.0% margin (p95 2.0% faster, mean 2.0% "
                                               "faster, against staying)")


def test_a_decline_never_contradicts_its_own_numbers() -> None:
    """Settled, the move saves TTFT on the mean (a positive gain per hour and a payback time) but
    its p95 is far worse: the reason names the p95, not "does not pay"."""

    class TailTwin:
        transition_s = 150.0

        def steady(self, knobs: Knobs) -> np.ndarray:
            x = np.full(100, 1.0)
            if knobs != KV:
                x = np.full(100, 0.95)
                x[-6:] = 1.5  # a slower tail
            return x

        def switch(self, before: Knobs, after: Knobs, *, restart: bool) -> np.ndarray:
            return np.full(100, 1.1)

    (d,) = decide(TailTwin(), KV, [BIG], restarts=restarts, margin=0.03, horizon_s=900.0, tolerance=0.005)
    assert not d.accepted and d.gain_per_hour_s > 0
    assert d.reason.startswith("p95 slower once settled (p95 ") and "% slower, mean " in d.reason, d.reason
    assert "does not pay" not in d.reason


def test_a_decline_under_the_margin_says_so_not_that_the_transition_is_unpaid() -> None:
    """Settled it gains 4% and the transition costs nothing (payback 0 s), but over a horizon twice
    the window the move gains 2.3% on the mean: under the 3% margin, and the reason says that."""

    class HalfWindowTwin:
        transition_s = 150.0

        def steady(self, knobs: Knobs) -> np.ndarray:
            return np.full(100, 1.0 if knobs == KV else 0.96)

        def switch(self, before: Knobs, after: Knobs, *, restart: bool) -> np.ndarray:
            return np.full(100, 0.994)

    (d,) = decide(HalfWindowTwin(), KV, [BIG], restarts=restarts, margin=0.03, horizon_s=300.0, tolerance=0.005)
    assert not d.accepted and d.payback_s == 0.0 and d.gain_mean == pytest.approx(0.023)
    assert d.reason == "gain below the 3.0% margin over the horizon (p95 +0.6%, mean +2.3%)"


def test_restarts_wait_until_a_regime_that_began_with_a_drift_fills_the_twins_window() -> None:
    """After a drift the twin's 150 s window still holds the old regime's requests: a restart
    priced on it would be priced on the wrong workload. The hot router is decided anyway; restart
    moves are priced at a later plan, once the regime is older than the window. The first regime
    (no drift before it) has nothing to mix with."""
    twin = ScriptedTwin({DEFAULT: 1.0, KV: 0.9, DEFAULT.replace(router="session"): 1.1,
                         DEFAULT.replace(router="prefixaware"): 0.95, BIG: 0.5}, restart_ttft=0.85)
    horizon = RegimeHorizon(horizon_settings(floor_s=300.0))
    now = [0.0]
    horizon.start(0.0)
    horizon.start(1000.0)  # a drift at 1,000 s
    planner = TransitionPlanner(lambda: twin, lambda: DEFAULT, restarts=restarts,
                                routers=("roundrobin", "session", "prefixaware", "kvaware"),
                                search=ListSearch([DEFAULT.replace(chunk_tokens=512)]),
                                horizon=lambda: horizon.estimate(now[0]), clock=lambda: now[0],
                                settings=plan_settings())
    now[0] = 1100.0  # 100 s into the new regime
    assert planner.candidates(3) == [KV]  # the hot change only
    assert "100 s old" in planner.last_plan["restarts_deferred"]
    assert all(not d.restart for d in planner.decisions)
    now[0] = 1200.0  # 200 s: its own requests fill the window
    assert planner.candidates(3) == [KV, BIG]
    assert "restarts_deferred" not in planner.last_plan
    first = RegimeHorizon(horizon_settings(floor_s=300.0))
    first.start(0.0)
    young = TransitionPlanner(lambda: twin, lambda: DEFAULT, restarts=restarts, routers=("roundrobin", "kvaware"),
                              search=ListSearch([DEFAULT.replace(chunk_tokens=512)]),
                              horizon=lambda: first.estimate(90.0), settings=plan_settings())
    assert young.candidates(3) == [KV, BIG]  # the first regime, 90 s old: nothing before it to mix with


# -- judging against the twin's counterfactual ----------------------------------------------------
SPACE = SearchSpace((Choice("router", ("roundrobin", "kvaware")),), DeploymentLimits(pods=2))
T0 = 1_000_000.0


def load(t: float) -> float:
    """The workload gets 40% heavier from T0 + 150 s on (it keeps moving within a phase)."""
    return 1.4 if t >= T0 + 150 else 1.0


def median(k: Knobs) -> float:
    return 0.18 if k.router == "kvaware" else 0.20


class MovingFleet(FakeFleet):
    def _second(self, t: int) -> np.ndarray:
        return super()._second(t) * load(float(t))


class TwinOfTheFleet:
    """What the twin predicts: the configuration's median times the workload's load."""

    def __init__(self) -> None:
        self.calls = 0

    def predict(self, knobs: Knobs, since: float, until: float) -> TtftSummary:
        self.calls += 1
        x = median(knobs) * load(since) * np.exp(0.25 * np.random.default_rng(1).standard_normal(400))
        return TtftSummary.of(x)


def run_one_trial(counterfactual) -> tuple[str, TuningController, TunerMetrics]:
    clock = FakeClock(T0)
    actuator = FakeActuator(clock)
    fleet = MovingFleet(actuator, median, rate=2.0)
    metrics = TunerMetrics()
    guard = Guardrails(actuator, SPACE, metrics, guardrail_settings(apply="all", cooldown_s=0, max_changes_per_hour=60),
                       clock=clock)
    ctl = TuningController(space=SPACE, objective=None, storage=optuna.storages.InMemoryStorage(),
                           guardrails=guard,
                           evaluator=LiveEvaluator(guard, fleet, live_settings(settle_s=60, window_s=120,
                                                                              min_requests=30)),
                           metrics=metrics, warm_start=ListSearch([KV]), counterfactual=counterfactual,
                           settings=controller_settings(study="cf", seed=1, trials_per_phase=5,
                                                       plan_after_baseline=True, live_search=False))
    states = []
    for _ in range(200):
        rep = ctl.step(clock.now)
        states.append(rep.state)
        if rep.state in ("improved", "told", "rolled_back"):
            break
        clock.advance(10)
    return states[-1], ctl, metrics


def test_a_drifting_baseline_condemns_a_good_change_and_the_counterfactual_does_not() -> None:
    state, _ctl, _m = run_one_trial(None)
    assert state == "rolled_back"  # 0.18 x 1.4 looks worse than the 0.20 measured before the load rose
    twin = TwinOfTheFleet()
    state, ctl, metrics = run_one_trial(twin)
    assert state == "improved" and ctl.guardrails.actuator.current() == KV
    assert twin.calls >= 3  # baseline window, trial window (twice: error and counterfactual)
    assert ctl.prediction_errors and all(abs(e) < 0.35 for _t, e in ctl.prediction_errors)
    from prometheus_client import CollectorRegistry, generate_latest
    reg = CollectorRegistry()
    reg.register(metrics)
    assert b"tierpilot_tuner_twin_prediction_error_ratio" in generate_latest(reg)


def test_planned_phase_holds_after_its_candidates() -> None:
    _state, ctl, _m = run_one_trial(TwinOfTheFleet())
    rep = ctl.step(ctl.guardrails.clock() + 30)
    assert rep.state == "holding"


# -- scaling observations ---------------------------------------------------------------------------
def test_scale_observations_samples_and_buckets() -> None:
    s = scale_observations(TtftObservations(samples=(0.1, 0.2)), 2.0)
    assert s is not None and s.samples == pytest.approx((0.2, 0.4))
    b = TtftObservations(buckets=((0.1, 10.0), (0.2, 10.0), (0.4, 0.0), (math.inf, 0.0)))
    sb = scale_observations(b, 2.0)
    assert sb is not None and [le for le, _ in sb.buckets] == [0.1, 0.2, 0.4, math.inf]
    assert sum(c for _, c in sb.buckets) == pytest.approx(20.0)
    assert sb.quantile(0.5) == pytest.approx(2.0 * b.quantile(0.5), rel=0.05)
    assert scale_observations(b, 1.0) is b


# -- drift: trends, refractory period, size of a shift ------------------------------------------------
def feed(det: SignalDetector, xs) -> list[int]:
    return [i for i, x in enumerate(xs) if det.update(float(x))]


def test_tracking_absorbs_a_slow_trend_but_not_a_step() -> None:
    rng = np.random.default_rng(3)
    trend = 0.6 + 0.0015 * np.arange(200) + 0.01 * rng.standard_normal(200)
    assert feed(SignalDetector("reuse_ratio", drift_settings(warmup=20, threshold=15.0)), trend)
    tracked = drift_settings(warmup=20, threshold=15.0, track=0.1)
    assert not feed(SignalDetector("reuse_ratio", tracked), trend)
    step = np.concatenate([np.full(60, 0.8), np.full(40, 0.3)]) + 0.01 * rng.standard_normal(100)
    alarms = feed(SignalDetector("reuse_ratio", tracked), step)
    assert alarms and 60 <= alarms[0] <= 63


def test_refractory_and_minimum_shift_keep_one_alarm_per_shift() -> None:
    rng = np.random.default_rng(5)
    # a step, then the new regime ramps up a little: without a refractory period it alarms again
    xs = np.concatenate([np.full(60, 0.8), np.linspace(0.3, 0.45, 30), np.full(80, 0.45)])
    xs = xs + 0.01 * rng.standard_normal(xs.size)
    plain = feed(SignalDetector("reuse_ratio", drift_settings(warmup=10, threshold=15.0)), xs)
    assert len(plain) >= 2
    settled = drift_settings(warmup=10, threshold=15.0, refractory=30, min_rel_shift=0.25)
    assert len(feed(SignalDetector("reuse_ratio", settled), xs)) == 1
    # a statistically clear but small move (10%) is not a new regime
    small = np.concatenate([np.full(60, 0.8), np.full(60, 0.72)]) + 0.005 * rng.standard_normal(120)
    assert feed(SignalDetector("reuse_ratio", drift_settings(warmup=20, threshold=15.0)), small)
    assert not feed(SignalDetector("reuse_ratio", drift_settings(warmup=20, threshold=15.0, min_rel_shift=0.25)),
                    small)


class RefillTwin:
    """Settled the move gains 10%; its 150-s window adds 10 s over the settled candidate; the
    twin follows the refill for 600 s, 100 requests a minute each 0.5 s slower for the first 400 s."""

    transition_s = 150.0

    def __init__(self, follows: bool) -> None:
        if follows:
            self.refill = self._refill

    def steady(self, knobs: Knobs) -> np.ndarray:
        return np.full(100, 1.0 if knobs == KV else 0.9)

    def switch(self, before: Knobs, after: Knobs, *, restart: bool) -> np.ndarray:
        return np.full(100, 1.0)

    def _refill(self, before: Knobs, after: Knobs, *, restart: bool) -> tuple[np.ndarray, np.ndarray]:
        since = np.arange(0.0, 600.0, 0.6)
        return since, np.where(since < 400.0, 0.5, 0.0)


def test_a_restart_pays_for_the_refill_the_twin_follows_past_its_window() -> None:
    """A chunk change empties a full L2: it refills as the workload revisits it, long after the
    150-s window. Within the window the move pays over 900 s; followed for 600 s, its refill adds
    ~333 s of TTFT (the window counted 10): the mean is worse over the horizon and the transition
    cost says so. Over a horizon long enough for the settled gain, it pays again."""
    (short,) = decide(RefillTwin(follows=False), KV, [BIG], restarts=restarts, margin=0.03, horizon_s=900.0)
    assert short.accepted and short.transition_cost_s == pytest.approx(0.0)
    (d,) = decide(RefillTwin(follows=True), KV, [BIG], restarts=restarts, margin=0.03, horizon_s=900.0)
    assert not d.accepted and d.gain_mean < -0.005 and d.reason.startswith("mean worse over the horizon")
    assert d.transition_cost_s == pytest.approx(400 / 0.6 * 0.5 - 10.0, rel=0.01)
    assert d.payback_s == pytest.approx(d.transition_cost_s / d.gain_per_hour_s * 3600.0)
    # a horizon within the refill: only the refill inside it is charged
    (early,) = decide(RefillTwin(follows=True), KV, [BIG], restarts=restarts, margin=0.03, horizon_s=300.0)
    assert early.transition_cost_s == pytest.approx(300 / 0.6 * 0.5 - 10.0, rel=0.01)
    (long,) = decide(RefillTwin(follows=True), KV, [BIG], restarts=restarts, margin=0.03, horizon_s=20_000.0)
    assert long.accepted
    # a hot change is not followed (the router keeps every pod's cache)
    (hot,) = decide(RefillTwin(follows=True), KV, [BIG], restarts=lambda a, b: False, margin=0.03, horizon_s=900.0)
    assert hot.accepted


def test_the_recent_twin_follows_a_chunk_change_refill_past_its_window() -> None:
    """On the twin of a RAG workload, a restart to 512-token chunks from 1,024 leaves the L2
    unreadable: after the 150-s window the planner scores on, requests are still slower than with
    512 all along, and what they add is at least half again what the window counts. The switch point is at most half
    way through the history (the first half warms the caches), and a history too short to
    follow past the window follows nothing."""
    from emulator.demo.scenarios import scenario
    from tuners.planning.twin_oracle import RecentTwin

    sc = scenario("chunk", 3, phase_s=900.0)
    frame, cluster = sc.workload.frame, sc.cluster
    end = float(frame["timestamp_ms"].max()) / 1000.0
    before = sc.deployment.start
    twin = RecentTwin(frame, cluster, measure_from_s=end - 150.0, refill_s=600.0)
    assert twin.refill_from_s == pytest.approx(max(end - 600.0, end / 2), abs=1.0)
    since, added = twin.refill(before, before.replace(chunk_tokens=512), restart=True)
    assert since.min() >= 0 and since.max() > 400.0 and added.size == since.size
    assert added[since >= 150.0].sum() > 0.5 * added[since < 150.0].sum() > 0
    assert RecentTwin(frame, cluster, measure_from_s=end - 150.0, refill_s=100.0).refill_from_s is None
    late = frame.filter(frame["timestamp_ms"] >= int((end - 250.0) * 1000))
    assert RecentTwin(late, cluster, measure_from_s=end - 150.0, refill_s=600.0).refill(
        before, before.replace(chunk_tokens=512), restart=True) is None


def test_the_recent_twin_prices_a_history_reaching_before_time_zero_as_if_it_started_there() -> None:
    """A rebuilt history asked for before the run began may hold requests at negative times; a
    replay's pods are free from time 0, so they would all queue until then. The twin moves such a
    history to start at 0: the same requests score the same however far back they lie."""
    import polars as pl

    from emulator.demo.scenarios import scenario
    from tuners.planning.twin_oracle import RecentTwin

    sc = scenario("chunk", 3, phase_s=600.0)
    frame, cluster, knobs = sc.workload.frame, sc.cluster, sc.deployment.start
    end = float(frame["timestamp_ms"].max()) / 1000.0
    early = frame.with_columns(pl.col("timestamp_ms") - 400_000)
    at_zero = RecentTwin(frame, cluster, measure_from_s=end - 150.0).steady(knobs)
    before_zero = RecentTwin(early, cluster, measure_from_s=end - 550.0).steady(knobs)
    assert at_zero.size == before_zero.size > 100
    np.testing.assert_allclose(before_zero, at_zero, rtol=1e-9, atol=1e-9)
