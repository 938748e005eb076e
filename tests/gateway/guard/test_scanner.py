"""The guard's detectors and its streaming scanner: every planted value is found, under every
chunking the same findings as the whole text, and nothing across the reasoning/answer boundary."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.guard.detectors import BUILTIN, custom, iban, luhn
from gateway.guard.policy import parse
from gateway.guard.scanner import ChannelScanner, Finding
from gateway.guard.stream import ChoiceGuard
from gateway.relay.choice import ChoiceState
from gateway.relay.formats import BUILTIN as FORMATS

PLANTED = {
    "email": ["jane.doe@example.com", "ops+alerts@mail.acme-corp.co.uk", "x_y@b.io"],
    "phone": ["+1 415-555-0132", "(415) 555-0198", "+44 20 7946 0958"],
    "credit_card": ["4111 1111 1111 1111", "5500-0000-0000-0004", "378282246310005"],
    "iban": ["GB82 WEST 1234 5698 7654 32", "DE89370400440532013000"],
    "us_ssn": ["123-45-6789", "078-05-1120"],
    "secret_key": [
        "AKIAIOSFODNN7EXAMPLE",
        "ghp_" + "a1B2" * 9,
        "sk-proj-" + "Zx9_" * 8,
        "xoxb-123456789012-abcdefABCDEF",
        "-----BEGIN RSA PRIVATE KEY-----",
    ],
}
RULES = list(BUILTIN.values())
# filler that comes close to every detector: digits, separators, @, dots, capitals, dashes
FILLER = st.text(alphabet="abcXYZ 019-.@_+()\n", max_size=12)


def scan(text_pieces: list[str]) -> list[tuple[int, int, str, str]]:
    scanner = ChannelScanner(RULES)
    found: list[Finding] = []
    for i, piece in enumerate(text_pieces):
        released, findings = scanner.feed(piece, final=i == len(text_pieces) - 1)
        found += findings
        scanner.drop_before(released)
    return [(f.start, f.end, RULES[f.rule].name, f.text) for f in found]


def chunked(text: str, cuts: list[int]) -> list[str]:
    points = sorted({c % (len(text) + 1) for c in cuts})
    bounds = [0, *points, len(text)]
    return [text[a:b] for a, b in itertools.pairwise(bounds)] or [""]


Planted = list[tuple[str, str, int]]  # detector, value, offset


@st.composite
def planted_texts(draw: st.DrawFn) -> tuple[str, Planted]:
    text, planted = "", []
    for _ in range(draw(st.integers(1, 5))):
        text += draw(FILLER) + " "
        name = draw(st.sampled_from(sorted(PLANTED)))
        value = draw(st.sampled_from(PLANTED[name]))
        planted.append((name, value, len(text)))
        text += value + " "
    return text + draw(FILLER), planted


@settings(max_examples=300, deadline=None)
@given(planted_texts(), st.lists(st.integers(0, 10_000), max_size=30))
def test_any_chunking_finds_what_the_whole_text_has(
    case: tuple[str, Planted], cuts: list[int]
) -> None:
    text, planted = case
    whole = scan([text])
    assert scan(chunked(text, cuts)) == whole
    assert scan(list(text)) == whole  # one character at a time
    covered = {i for start, end, _, _ in whole for i in range(start, end)}
    for name, value, at in planted:  # every character covered: nothing of it would be left
        # (by its own detector, by a wider one, or by several: a phone number that took a
        # card's first digits, and the card's rest)
        assert set(range(at, at + len(value))) <= covered, (
            f"{name} {value!r} not covered in {text!r}: {whole}"
        )


@settings(max_examples=200, deadline=None)
@given(st.text(max_size=200), st.lists(st.integers(0, 10_000), max_size=20))
def test_arbitrary_text_scans_the_same_in_pieces(text: str, cuts: list[int]) -> None:
    assert scan(chunked(text, cuts)) == scan([text])


def test_validators_keep_only_real_numbers() -> None:
    assert luhn("4111 1111 1111 1111") and not luhn("4111 1111 1111 1112")
    assert iban("GB82 WEST 1234 5698 7654 32") and not iban("GB83 WEST 1234 5698 7654 32")
    assert scan(["card 4111 1111 1111 1112 and ssn 666-12-3456, 000-12-3456."]) == []
    assert scan(["call 555-0100 now"]) == []  # too short to be a valid number


def test_a_custom_regex_is_bounded_and_never_empty() -> None:
    acme = custom("ACME-[0-9]{6}", label="[ACME]", max_length=16)
    scanner = ChannelScanner([acme])
    assert scanner.feed("id ACME-12345")[1] == []
    released, findings = scanner.feed("6 ok", final=True)
    assert [f.text for f in findings] == ["ACME-123456"] and released == len("id ACME-123456 ok")
    with pytest.raises(ValueError, match="empty"):
        custom("x*")
    with pytest.raises(ValueError, match="compile"):
        custom("(")


POLICIES = parse(
    """
policies:
  - name: pii
    detect: [email, credit_card, phone]
    action: redact
"""
).policies

# Each text-split family's markers: (before the reasoning, between reasoning and answer).
FAMILIES = {
    name: ("" if fmt.opened else (fmt.open or ""), fmt.close or "")
    for name, fmt in FORMATS.items()
    if fmt.splits
}


def run_choice(family: str, pieces: list[str]) -> tuple[str, str, str, str, list[str]]:
    state = ChoiceState.start(FORMATS[family], "text", thinking=True, repair_leak=False,
                              guard=ChoiceGuard(POLICIES))  # fmt: skip
    shown_r, shown_c = [], []
    for i, piece in enumerate(pieces):
        r, c = state.take(piece, None, final=i == len(pieces) - 1)
        shown_r.append(r)
        shown_c.append(c)
    assert state.guard is not None
    acts = [f"{a.channel}:{a.value}" for a in state.guard.acts]
    return "".join(shown_r), "".join(shown_c), "".join(state.reasoning), "".join(
        state.content), acts  # fmt: skip


@settings(max_examples=150, deadline=None)
@given(
    st.sampled_from(sorted(FAMILIES)),
    planted_texts(),
    planted_texts(),
    st.lists(st.integers(0, 10_000), max_size=30),
)
def test_every_family_redacts_each_channel_alike_under_any_chunking(
    family: str,
    reasoning: tuple[str, Planted],
    answer: tuple[str, Planted],
    cuts: list[int],
) -> None:
    opening, close = FAMILIES[family]
    text = f"{opening}{reasoning[0]}{close}{answer[0]}"
    whole = run_choice(family, [text])
    assert run_choice(family, chunked(text, cuts)) == whole
    shown_r, shown_c, kept_r, kept_c, acts = whole
    for channel, shown, kept, planted in (("reasoning", shown_r, kept_r, reasoning[1]),
                                          ("answer", shown_c, kept_c, answer[1])):  # fmt: skip
        for name, value, _ in planted:
            if name in ("email", "credit_card", "phone"):
                assert value not in shown and value not in kept
                assert any(act.startswith(f"{channel}:") and value in act for act in acts)


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_a_value_split_by_the_boundary_is_neither_channels(family: str) -> None:
    opening, close = FAMILIES[family]
    text = f"{opening}write to jane.doe@exa{close}mple.com please"
    for pieces in ([text], list(text)):
        shown_r, shown_c, _, _, acts = run_choice(family, pieces)
        assert acts == []  # neither "jane.doe@exa" (no TLD) nor "mple.com" is an address
        assert shown_r.endswith("jane.doe@exa") and shown_c.startswith("mple.com")
