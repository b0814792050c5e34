"""Tune to apply, safely: the targets file bounds the search, `k8s check --config` validates a
configuration offline with the reason for each refusal, a study is never resumed under other
settings, and memory has a stated price in the default objective."""
from __future__ import annotations

import pytest
import yaml
from click.testing import CliRunner

from agent.cli import main
from agent.k8s.mapping import load_mappings
from agent.k8s.offline import acceptance, refusals
from agent.k8s.settings import load_settings
from contracts.knobs import Knobs
from tests.conftest import REPO_ROOT
from tuners.objective import Evaluation, ObjectiveSpec
from tuners.optuna_tuner import OptunaTuner, StudySettingsError
from tuners.space import DeploymentLimits, SearchSpace

STACK = REPO_ROOT / "deploy" / "overlays" / "production-stack" / "targets.yaml"
PLAIN = REPO_ROOT / "deploy" / "overlays" / "plain-vllm" / "targets.yaml"
S3FIFO = Knobs(l2_eviction="s3fifo", l2_high_watermark=0.9, l2_low_watermark=0.8, router="prefixaware")


def test_acceptance_follows_the_mapping_of_each_target():
    acc = acceptance(load_settings(STACK), load_mappings())
    assert acc.accepts["l2_eviction"] == ("lru", "lfu")  # Curvine quota eviction
    assert acc.accepts["cpu_gib"] is None  # a number: any value
    plain = acceptance(load_settings(PLAIN), load_mappings())
    assert "router" not in plain.accepts and plain.fixed["router"] == "roundrobin"


def test_the_space_proposes_only_what_the_targets_accept():
    acc = acceptance(load_settings(PLAIN), load_mappings(), source="plain.yaml")
    space = SearchSpace.from_limits(DeploymentLimits()).for_targets(acc)
    names = {d.name for d in space.dimensions}
    assert "router" not in names and {"chunk_tokens", "l2_eviction", "l2_watermarks"} <= names
    assert next(d for d in space.dimensions if d.name == "l2_eviction").values == ("lru", "lfu")
    for knobs in list(space.iter_grid())[:200]:
        assert refusals(load_settings(PLAIN), load_mappings(), knobs) == [], knobs
    problems = space.violations(Knobs(router="prefixaware"))
    assert any("no target in plain.yaml owns router" in p for p in problems), problems
    assert space.violations(S3FIFO.replace(router="roundrobin"))  # s3fifo: not a Curvine policy


def test_k8s_check_config_names_each_refusal(tmp_path):
    best = tmp_path / "best.yaml"
    best.write_text(yaml.safe_dump({"knobs": S3FIFO.to_dict(), "tuned": {"study": "x"}}))
    result = CliRunner().invoke(main, ["k8s", "check", "--targets", str(STACK), "--config", str(best)])
    assert result.exit_code == 1
    assert ("refused: curvine-configmap llm/curvine-config: l2_eviction='s3fifo' cannot be expressed as "
            "master.quota_eviction_policy; supported: lru, lfu") in result.output
    plain = CliRunner().invoke(main, ["k8s", "check", "--targets", str(PLAIN), "--config", str(best)])
    assert plain.exit_code == 1 and "router='prefixaware': no target owns router" in plain.output
    good = tmp_path / "good.yaml"
    good.write_text(Knobs(l2_eviction="lfu", router="kvaware").to_yaml())
    ok = CliRunner().invoke(main, ["k8s", "check", "--targets", str(STACK), "--config", str(good)])
    assert ok.exit_code == 0 and "every value is accepted" in ok.output


def test_a_study_is_not_resumed_under_other_settings(tmp_path):
    url = f"sqlite:///{tmp_path / 's.db'}"
    space = SearchSpace.from_limits(DeploymentLimits())
    tuner = OptunaTuner(space, storage=url, study_name="s", settings={"pods": 4})
    tuner.tell(tuner.ask(), Evaluation(0.1, 0.2, 0.5, 20.0, requests=10))
    OptunaTuner(space, storage=url, study_name="s", settings={"pods": 4})  # same settings: resumed
    with pytest.raises(StudySettingsError, match=r"pods: 4 -> 8.*--new-study"):
        OptunaTuner(space, storage=url, study_name="s", settings={"pods": 8})
    curvine = SearchSpace.from_limits(DeploymentLimits(l2_backend="curvine"))
    with pytest.raises(StudySettingsError, match=r"space.l2_eviction: one of lru, lfu, fifo, s3fifo, arc -> "
                                                 r"one of lru, lfu"):
        OptunaTuner(curvine, storage=url, study_name="s", settings={"pods": 4})


def test_tune_cli_refuses_a_changed_study_and_starts_a_new_one_on_request(tmp_path):
    args = ["tune", "--workload", "rag", "--max-requests", "60", "--trials", "1", "-q",
            "--storage", f"sqlite:///{tmp_path / 't.db'}", "--targets", str(STACK)]
    first = CliRunner().invoke(main, [*args, "--out", str(tmp_path / "best.yaml")])
    assert first.exit_code == 0, first.output
    check = CliRunner().invoke(main, ["k8s", "check", "--targets", str(STACK), "--config", str(tmp_path / "best.yaml")])
    assert check.exit_code == 0, check.output
    changed = CliRunner().invoke(main, [*args, "--pods", "8"])
    assert changed.exit_code == 1 and "pods: 4 -> 8" in changed.output and "--new-study" in changed.output
    fresh = CliRunner().invoke(main, [*args, "--pods", "8", "--new-study"])
    assert fresh.exit_code == 0 and "starting 'tune-rag-2'" in fresh.output


def test_memory_has_a_stated_price_in_the_default_objective():
    spec = ObjectiveSpec()
    lean = Evaluation(ttft_p50_s=0.5, ttft_p95_s=1.00, hit_ratio=0.5, memory_gib=20.0)
    # the case: 2.6x the fleet's CPU memory for 4% of p95
    fat = Evaluation(ttft_p50_s=0.5, ttft_p95_s=0.96, hit_ratio=0.6, memory_gib=52.0)
    assert spec.values(fat)[0] > spec.values(lean)[0]
    assert spec.values(lean)[0] == pytest.approx(1.0 + 20 * spec.memory_ms_per_gib / 1000)
    assert ObjectiveSpec(memory_ms_per_gib=0).values(fat)[0] < ObjectiveSpec(memory_ms_per_gib=0).values(lean)[0]
    with pytest.raises(ValueError, match="memory_ms_per_gib"):
        ObjectiveSpec(memory_ms_per_gib=-1)
