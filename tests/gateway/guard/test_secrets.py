"""The maintained rule set's secret rules (``gateway.guard.secrets``: detect-secrets' plugins,
bounded): every rule finds its true-positive examples and none of its false-positive ones,
whole and fed one character at a time; the bounding keeps what a pattern means; a policy names
the whole set (``secret_rules``) or single rules (``{secret_key: {rules: [...]}}``); the
credentials the built-in shapes missed are caught."""

from __future__ import annotations

from typing import Any

import pytest
import regex
from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.guard.detectors import BUILTIN, PatternError, widths
from gateway.guard.policy import PolicyFileError, parse
from gateway.guard.scanner import ChannelScanner
from gateway.guard.secrets import CAP, LEFT_OUT, RULESET, bound, secret_rules
from tests.gateway.guard.test_detectors import both
from tests.gateway.guard.test_scanner import chunked

HEX64 = "0123456789abcdef" * 4
B64_88 = "A" * 84 + "bc=="
# rule -> (true positives: (text, the value found), false positives: texts)
CASES: dict[str, tuple[list[tuple[str, str]], list[str]]] = {
    "artifactory": (
        [('token "AKCp8jQ8HzuB4mXiDQ3R" ok', '"AKCp8jQ8HzuB4mXiDQ3R"')],
        ["AKCshort here", "the AKC club"],
    ),
    "aws": (
        [
            ("key AKIAIOSFODNN7EXAMPLE", "AKIAIOSFODNN7EXAMPLE"),
            (
                'aws_secret_access_key = "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY"',
                'aws_secret_access_key = "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY"',
            ),
        ],
        ["AKIA1234", "the aws console"],
    ),
    "azure_storage_key": (
        [(f"AccountName=x;AccountKey={B64_88};", f"AccountKey={B64_88}")],
        ["AccountKey=short", "an account key"],
    ),
    "basic_auth": (
        [("postgresql://app:S3cretPass@db.example.com/app", "://app:S3cretPass@")],
        ["https://example.com/path?q=1", "user: name @ host"],
    ),
    "cloudant": (
        [(f"https://acct:{HEX64}@acct.cloudant.com", f"https://acct:{HEX64}@acct.cloudant.com")],
        ["cloudant is a database", "https://acct@acct.cloudant.com"],
    ),
    "discord": (
        [
            (
                "MTAxMjM0NTY3ODkwMTIzNDU2.GhIjKl.abcdefghijklmnopqrstuvwxyz0",
                "MTAxMjM0NTY3ODkwMTIzNDU2.GhIjKl.abcdefghijklmnopqrstuvwxyz0",
            )
        ],
        ["Mr. Smith wrote a long sentence."],
    ),
    "github_token": (
        [("ghp_" + "a1B2" * 9, "ghp_" + "a1B2" * 9)],
        ["ghp_short", "ghx_" + "a" * 36],
    ),
    "gitlab_token": ([("glpat-" + "xY3_" * 5, "glpat-" + "xY3_" * 5)], ["glpat-short", "gl-pat"]),
    "ibm_cloud_iam": (
        [
            (
                'ibm_cloud_iam_api_key = "' + "aB3-" * 11 + '"',
                'ibm_cloud_iam_api_key = "' + "aB3-" * 11 + '"',
            )
        ],
        ["ibm cloud is a cloud"],
    ),
    "ibm_cos_hmac": (
        [
            (
                f'cos_hmac_secret_access_key = "{"a1" * 24}"',
                f'cos_hmac_secret_access_key = "{"a1" * 24}"',
            )
        ],
        ["secret access key rotation"],
    ),
    "jwt": (
        [
            (
                "Bearer eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxIn0.sig",
                "eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxIn0.sig",
            )
        ],
        ["eyJ alone", "keys: eyJhbGc"],
    ),
    "mailchimp": ([(f"{'a1' * 16}-us12", f"{'a1' * 16}-us12")], ["just-us12", "a1b2-us1"]),
    "npm": (
        [
            (
                "//registry.npmjs.org/:_authToken=npm_" + "A" * 36,
                "//registry.npmjs.org/:_authToken=npm_" + "A" * 36,
            )
        ],
        ["//registry.npmjs.org/ is the registry"],
    ),
    "openai": (
        [("sk-" + "A" * 20 + "T3BlbkFJ" + "b" * 20, "sk-" + "A" * 20 + "T3BlbkFJ" + "b" * 20)],
        ["sk-short", "T3BlbkFJ alone"],
    ),
    "private_key": (
        [("-----BEGIN OPENSSH PRIVATE KEY-----", "BEGIN OPENSSH PRIVATE KEY")],
        ["BEGIN PUBLIC KEY", "a private key"],
    ),
    "pypi_token": (
        [("pypi-AgEIcHlwaS5vcmc" + "x" * 70, "pypi-AgEIcHlwaS5vcmc" + "x" * 70)],
        ["pypi-AgEIcHlwaS5vcmcshort", "pypi.org"],
    ),
    "sendgrid": (
        [("SG." + "a" * 22 + "." + "b" * 43, "SG." + "a" * 22 + "." + "b" * 43)],
        ["SG.short.key", "S.G. Grid"],
    ),
    "slack": (
        [
            ("xoxb-123456789012-abcdef123", "xoxb-123456789012-abcdef123"),
            (
                "https://hooks.slack.com/services/T0001/B0002/XXXXabcd",
                "https://hooks.slack.com/services/T0001/B0002/XXXXabcd",
            ),
        ],
        ["xoxb-", "https://hooks.slack.com/services/"],
    ),
    "softlayer": (
        [
            (
                f"https://api.softlayer.com/soap/v3.1/{HEX64}",
                f"https://api.softlayer.com/soap/v3.1/{HEX64}",
            )
        ],
        ["softlayer is a cloud"],
    ),
    "square_oauth": ([("sq0csp-" + "a" * 43, "sq0csp-" + "a" * 43)], ["sq0csp-short"]),
    "stripe": ([("sk_live_" + "a1" * 12, "sk_live_" + "a1" * 12)], ["sk_live_short", "sk_test_x"]),
    "telegram_token": (
        [("bot 123456789:" + "A" * 35, "123456789:" + "A" * 35)],
        ["at 12:30 today", "123456789:short"],
    ),
    "twilio": (
        [("AC" + "a1" * 16, "AC" + "a1" * 16), ("SK" + "b2" * 16, "SK" + "b2" * 16)],
        ["ACME corp", "SKIP this"],
    ),
}


def test_every_rule_of_the_set_is_imported_or_left_out_with_a_reason() -> None:
    assert ("detect-secrets", RULESET[1]) == RULESET and RULESET[1] >= "1.5"
    assert set(secret_rules()) == set(CASES)  # a new rule in an upgrade needs its cases here
    assert set(LEFT_OUT) == {"ip_public", "keyword", "high_entropy_strings"}


@pytest.mark.parametrize("name", sorted(CASES))
def test_each_rule_finds_its_true_positives_and_none_of_its_false_ones(name: str) -> None:
    rule = secret_rules()[name]
    positives, negatives = CASES[name]
    for text, value in positives:
        assert both(rule, text) == [value], (name, text)
    for text in negatives:
        assert both(rule, text) == [], (name, text)


def test_bounding_keeps_what_a_pattern_means() -> None:
    assert bound(r"a+b*c{2,}") == f"a{{1,{CAP}}}b{{0,{CAP}}}c{{2,{2 + CAP}}}"
    assert bound(r"(?:\d+-)+x") == f"(?:\\d{{1,{CAP}}}-){{1,4}}x"  # a group: a few times
    assert bound(r"[+*]\+\*a*?b{3}+") == f"[+*]\\+\\*a{{0,{CAP}}}?b{{3}}+"  # classes, escapes kept
    assert bound(r"^x$") == r"(?<![^\n])x(?![^\n])"  # line anchors that hold when chunked
    assert bound(r"[]a]+") == f"[]a]{{1,{CAP}}}"
    for rule in secret_rules().values():  # every imported rule is bounded
        assert widths(rule.pattern.pattern)[0] < 2000
    with pytest.raises(PatternError):
        widths("a+")  # what bounding is for


def test_a_line_anchor_holds_however_the_text_is_cut() -> None:
    rule = secret_rules()["artifactory"]
    # the plugin's (?:\s|...|^) takes the newline before it; (?:\s|"|$) the one after
    assert both(rule, "x\nAKCp8jQ8HzuB4mXiDQ3R\nmore") == ["\nAKCp8jQ8HzuB4mXiDQ3R\n"]
    assert both(rule, "AKCp8jQ8HzuB4mXiDQ3R") == ["AKCp8jQ8HzuB4mXiDQ3R"]  # start to end
    assert both(rule, "xAKCp8jQ8HzuB4mXiDQ3R\nmore") == []  # not at a line's start
    anchored = regex.compile(bound(r"^AKC[a-z]{3}$"))
    assert anchored.search("no AKCabc") is None and anchored.search("x\nAKCabc\ny")


@pytest.mark.parametrize(
    ("value", "secret"),
    [("hf_" + "aBcD" * 8 + "ef", "hf_" + "aBcD" * 8 + "ef"),
     ("npm_" + "Z9" * 18, "npm_" + "Z9" * 18),
     ("glpat-" + "xY3_" * 5, "glpat-" + "xY3_" * 5),
     ("https://hooks.slack.com/services/T0001/B0002/XXXXabcd", "T0001/B0002/XXXXabcd"),
     (f"AccountKey={B64_88}", B64_88),
     ("postgresql://user:PASSWORD@host/db", "PASSWORD"),
     ('aws_secret_access_key="wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY"',
      "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY"),
     ("Bearer eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxIn0.c2lnbmF0dXJl", "c2lnbmF0dXJl")],
)  # fmt: skip
def test_the_credentials_the_shapes_missed_are_caught_with_the_rule_set(
    value: str, secret: str
) -> None:
    """Every character of the secret itself is covered, whole and one character at a time."""
    [policy] = parse(
        "policies:\n  - {name: s, action: redact, detect: [secret_key, secret_rules]}\n"
    ).policies
    text = f"the config says {value} there"
    at = text.index(secret)
    for pieces in ([text], list(text)):
        scanner, findings = ChannelScanner(policy.detectors), []
        for i, piece in enumerate(pieces):
            released, found = scanner.feed(piece, final=i == len(pieces) - 1)
            findings += found
            scanner.drop_before(released)
        covered = {i for f in findings for i in range(f.start, f.end)}
        assert set(range(at, at + len(secret))) <= covered, (value, findings)


def test_a_policy_names_single_rules() -> None:
    [policy] = parse(
        "policies:\n  - {name: s, action: redact, detect: [{secret_key: {rules: [github_token,"
        " builtin]}}]}\n"
    ).policies
    assert [d.pattern for d in policy.detectors] == [
        secret_rules()["github_token"].pattern, BUILTIN["secret_key"].pattern]  # fmt: skip
    with pytest.raises(PolicyFileError, match="unknown secret rule 'nope'"):
        parse("policies:\n  - {name: s, action: redact, detect: [{secret_key: {rules: [nope]}}]}\n")


PLANTED = [value for positives, _ in CASES.values() for _, value in positives]


@settings(max_examples=150, deadline=None)
@given(st.lists(st.one_of(st.sampled_from(PLANTED), st.text("ab :/@=\"'_-\nAKCglpx", max_size=8)),
                max_size=6),
       st.lists(st.integers(0, 10_000), max_size=20))  # fmt: skip
def test_the_rule_set_scans_the_same_in_any_pieces(parts: list[str], cuts: list[int]) -> None:
    text = " ".join(parts)
    rules = list(secret_rules().values())
    assert scan(rules, chunked(text, cuts)) == scan(rules, [text])
    assert scan(rules, list(text)) == scan(rules, [text])


def scan(rules: list[Any], pieces: list[str]) -> list[tuple[int, int, int]]:
    scanner, found = ChannelScanner(rules), []
    for i, piece in enumerate(pieces):
        released, findings = scanner.feed(piece, final=i == len(pieces) - 1)
        found += [(f.start, f.end, f.rule) for f in findings]
        scanner.drop_before(released)
    return found
