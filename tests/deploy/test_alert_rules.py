"""deploy/prometheus/thinkgate-rules.yaml: promtool accepts it, its unit tests
(tests/deploy/rules_test.yaml) pass, every alert carries what on-call needs, is tested firing
and not firing, and reads only metrics the gateway really exports."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.deploy.promql import Catalogue, metric_names, run_promtool, scrape_catalogue

ROOT = Path(__file__).resolve().parents[2]
RULES = ROOT / "deploy" / "prometheus" / "thinkgate-rules.yaml"
RULES_TEST = Path(__file__).with_name("rules_test.yaml")
RUNBOOK = "https://github.com/thinkgate/thinkgate/blob/main/docs/operating.md"
# The alerts the operators asked for, each tested in rules_test.yaml.
REQUIRED = {
    "ThinkgateTTFTAboveSLO",
    "ThinkgateUpstreamKVCacheSaturated",
    "ThinkgateHighErrorRate",
    "ThinkgateLedgerSpoolNotEmpty",
    "ThinkgateNoCheckpoint",
    "ThinkgateRateLimitFallbackActive",
}


def alerts() -> list[dict[str, Any]]:
    groups = yaml.safe_load(RULES.read_text())["groups"]
    return [rule for group in groups for rule in group["rules"] if "alert" in rule]


def test_promtool_accepts_the_rules() -> None:
    result = run_promtool("check", "rules", RULES)
    assert result.returncode == 0, result.stdout + result.stderr


def test_the_rules_unit_tests_pass() -> None:
    result = run_promtool("test", "rules", RULES_TEST)
    assert result.returncode == 0, result.stdout + result.stderr


def test_every_required_alert_is_there() -> None:
    assert {rule["alert"] for rule in alerts()} >= REQUIRED


@pytest.mark.parametrize("rule", alerts(), ids=lambda rule: rule["alert"])
def test_each_alert_says_how_bad_what_and_where_to_look(rule: dict[str, Any]) -> None:
    assert rule["labels"]["severity"] in ("critical", "warning")
    annotations = rule["annotations"]
    assert annotations["summary"].strip() and annotations["description"].strip()
    assert annotations["runbook"] == RUNBOOK


def test_each_alert_is_tested_firing_and_quiet() -> None:
    cases: dict[str, list[bool]] = {}
    for group in yaml.safe_load(RULES_TEST.read_text())["tests"]:
        for case in group["alert_rule_test"]:
            cases.setdefault(case["alertname"], []).append(bool(case["exp_alerts"]))
    for rule in alerts():
        assert set(cases.get(rule["alert"], [])) == {True, False}, rule["alert"]


def test_the_unit_tests_feed_only_exported_names(exported: Catalogue) -> None:
    series = [
        entry["series"]
        for group in yaml.safe_load(RULES_TEST.read_text())["tests"]
        for entry in group["input_series"]
    ]
    names = set().union(*(metric_names(selector) for selector in series))
    assert exported.missing(names) == []


def test_the_rules_read_only_exported_metrics(exported: Catalogue) -> None:
    names = set().union(*(metric_names(rule["expr"]) for rule in alerts()))
    assert names, "no metric names found in the rules"
    missing = exported.missing(names)
    assert missing == [], f"the rules read metrics the gateway does not export: {missing}"


@pytest.fixture
async def exported(tmp_path: Path) -> Catalogue:
    return await scrape_catalogue(tmp_path)
