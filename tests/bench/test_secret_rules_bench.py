"""``bench.secret_rules`` measures what it says: the four rule sets differ only as named (the
rule set added or not, the scanner's gates on or off), and a round scans every token."""

from __future__ import annotations

from bench.secret_rules import main, per_token, rule_sets
from gateway.guard.detectors import BUILTIN
from gateway.guard.secrets import secret_rules


def test_the_rule_sets_differ_only_as_named() -> None:
    sets = rule_sets()
    assert len(sets["built-ins"]) == len(BUILTIN)
    assert len(sets["built-ins + secret_rules"]) == len(BUILTIN) + len(secret_rules())
    assert any(rule.starts for rule in sets["built-ins + secret_rules"])
    assert any(rule.first for rule in sets["built-ins"]) and any(r.needs for r in sets["built-ins"])
    off = sets["built-ins + secret_rules, gates off"]
    assert not any(rule.starts or rule.first or rule.needs for rule in off)
    on = sets["built-ins + secret_rules"]
    assert [r.pattern for r in on] == [r.pattern for r in off]


def test_a_run_reports_every_set(capsys: object) -> None:
    assert per_token(rule_sets()["built-ins"], ["a ", "b "]) > 0
    main(["--tokens", "20", "--rounds", "1"])
    out = capsys.readouterr().out  # type: ignore[attr-defined]
    assert all(f"| {name} |" in out for name in rule_sets())
