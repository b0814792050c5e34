"""Configuration of the whole agent: the new sections validate with one error naming the key, the
example in docs/agent.md and every install overlay's shipped config load, the runtime refuses
what cannot be put together, and `tierpilot run` explains itself and reports bad keys."""
from __future__ import annotations

import re

import pytest
import yaml
from click.testing import CliRunner

from agent.cli import main
from agent.runtime.assembly import RuntimeConfigError, actuation_settings, build_runtime
from agent.settings import SettingsError, load_settings
from tests.conftest import REPO_ROOT

OVERLAYS = ("plain-vllm", "production-stack", "hyperpod")


@pytest.mark.parametrize(("data", "key", "says"), [
    ({"tuner": {"objective": "ttft_p99"}}, "tuner.objective", "'ttft_p95' or 'ttft_p50'"),
    ({"tuner": {"sampler": "cmaes"}}, "tuner.sampler", "'tpe', 'random' or 'grid'"),
    ({"tuner": {"guardrails": {"max_changes_per_hour": 0}}}, "tuner.guardrails.max_changes_per_hour",
     "greater than or equal to 1"),
    ({"tuner": {"live": {"window_s": 0}}}, "tuner.live.window_s", "greater than 0"),
    ({"tuner": {"drift": {"signals": ["overlap"]}}}, "tuner.drift.signals.0", "'reuse_ratio'"),
    ({"tuner": {"storage": "tierpilot.db"}}, "tuner.storage", "storage URL"),
    ({"tuner": {"warm_start": {"workload": "trace"}}}, "tuner.warm_start", "needs `trace: PATH`"),
    ({"tuner": {"limits": {"l2_backend": "redis"}}}, "tuner.limits.l2_backend", "'curvine'"),
    ({"tuner": {"planner": {"margin": -0.1}}}, "tuner.planner.margin", "greater than or equal to 0"),
    ({"tuner": {"planner": {"horizon_s": 0}}}, "tuner.planner.horizon_s", "greater than 0"),
    ({"tuner": {"planner": {"enable": True}}}, "tuner.planner.enable", "unknown key"),
    ({"tuner": {"drift": {"track": 1.0}}}, "tuner.drift.track", "less than 1"),
    ({"kv_events": {"endpoints": [{"pod": "p", "model": "m", "endpoint": "tcp://*:5557"}]}},
     "kv_events.endpoints.0.endpoint", "bind address"),
    ({"kv_events": {"enable": True}}, "kv_events.enable", "unknown key"),
    ({"actuation": {"lease": "x"}}, "actuation.lease", "unknown key"),
    ({"dry_run": "maybe"}, "dry_run", "boolean"),
])
def test_a_bad_key_is_one_error_naming_it(tmp_path, data, key, says):
    path = tmp_path / "agent.yaml"
    path.write_text(yaml.safe_dump(data))
    with pytest.raises(SettingsError) as err:
        load_settings(path, env={})
    msg = str(err.value)
    assert msg.startswith(f"{path}: key '{key}': ") and says in msg and "\n" not in msg


def test_environment_overrides_reach_the_new_sections():
    s = load_settings(env={"TIERPILOT_TUNER__ENABLED": "true", "TIERPILOT_DRY_RUN": "true",
                           "TIERPILOT_TUNER__LIVE__WINDOW_S": "120", "TIERPILOT_KV_EVENTS__ENABLED": "1"})
    assert s.tuner.enabled and s.dry_run and s.tuner.live.window_s == 120 and s.kv_events.enabled
    with pytest.raises(SettingsError, match=r"environment TIERPILOT_TUNER__LIVE__WINDOW_S\): key 'tuner.live.window_s'"):
        load_settings(env={"TIERPILOT_TUNER__LIVE__WINDOW_S": "-1"})


def test_the_documented_example_loads(tmp_path):
    text = (REPO_ROOT / "docs" / "agent.md").read_text()
    section = text.split("## Running the whole agent", 1)[1]
    block = re.search(r"```yaml\n(.*?)```", section, re.DOTALL).group(1)
    (tmp_path / "agent.yaml").write_text(block)
    s = load_settings(tmp_path / "agent.yaml", env={})
    assert s.tuner.storage == "sqlite:///tierpilot.db" and s.tuner.drift.signals == ("reuse_ratio",
                                                                                    "prompt_tokens_mean")
    assert s.kv_events.manager_settings().endpoints[0].replay_endpoint == "tcp://10.0.0.5:5600"
    assert s.tuner.planner.enabled and s.tuner.planner.restart_downtime_s == 30 and s.tuner.drift.track == 0.1


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_every_shipped_agent_config_loads_and_tunes_its_targets(overlay):
    """What deploy/ mounts at /etc/tierpilot: agent.yaml plus targets.yaml ($TIERPILOT_K8S_TARGETS)."""
    base = REPO_ROOT / "deploy" / "overlays" / overlay
    settings = load_settings(base / "agent.yaml", env={})
    assert settings.tuner.enabled and settings.kv_events.enabled
    # the Deployment sets the study's $TIERPILOT_TUNER__STORAGE (deploy/base: SQLite on an emptyDir;
    # deploy/components/live-tuning: the PostgreSQL DSN from a Secret)
    dsn = "postgresql+psycopg2://tierpilot@pg:5432/tierpilot"
    assert load_settings(base / "agent.yaml", env={"TIERPILOT_TUNER__STORAGE": dsn}).tuner.storage == dsn
    assert settings.export.fleet == "leader" and settings.actuation.lease_name == "tierpilot-leader"
    act = actuation_settings(settings, {"TIERPILOT_K8S_TARGETS": str(base / "targets.yaml")})
    assert act.namespace == settings.targets.kubernetes.namespace and act.lease.enabled and not act.dry_run
    dry = load_settings(base / "agent.yaml", env={"TIERPILOT_DRY_RUN": "true"})  # the base Deployment's env
    assert dry.dry_run and actuation_settings(dry, {"TIERPILOT_K8S_TARGETS": str(base / "targets.yaml")}).dry_run


def test_the_runtime_refuses_tuning_without_targets(tmp_path):
    settings = load_settings(env={}, tuner={"enabled": True})
    with pytest.raises(RuntimeConfigError, match=r"key 'actuation.targets_file'.*TIERPILOT_K8S_TARGETS"):
        build_runtime(settings, env={})
    bad = tmp_path / "targets.yaml"
    bad.write_text("namespace: llm\ntargets: [{kind: deployment-envs, name: x}]\n")
    settings = load_settings(env={}, tuner={"enabled": True}, actuation={"targets_file": str(bad)})
    with pytest.raises(RuntimeConfigError, match=r"actuation.targets_file: .*targets\.yaml.*unknown kind"):
        build_runtime(settings, env={})


def test_a_scrape_only_runtime_builds_nothing_else():
    rt = build_runtime(load_settings(env={}, server={"host": "127.0.0.1", "port": 0}), env={})
    assert rt.kv is rt.tuning is rt.actuator is rt.elector is None
    assert [j.name for j in rt.agent.jobs] == []


def test_run_help_explains_and_bad_config_is_one_error(tmp_path):
    runner = CliRunner()
    out = runner.invoke(main, ["run", "--help"]).output
    assert "--dry-run" in out and "tuner.enabled" in out and "Lease" in out and "TIERPILOT_<SECTION>__<KEY>" in out
    cfg = tmp_path / "agent.yaml"
    cfg.write_text("tuner:\n  enabled: true\n  cooldown_s: 5\n")
    res = runner.invoke(main, ["run", "--config", str(cfg)], env={})
    assert res.exit_code == 1 and f"{cfg}: key 'tuner.cooldown_s': unknown key" in res.output
    cfg.write_text("tuner: {enabled: true}\n")
    res = runner.invoke(main, ["run", "--config", str(cfg), "--dry-run"], env={})
    assert res.exit_code == 1 and "actuation.targets_file" in res.output

