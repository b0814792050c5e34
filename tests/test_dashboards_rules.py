"""Alert rules: promtool accepts them, promtool unit tests cover every alert both ways, the
PrometheusRule carries exactly the same rules, and every runbook link lands on a real section."""
from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from dashboards import alert_rules, build
from dashboards.rulefile import Alert, Group, Record, RuleError, alerts, rules_document
from dashboards.settings import BuildSettings
from tests.conftest import REPO_ROOT

PROMTOOL = shutil.which("promtool") or "/usr/bin/promtool"
RULES = REPO_ROOT / build.RULES_FILE
PROMETHEUS_RULE = REPO_ROOT / build.PROMETHEUS_RULE_FILE
UNIT_TESTS = sorted((REPO_ROOT / "tests" / "rules").glob("*.yaml"))
RUNBOOKS = REPO_ROOT / "docs" / "runbooks.md"
SETTINGS = BuildSettings()
ALERTS = alerts(alert_rules.groups(SETTINGS))


def promtool(*args: str) -> subprocess.CompletedProcess[str]:
    if not Path(PROMTOOL).exists():
        pytest.skip("promtool not installed; run `make setup`")
    return subprocess.run([PROMTOOL, *args], check=False, capture_output=True, text=True, timeout=120)


def test_promtool_check_rules_accepts_the_rules_file():
    result = promtool("check", "rules", str(RULES))
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"SUCCESS: {sum(len(g.rules) for g in alert_rules.groups(SETTINGS))} rules found" in result.stdout


def test_prometheusrule_spec_is_the_same_rules_and_passes_promtool(tmp_path):
    wrapped = yaml.safe_load(PROMETHEUS_RULE.read_text())
    assert wrapped["apiVersion"] == "monitoring.coreos.com/v1" and wrapped["kind"] == "PrometheusRule"
    assert wrapped["spec"] == yaml.safe_load(RULES.read_text())
    spec = tmp_path / "spec.yaml"
    spec.write_text(yaml.safe_dump(wrapped["spec"]))
    result = promtool("check", "rules", str(spec))
    assert result.returncode == 0, result.stdout + result.stderr


def test_promtool_unit_tests_pass():
    assert UNIT_TESTS, "no promtool tests in tests/rules/"
    result = promtool("test", "rules", *map(str, UNIT_TESTS))
    assert result.returncode == 0, result.stdout + result.stderr


def test_a_wrong_expectation_makes_promtool_fail(tmp_path):
    """The unit tests can fail: flip one expected 'fires' into 'silent' and promtool must say so."""
    original = (REPO_ROOT / "tests" / "rules" / "tierpilot_test.yaml").read_text()
    broken = yaml.safe_load(original)
    case = next(t for t in broken["tests"] if t["name"].startswith("eviction storm fires"))
    firing = next(a for a in case["alert_rule_test"] if a["exp_alerts"])
    firing["exp_alerts"] = []
    broken["rule_files"] = [str(RULES)]
    broken["tests"] = [case]
    path = tmp_path / "broken_test.yaml"
    path.write_text(yaml.safe_dump(broken))
    result = promtool("test", "rules", str(path))
    assert result.returncode == 1
    assert "TierpilotEvictionStorm" in result.stdout + result.stderr


def test_every_alert_has_a_firing_and_a_silent_unit_test():
    fires: set[str] = set()
    silent: set[str] = set()
    for path in UNIT_TESTS:
        for case in yaml.safe_load(path.read_text())["tests"]:
            for check in case.get("alert_rule_test", []):
                (fires if check.get("exp_alerts") else silent).add(check["alertname"])
    names = {a.alert for a in ALERTS}
    assert names - fires == set(), f"alerts never shown firing: {sorted(names - fires)}"
    assert names - silent == set(), f"alerts never shown silent: {sorted(names - silent)}"


def test_the_issue_alert_set_is_present():
    names = {a.alert for a in ALERTS}
    assert {"TierpilotTTFTBudgetBurnFast", "TierpilotTTFTBudgetBurnSlow", "TierpilotHitRatioCollapse",
            "TierpilotL2LatencyHigh", "TierpilotEvictionStorm", "TierpilotScrapeTargetsDown",
            "TierpilotTunerRollbackStorm", "TierpilotAgentStale", "TierpilotAgentDown",
            "TierpilotNoLeader"} <= names


def github_anchor(heading: str) -> str:
    return re.sub(r"[^a-z0-9 _-]", "", heading.strip().lower()).replace(" ", "-")


def test_every_alert_links_a_runbook_section_that_explains_it():
    text = RUNBOOKS.read_text()
    sections = {github_anchor(h): body for h, body in
                re.findall(r"^## (.+?)\n(.*?)(?=^## |\Z)", text, flags=re.DOTALL | re.MULTILINE)}
    document = yaml.safe_load(RULES.read_text())
    for group in document["groups"]:
        for rule in group["rules"]:
            if "alert" not in rule:
                continue
            ann = rule["annotations"]
            assert ann["summary"] and ann["description"], rule["alert"]
            base, _, anchor = ann["runbook_url"].partition("#")
            assert base == SETTINGS.runbook_base_url and base.endswith("docs/runbooks.md")
            assert anchor in sections, f"{rule['alert']}: no section #{anchor} in docs/runbooks.md"
            body = sections[anchor]
            for part in ("**What it means.**", "**How to confirm.**", "**What to do.**"):
                assert part in body, f"runbook #{anchor} lacks {part}"


def test_runbook_base_url_and_slo_settings_flow_into_the_rules():
    custom = BuildSettings(runbook_base_url="https://wiki.example/tierpilot/runbooks.md",
                           slo={"ttft_seconds": 0.5, "objective": 0.995})
    doc = rules_document(alert_rules.groups(custom), custom.runbook_base_url)
    slo = doc["groups"][0]
    assert slo["rules"][0]["expr"] == ("(\n  histogram_quantile(\n    0.95,\n    sum by (namespace, model, le) "
                                      "(rate(tierpilot_ttft_seconds_bucket[5m]))\n  )\n  > bool 0.5\n)")
    fast = next(r for r in slo["rules"] if r.get("alert") == "TierpilotTTFTBudgetBurnFast")
    assert "ratio_avg1h > 0.072" in fast["expr"]  # 14.4 x (1 - 0.995)
    assert fast["annotations"]["runbook_url"] == \
        "https://wiki.example/tierpilot/runbooks.md#tierpilotttftbudgetburnfast"


def test_rule_records_validate_their_names_and_fields():
    with pytest.raises(RuleError, match="CamelCase"):
        Alert("tierpilot_bad", "up == 0", "warning", "s", "d", "a")
    with pytest.raises(RuleError, match="runbook is required"):
        Alert("TierpilotX", "up == 0", "warning", "s", "d", " ")
    with pytest.raises(RuleError, match="not a duration"):
        Alert("TierpilotX", "up == 0", "warning", "s", "d", "a", for_="5 minutes")
    with pytest.raises(RuleError, match="level:metric:operations"):
        Record("no_colons", "up")
    dup = (Group("g", (Alert("TierpilotX", "up", "info", "s", "d", "a"),)),
           Group("h", (Alert("TierpilotX", "up", "info", "s", "d", "a"),)))
    with pytest.raises(RuleError, match="duplicate alert names"):
        rules_document(dup, "u")
