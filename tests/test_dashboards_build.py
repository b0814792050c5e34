"""Generated files are exactly what the source renders: no hand-edited drift."""
from __future__ import annotations

import json

import pytest
from click.testing import CliRunner
from pydantic import ValidationError

from agent.cli import main
from dashboards import build
from dashboards.settings import BuildSettings, SloSettings
from tests.conftest import REPO_ROOT


def test_committed_files_match_a_fresh_render():
    drift = build.check(REPO_ROOT, BuildSettings())
    assert drift == [], "run `tierpilot dashboards build`: " + ", ".join(f"{d.path} ({d.reason})" for d in drift)


def test_rendering_is_deterministic():
    assert build.render_all(BuildSettings()) == build.render_all(BuildSettings())


def test_check_reports_edited_missing_and_stale_files(tmp_path):
    settings = BuildSettings()
    build.write(tmp_path, settings)
    assert build.check(tmp_path, settings) == []
    overview = tmp_path / build.DASHBOARD_DIR / "tierpilot-overview.json"
    edited = json.loads(overview.read_text())
    edited["panels"][0]["title"] = "hand edit"
    overview.write_text(json.dumps(edited))
    (tmp_path / build.RULES_FILE).unlink()
    (tmp_path / build.DASHBOARD_DIR / "old.json").write_text("{}")
    reasons = {str(d.path): d.reason for d in build.check(tmp_path, settings)}
    assert reasons == {
        "dashboards/json/tierpilot-overview.json": "differs from the source",
        "dashboards/alerts/tierpilot.rules.yaml": "missing",
        "dashboards/json/old.json": "not produced by the source",
    }
    build.write(tmp_path, settings)
    assert build.check(tmp_path, settings) == []
    assert not (tmp_path / build.DASHBOARD_DIR / "old.json").exists()


def test_cli_build_and_check(tmp_path):
    runner = CliRunner()
    result = runner.invoke(main, ["dashboards", "build", "--root", str(tmp_path)])
    assert result.exit_code == 0, result.output
    assert result.output.count("wrote ") == len(build.render_all(BuildSettings()))
    result = runner.invoke(main, ["dashboards", "build", "--root", str(tmp_path), "--check"])
    assert result.exit_code == 0 and "match the source" in result.output
    result = runner.invoke(main, ["dashboards", "build", "--root", str(tmp_path), "--check", "--ttft-slo", "2"])
    assert result.exit_code == 1
    assert "DRIFT dashboards/alerts/tierpilot.rules.yaml: differs from the source" in result.output


def test_bad_settings_name_the_field():
    with pytest.raises(ValidationError, match="objective"):
        SloSettings(objective=1.5)
    with pytest.raises(ValidationError, match="must not contain '#'"):
        BuildSettings(runbook_base_url="https://x/runbooks.md#top")
    result = CliRunner().invoke(main, ["dashboards", "build", "--check", "--ttft-slo", "-1"])
    assert result.exit_code == 2 and "ttft_seconds" in result.output
