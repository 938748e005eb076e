"""The peers' own detector test cases (``peers.json``, made by ``tools/peercases.py`` with the
repositories and commits it names): Presidio's recognizer tables for the built-in detectors,
and detect-secrets' plugin tests for the secret rules, each through the streaming scanner whole
and one character at a time. Every expected value is found and nothing else, but for the
differences named in ``DIFFERENCES`` (each with its reason, in ``docs/guardrails.md`` too);
every rule flags its true positives and none of its false ones. The coverage table in
``docs/guardrails.md`` is the one these cases give."""

from __future__ import annotations

import json
from collections import Counter, defaultdict
from functools import cache
from importlib.metadata import version
from pathlib import Path
from typing import Any

import pytest

from gateway.guard.detectors import BUILTIN, Detector, builtin
from gateway.guard.secrets import secret_rules
from tests.gateway.guard.test_detectors import both

PEERS = Path(__file__).with_name("peers.json")
DOCS = Path(__file__).parents[3] / "docs" / "guardrails.md"

# Presidio's cases we answer otherwise, on purpose: text -> (what we find, why)
DIFFERENCES: dict[str, tuple[list[str], str]] = {
    "078-051121 07805-1121": (
        [], "US SSN with mixed separators: Presidio's 'very weak' match (score 0-0.3); a "
        "separator is one kind throughout here"),
    "078051121": (
        [], "US SSN as nine bare digits without a context word: Presidio's 'weak' match "
        "(score 0-0.4); here only with `{us_ssn: {bare: true}}` and a context word before it"),
}  # fmt: skip


@cache
def peers() -> dict[str, Any]:
    return json.loads(PEERS.read_text())  # type: ignore[no-any-return]


def detector_for(case: dict[str, Any]) -> Detector:
    if case["detector"] == "phone":
        return builtin("phone", regions=tuple(case["regions"]))
    return BUILTIN[case["detector"]]


def presidio() -> list[dict[str, Any]]:
    return peers()["presidio"]["cases"]  # type: ignore[no-any-return]


def detect_secrets() -> list[dict[str, Any]]:
    return peers()["detect_secrets"]["cases"]  # type: ignore[no-any-return]


def test_the_cases_name_their_source() -> None:
    for key, repository in (("presidio", "microsoft/presidio"),
                            ("detect_secrets", "Yelp/detect-secrets")):  # fmt: skip
        source = peers()[key]
        assert source["repository"] == repository and len(source["commit"]) == 40
    assert peers()["detect_secrets"]["ref"] == f"v{version('detect-secrets')}"  # the rules in use
    assert len(presidio()) > 350 and len(detect_secrets()) > 250


@pytest.mark.parametrize("case", presidio(), ids=lambda c: f"{c['detector']}:{c['text'][:40]}")
def test_presidios_cases(case: dict[str, Any]) -> None:
    found = both(detector_for(case), case["text"])  # and the same one character at a time
    expected = DIFFERENCES.get(case["text"], (case["values"], ""))[0]
    assert found == expected, case


@pytest.mark.parametrize("case", detect_secrets(), ids=lambda c: f"{c['rule']}:{c['text'][:40]}")
def test_detect_secrets_cases(case: dict[str, Any]) -> None:
    found = both(secret_rules()[case["rule"]], case["text"])
    assert bool(found) == case["flag"], case


def test_every_difference_is_a_case_and_in_the_docs() -> None:
    texts = {c["text"] for c in presidio()}
    docs = DOCS.read_text()
    for text, (_, why) in DIFFERENCES.items():
        assert text in texts
        assert f"`{text}`" in docs and why.split(":")[0] in docs


def coverage() -> str:
    """The table ``docs/guardrails.md`` holds: per detector and per rule, what the peers' cases
    expect found and what is, and negatives (texts where nothing is expected) touched."""
    rows: dict[tuple[str, str], list[int]] = defaultdict(lambda: [0, 0, 0, 0])
    for case in presidio():
        row = rows[("Presidio", case["detector"])]
        found = both(detector_for(case), case["text"])
        row[0] += len(case["values"])
        row[1] += sum((Counter(found) & Counter(case["values"])).values())
        row[2] += not case["values"]
        row[3] += bool(found) and not case["values"]
    for case in detect_secrets():
        row = rows[("detect-secrets", case["rule"])]
        found = bool(both(secret_rules()[case["rule"]], case["text"]))
        row[0] += case["flag"]
        row[1] += found and case["flag"]
        row[2] += not case["flag"]
        row[3] += found and not case["flag"]
    lines = ["| cases of | detector or rule | expected found | negatives touched |",
             "|---|---|---|---|"]  # fmt: skip
    for (source, name), (expected, hit, negatives, touched) in sorted(rows.items()):
        lines.append(f"| {source} | `{name}` | {hit} of {expected} | {touched} of {negatives} |")
    return "\n".join(lines)


def test_the_docs_coverage_table_is_what_the_cases_give() -> None:
    table = coverage()
    assert table in DOCS.read_text(), f"docs/guardrails.md's coverage table is stale:\n{table}"
