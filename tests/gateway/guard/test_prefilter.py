"""The scanner's shared prefilter (``gateway.guard.prefilter``) and the literals it is built from
(``gateway.guard.secrets.starts``): with it, every rule finds exactly what it finds without it,
under any chunking; a literal cut by the end of the text holds its rules; rules sharing a
position, or compared ignoring case, each get their occurrence."""

from __future__ import annotations

import dataclasses
import re

import regex
from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.guard.detectors import BUILTIN, Detector, builtin, custom
from gateway.guard.literals import first_chars, never_after_alnum, starts
from gateway.guard.prefilter import FirstChars, Prefilter
from gateway.guard.scanner import ChannelScanner
from gateway.guard.secrets import secret_rules
from tests.gateway.guard.test_scanner import PLANTED as PLANTED_BUILTIN
from tests.gateway.guard.test_scanner import chunked
from tests.gateway.guard.test_secrets import CASES


def rule(pattern: str) -> Detector:
    literals, folded = starts(pattern)
    return Detector("secret_key", "[S]", regex.compile(pattern), 64, starts=literals,
                    starts_folded=folded)  # fmt: skip


def test_the_literals_every_match_starts_with() -> None:
    assert starts(r"(?:ghp|gho)_[A-Z]{3}") == (("gho", "ghp"), False)
    assert starts(r"(?i:AKIA)[0-9]{4}") == (("aki",), True)
    assert starts(r"(?<=\W)(?:\[|)sk_[a-z]") == (("[sk", "sk_"), False)
    assert starts(r"x[ab]c") == (("xac", "xbc"), False)
    assert starts(r"[a-z]{5}") == ((), False)  # any of many characters
    assert starts(r"a|bc") == ((), False)  # a match may start with "a" alone: too short to gate
    assert starts(r"\d{3}-x") == ((), False)


def test_a_literal_cut_by_the_end_holds_and_one_absent_lets_the_text_go() -> None:
    gated = rule(r"AKIA[0-9]{4}")
    scanner = ChannelScanner([gated])
    released, found = scanner.feed("some words AK")
    assert (released, found) == (len("some words "), [])  # "AK" may become AKIA
    released, found = scanner.feed("IA1234 done", final=True)
    assert [f.text for f in found] == ["AKIA1234"]
    other = ChannelScanner([gated])
    assert other.feed("nothing to see here ")[0] == len("nothing to see here ")


def test_rules_sharing_a_position_or_folded_each_get_it() -> None:
    short, long_, folded = rule(r"ab[a-z0-9]{2}"), rule(r"abc[0-9]"), rule(r"(?i:AB)c[0-9]")
    assert (short.starts, long_.starts, folded.starts) == (("ab",), ("abc",), ("abc",))
    gate = Prefilter([short, long_, folded])
    text = "x abc1 ABC2"
    # at 2 the search sees "abc", the longest: "ab"'s rule is there too
    assert gate.first(text, {0: 0, 1: 0, 2: 0}, final=True) == {0: 2, 1: 2, 2: 2}
    assert gate.first(text, {0: 3, 1: 3, 2: 3}, final=True) == {2: 7}  # from where each is
    assert [f for f in scan([short, long_], [text])] == [(2, 6, 0, "abc1")]


def ungated(detectors: list[Detector]) -> list[Detector]:
    return [dataclasses.replace(d, starts=()) for d in detectors]


def scan(rules: list[Detector], pieces: list[str]) -> list[tuple[int, int, int, str]]:
    scanner, found = ChannelScanner(rules), []
    for i, piece in enumerate(pieces):
        released, findings = scanner.feed(piece, final=i == len(pieces) - 1)
        found += [(f.start, f.end, f.rule, f.text) for f in findings]
        scanner.drop_before(released)
    return found


PLANTED = [value for positives, _ in CASES.values() for _, value in positives]
NEAR = ["AK", "ghp", "gl", "xox", "sk_", "SG.", "://", "eyJ", "AC", "https://hooks", "Acc"]


@settings(max_examples=200, deadline=None)
@given(st.lists(st.one_of(st.sampled_from(PLANTED), st.sampled_from(NEAR),
                          st.text("ab :/@=\"'_-\nAKCglpx.", max_size=8)), max_size=6),
       st.lists(st.integers(0, 10_000), max_size=20))  # fmt: skip
def test_the_prefilter_changes_nothing_a_rule_finds(parts: list[str], cuts: list[int]) -> None:
    text = " ".join(parts)
    rules = list(secret_rules().values())
    expected = scan(ungated(rules), [text])
    assert scan(rules, [text]) == expected
    assert scan(rules, chunked(text, cuts)) == expected
    assert scan(rules, list(text)) == expected


def test_the_built_in_secret_shapes_and_a_files_regex_are_gated_too() -> None:
    from gateway.guard.detectors import custom

    assert {"AKI", "ghp", "hf_", "eyJ"} <= set(BUILTIN["secret_key"].starts)
    assert BUILTIN["email"].starts == ()  # a local part may start with any word character
    assert custom("ACME-[0-9]{6}").starts == ("ACM",)
    folded = custom("(?i)acme-[0-9]{6}")
    assert (folded.starts, folded.starts_folded) == (("acm",), True)  # a global flag counts
    assert [f[3] for f in scan([folded], ["id ACME-123456 ok"])] == ["ACME-123456"]


# -- the first-character gate ------------------------------------------------------------------


def test_which_patterns_never_start_right_after_a_letter_or_digit() -> None:
    assert never_after_alnum(r"(?<![\w+])\d") and never_after_alnum(r"(?<![A-Za-z0-9-])X")
    assert never_after_alnum(r"(?=\d)(?:(?<!\w)1|(?<![0-9a-zA-Z])2)")  # every way in
    assert not never_after_alnum(r"(?<![a-z])\d")  # capitals and digits may come before
    assert not never_after_alnum(r"(?<!\w)1|2")  # one alternative unguarded
    assert not never_after_alnum(r"\d(?<!\w)")  # after it consumed something: too late
    assert not never_after_alnum(r"(?<![^\w])\d")  # a negated class


def test_the_first_characters_a_match_can_start_with() -> None:
    assert first_chars(r"(?<!\w)\(?\d{3}") == "(0123456789"  # an optional group: and after it
    assert first_chars(r"(?:x|)[A-C]") == "ABCx"  # an alternative may be empty
    assert first_chars(r"(?i:ab)\d") == "Aa"
    assert first_chars(r"(?:\+\d)?[1-3]") == "+123"
    assert first_chars(r"\w+@") == ""  # too wide to gate on
    assert first_chars(r"[^a]b") == ""  # a negated class
    assert first_chars(r"a?") == ""  # may match nothing
    assert first_chars(r"(a)\1") == "a"
    assert first_chars(r"(a)?\1b") == ""  # a back-reference may come first: unknown


def without_first(detectors: list[Detector]) -> list[Detector]:
    return [dataclasses.replace(d, first="", after_alnum=True) for d in detectors]


GATED_RULES = [*BUILTIN.values(), builtin("us_ssn", bare=True),
               builtin("phone", regions=("US", "GB", "JP"))]  # fmt: skip
# digits of other scripts (\d holds them), capitals, the characters phone numbers start with
NEAR_STARTS = "ab XY 019٣１-.@_+()\n#é"  # letters before digits too: "thought4"


@settings(max_examples=300, deadline=None)
@given(st.lists(st.one_of(st.sampled_from([v for vs in PLANTED_BUILTIN.values() for v in vs]),
                          st.text(NEAR_STARTS, max_size=10)), max_size=6),
       st.lists(st.integers(0, 10_000), max_size=20))  # fmt: skip
def test_the_first_character_gate_changes_nothing_a_rule_finds(
    parts: list[str], cuts: list[int]
) -> None:
    text = " ".join(parts)
    assert any(d.first for d in GATED_RULES)
    expected = scan(without_first(GATED_RULES), [text])
    assert scan(GATED_RULES, [text]) == expected
    assert scan(GATED_RULES, chunked(text, cuts)) == expected
    assert scan(GATED_RULES, list(text)) == expected


@settings(max_examples=200, deadline=None)
@given(st.text(NEAR_STARTS + "ssn:", max_size=40))
def test_no_match_or_partial_match_starts_outside_the_first_characters(text: str) -> None:
    for detector in GATED_RULES:
        if not detector.first:
            continue
        for at in range(len(text) + 1):
            m = detector.pattern.match(text, at, partial=True)
            if m is not None and at < len(text):
                assert not text[at].isascii() or text[at] in detector.first, (detector.name, at)


def test_prose_is_decided_by_the_gate_alone() -> None:
    rules = [BUILTIN[n] for n in ("phone", "credit_card", "iban", "us_ssn")]
    gate = FirstChars(rules)
    assert gate.rules == [0, 1, 2, 3]
    assert gate.first("we think it over", {0: 0, 1: 0, 2: 0, 3: 0}) == {}
    # a digit or capital right after a letter or digit starts none of them (their look-behinds)
    assert gate.first(" thought4 iPhone", {0: 0, 1: 0, 2: 0, 3: 0}) == {}
    assert not gate.any(" thought4 iPhone", 0) and gate.any(" thought 4", 0)
    assert gate.first("call 5 Then", {0: 0, 1: 0, 2: 0, 3: 0}) == {0: 5, 1: 5, 2: 7, 3: 5}
    assert gate.first("x ٣ y", {0: 0, 1: 0, 2: 3, 3: 0}) == {0: 2, 1: 2, 3: 2}
    assert FirstChars([BUILTIN["secret_key"], BUILTIN["email"]]).rules == []  # lowercase, wide


# -- a rule decided without its search: an email needs its "@" --------------------------------

EMAILISH = "ab.x+_-%@ é\n0Z"


@settings(max_examples=300, deadline=None)
@given(st.lists(st.one_of(st.sampled_from(PLANTED_BUILTIN["email"]),
                          st.text(EMAILISH, max_size=70)), max_size=5),
       st.lists(st.integers(0, 10_000), max_size=20))  # fmt: skip
def test_the_needed_character_shortcut_changes_nothing_an_email_finds(
    parts: list[str], cuts: list[int]
) -> None:
    email = BUILTIN["email"]
    assert email.needs == ("@",) and email.tail is not None
    rules = [email, BUILTIN["phone"]]
    expected = scan(
        [dataclasses.replace(email, needs=(), tail=None), rules[1]], [text := " ".join(parts)]
    )
    assert scan(rules, [text]) == expected
    assert scan(rules, chunked(text, cuts)) == expected
    assert scan(rules, list(text)) == expected


def test_a_word_that_may_become_an_email_is_held_and_one_too_long_is_not() -> None:
    scanner = ChannelScanner([BUILTIN["email"]])
    assert scanner.feed("write to jane")[0] == len("write to ")  # "jane" may be a local part
    assert scanner.feed(" now ")[0] == len("write to jane now ")
    long_run = ChannelScanner([BUILTIN["email"]])
    assert long_run.feed("x" * 65)[0] == 65  # past 64 characters no local part ends here


def test_the_literal_gate_says_at_once_when_no_literal_is_in_sight() -> None:
    gate = Prefilter([rule(r"AKIA[0-9]{4}"), rule(r"ghp_[a-z]{4}"), rule(r"(?i:xoxb)-\d")])
    assert not gate.any("plain words here ", 0, final=False)
    assert gate.any("words then gh", 0, final=False)  # "gh" may become ghp_
    assert not gate.any("words then gh", 0, final=True)  # ... not once the text has ended
    assert gate.any("a XOXB-1", 0, final=True) and not gate.any("AKIA1234 b", 2, final=True)


# -- secret rules with a needed literal (gateway.guard.secrets.NEEDS) ---------------------------

NEEDING = {name: rule for name, rule in secret_rules().items() if rule.needs}
NEEDING_NEAR = ["A", "AP", "AKC", "AP1", "-us", "-u", "a1" * 16, "12345678", "123456789012", ":",
                'key="', "=", "\n", "\x1f", "é", "٣",
                # the IBM rules' openings, keywords and cut keywords
                "ibm", "IBM_cloud", "cloud-iam", "iam_", "api", "_API-", "ke", "pa", "PASS", "pwd",
                "tok", "token", "secre", "Secret", "cos", "hmac", "ibm-cos_hmac", "[", '["', "'",
                "]", ": ", ":=", "=>", "::", "\u212aey", "\u017fecret", "a" * 44,
                "0123456789abcdef" * 3]  # fmt: skip


def test_the_rules_written_for_a_needed_literal_have_it() -> None:
    """Each of NEEDS still matches the installed rule set's pattern (else it is off)."""
    assert set(NEEDING) == {"artifactory", "mailchimp", "telegram_token", "ibm_cloud_iam",
                            "ibm_cos_hmac"}  # fmt: skip


@settings(max_examples=400, deadline=None)
@given(st.lists(st.one_of(st.sampled_from([v for n in NEEDING for _, v in CASES[n][0]]),
                          st.sampled_from(NEEDING_NEAR),
                          st.text("aA1P:- =\"\n[_'ikKsS", max_size=12)),
                max_size=8),
       st.lists(st.integers(0, 10_000), max_size=20))  # fmt: skip
def test_a_needed_literal_changes_nothing_a_secret_rule_finds(
    parts: list[str], cuts: list[int]
) -> None:
    rules = list(NEEDING.values())
    plain = [dataclasses.replace(r, needs=(), tail=None) for r in rules]
    text = "".join(parts)
    expected = scan(plain, [text])
    assert scan(rules, [text]) == expected
    assert scan(rules, chunked(text, cuts)) == expected
    assert scan(rules, list(text)) == expected
    for pieces in (chunked(text, cuts), list(text)):  # and nothing is held longer or shorter
        assert released(rules, pieces) == released(plain, pieces)


def released(rules: list[Detector], pieces: list[str]) -> list[int]:
    scanner, out = ChannelScanner(rules), []
    for piece in pieces:
        out.append(scanner.feed(piece)[0])
        scanner.drop_before(out[-1])
    return out


def test_a_rule_whose_pattern_changed_runs_its_own_search() -> None:
    from gateway.guard.secrets import NEEDS, _needing

    pattern = regex.compile(NEEDS["mailchimp"].pattern + "|x{3}")
    changed = dataclasses.replace(NEEDING["mailchimp"], needs=(), tail=None, pattern=pattern)
    assert _needing("mailchimp", changed).needs == ()


@settings(max_examples=300, deadline=None)
@given(st.lists(st.text("abAB_-", min_size=1, max_size=5), min_size=1, max_size=8),
       st.text("abAB_- x", max_size=30))  # fmt: skip
def test_the_literals_trie_finds_the_longest_literal_at_every_position(
    words: list[str], text: str
) -> None:
    from gateway.guard.prefilter import trie

    ahead = re.compile("(?=(" + trie(words) + "))")
    found = {m.start(): m.group(1) for m in ahead.finditer(text)}
    expected = {}
    for at in range(len(text)):
        here = [w for w in words if text.startswith(w, at)]
        if here:
            expected[at] = max(here, key=len)
    assert found == expected
    assert trie(["ab", "abc", "b"]) == trie(["b", "abc", "ab"]) == "(?:ab(?:c)?|b)"


# -- the quick path: prose decided for the gated and needing rules at once --------------------

ALL_RULES = [*(BUILTIN[name] for name in ("email", "phone", "credit_card", "iban", "us_ssn",
                                          "secret_key")), *secret_rules().values()]  # fmt: skip
PROSE = ["the", "thought", "word42", "Then", "so", "access", "clarify", "token", "key", "ok.",
         "a-b", "x_y", "(", "é", "\n", "  ", "sk", "gh", "a@", "+1", "4111",
         "y" * 60 + "a1b2" * 3 + "123"]  # past an email's 64: the other tails hold  # fmt: skip


class EachOnItsOwn(ChannelScanner):
    """The scanner without its quick path: every rule decides on its own, every piece."""

    def __init__(self, rules: list[Detector]) -> None:
        super().__init__(rules)
        self._quick = None


def decisions(scanner: ChannelScanner, pieces: list[str]) -> list[tuple[int, list[tuple]]]:
    out = []
    for i, piece in enumerate(pieces):
        released, findings = scanner.feed(piece, final=i == len(pieces) - 1)
        out.append((released, [(f.start, f.end, f.rule, f.text) for f in findings]))
        scanner.drop_before(released)
    return out


@settings(max_examples=300, deadline=None)
@given(st.lists(st.one_of(st.sampled_from(PLANTED), st.sampled_from(NEAR + NEEDING_NEAR),
                          st.sampled_from([v for vs in PLANTED_BUILTIN.values() for v in vs]),
                          st.sampled_from(PROSE), st.text("ab1A :@-_\"'[\né", max_size=8)),
                max_size=10),
       st.lists(st.integers(0, 10_000), max_size=20))  # fmt: skip
def test_the_quick_path_decides_as_each_rule_on_its_own(parts: list[str], cuts: list[int]) -> None:
    """Findings and every release alike, whole, chunked and one character at a time: the
    quick path and the re-levelling after a rule decided on its own change nothing."""
    text = " ".join(parts)
    for pieces in ([text], chunked(text, cuts), list(text)):
        assert decisions(ChannelScanner(ALL_RULES), pieces) == decisions(
            EachOnItsOwn(ALL_RULES), pieces
        )


def test_prose_takes_the_quick_path_and_a_match_passed_returns_to_it() -> None:
    scanner = ChannelScanner(ALL_RULES)
    for word in ["", "we", "should", "check", "the", "thought"]:
        released, _ = scanner.feed(word + " ")
        assert scanner._even  # every gated and needing rule decided by the two searches
        assert released == scanner.end - 1  # only the space: an Artifactory key may follow
    assert scanner.feed("mail jane.doe@exa")[1] == []  # the "@": each rule on its own
    released, findings = scanner.feed("mple.com then")
    assert [f.text for f in findings] == ["jane.doe@example.com"]
    assert scanner._even  # past the match: levelled again
    assert scanner.text(released, scanner.end) == "then"  # may become an email


def test_past_an_emails_64_characters_the_narrower_tails_hold() -> None:
    """A run longer than a local part: the email's tail gives no hold, Mailchimp's (the last
    32 letters and digits) and Telegram's (the last digits) do, though their characters lie
    within the email's."""
    text = "see " + "y" * 60 + "a1b2" * 3 + "123 done"
    pieces = list(text)
    assert decisions(ChannelScanner(ALL_RULES), pieces) == decisions(
        EachOnItsOwn(ALL_RULES), pieces
    )
    scanner = ChannelScanner(ALL_RULES)
    for piece in pieces[: len("see ") + 70]:
        released, _ = scanner.feed(piece)
    assert (released, scanner._even) == (scanner.end - 32, True)


MIXED_RULES = [builtin("phone", regions=("US", "GB", "DE")), builtin("us_ssn", bare=True),
               custom(r"ticket-\d{4}"), custom(r"(?i:ref)#\d{3}"), custom(r"[A-Z]{2}\d{6}"),
               BUILTIN["email"], *list(secret_rules().values())[::3]]  # fmt: skip


@settings(max_examples=200, deadline=None)
@given(st.lists(st.one_of(st.sampled_from(PROSE + NEEDING_NEAR),
                          st.sampled_from(["ticket-1234", "REF#123", "ssn 123456789", "AB123456",
                                           "+44 20 7946 0958", "ticket-12", "re", "tick"]),
                          st.text("ab1A :#@-_\"'\né", max_size=8)), max_size=10),
       st.lists(st.integers(0, 10_000), max_size=20))  # fmt: skip
def test_the_quick_path_holds_for_a_files_own_regexes_and_the_options(
    parts: list[str], cuts: list[int]
) -> None:
    text = " ".join(parts)
    for pieces in (chunked(text, cuts), list(text)):
        assert decisions(ChannelScanner(MIXED_RULES), pieces) == decisions(
            EachOnItsOwn(MIXED_RULES), pieces
        )
