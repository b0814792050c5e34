"""The tuner on the real digital twin: twin evaluator, warm start, and `tierpilot tune` end to end."""
from __future__ import annotations

from pathlib import Path

import optuna
import pytest
from click.testing import CliRunner

from contracts.knobs import Knobs
from simulator.cluster import ClusterSpec
from tuners.cli import tune
from tuners.evaluators import EvaluationCache, TwinEvaluator
from tuners.offline import load_workload
from tuners.planning.warmstart import TwinWarmStart
from tuners.space import Choice, DeploymentLimits, SearchSpace

optuna.logging.set_verbosity(optuna.logging.WARNING)

LIMITS = DeploymentLimits(pods=4, node_memory_headroom_gib=16.0)


@pytest.fixture(scope="module")
def small_workload(traces_dir: Path):
    return load_workload(trace=traces_dir / "mooncake_fast25_synthetic_trace.jsonl", preset=None,
                         max_requests=300)


def test_twin_evaluator_maps_the_replay_summary_and_caches(small_workload) -> None:
    ev = TwinEvaluator(small_workload, ClusterSpec(pods=4), LIMITS, cache=EvaluationCache(), keep_samples=True)
    a = ev.evaluate(Knobs())
    b = ev.evaluate(Knobs())
    assert a is b and ev.replays == 1 and ev.cache.hits == 1
    assert a.requests == 300
    assert 0 < a.ttft_p50_s <= a.ttft_p95_s
    assert 0.0 <= a.hit_ratio <= 1.0
    assert a.memory_gib == 5.0 * 4
    assert a.ttft is not None and a.ttft.count == 300
    assert a.ttft.quantile(0.95) == pytest.approx(a.ttft_p95_s)


def test_twin_warm_start_returns_distinct_best_candidates(small_workload) -> None:
    space = SearchSpace((Choice("chunk_tokens", (256, 512)), Choice("router", ("roundrobin", "prefixaware"))),
                        LIMITS)
    cache = EvaluationCache()
    warm = TwinWarmStart(lambda: TwinEvaluator(small_workload, ClusterSpec(pods=4), LIMITS, cache=cache),
                         space, trials=6, sampler="grid", seed=0)
    got = warm.candidates(2)
    assert len(got) == 2 and got[0] != got[1]
    ranked = sorted(cache.items(), key=lambda kv: kv[1].ttft_p95_s)
    assert got[0] == ranked[0][0]  # the twin's best comes first


def test_tune_cli_writes_yaml_and_plots_and_resumes(tmp_path: Path, traces_dir: Path) -> None:
    trace = traces_dir / "mooncake_fast25_synthetic_trace.jsonl"
    db = f"sqlite:///{tmp_path / 'tune.db'}"
    args = ["--trace", str(trace), "--max-requests", "200", "--trials", "6", "--storage", db, "--pods", "4",
            "--node-memory-gib", "8", "-q"]
    res = CliRunner().invoke(tune, [*args, "--plot-dir", str(tmp_path / "plots"), "--out", str(tmp_path / "best.yaml")])
    assert res.exit_code == 0, res.output
    assert "best configuration vs defaults" in res.output
    assert "study now holds 6 trials" in res.output
    best = Knobs.from_yaml_file(tmp_path / "best.yaml")  # what `tierpilot replay --config` reads
    assert best.cpu_gib <= 8
    assert sorted(p.name for p in (tmp_path / "plots").iterdir()) == ["capacity_curves.png", "history.png",
                                                                        "importances.png"]
    assert (tmp_path / "plots" / "history.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    res = CliRunner().invoke(tune, args)  # same study again: resumed, not replaced
    assert res.exit_code == 0, res.output
    assert "study now holds 12 trials" in res.output


def test_tune_cli_errors_are_clear(tmp_path: Path) -> None:
    res = CliRunner().invoke(tune, ["--trials", "2"])
    assert res.exit_code != 0 and "exactly one of --trace PATH or --workload NAME" in res.output
    res = CliRunner().invoke(tune, ["--workload", "nope", "--trials", "2", "--storage",
                                    f"sqlite:///{tmp_path / 'x.db'}"])
    assert res.exit_code != 0 and "'nope' is not one of" in res.output
    assert all(f"'{name}'" in res.output for name in ("rag", "sessions", "shift", "short"))
