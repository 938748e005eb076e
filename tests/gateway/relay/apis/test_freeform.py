"""A custom tool's free-form input decoded from the function arguments that carry it
(``gateway.relay.apis.freeform``): whole, one character at a time and under any chunking, what
was released always joins to the input."""

from __future__ import annotations

import orjson
import pytest
from hypothesis import given
from hypothesis import strategies as st

from gateway.errors import LocalProtocolError
from gateway.relay.apis.freeform import MAX_OPENING, InputDecoder

TEXTS = ["", "plain", 'a "quoted" \\ back\\slash', "tab\tnew\nline\r\x00\x1f", "é ✓ 😀 𝄞",
         "*** Begin Patch\n*** Update File: a.py\n@@\n-x = 1\n+x = 2\n*** End Patch\n"]  # fmt: skip


def run(pieces: list[str]) -> tuple[list[str], InputDecoder]:
    decoder = InputDecoder()
    released = [decoder.feed(piece) for piece in pieces]
    released.append(decoder.close())
    return released, decoder


def chunked(text: str, cuts: list[int]) -> list[str]:
    points = sorted({c % (len(text) + 1) for c in cuts})
    return [text[a:b] for a, b in zip([0, *points], [*points, len(text)], strict=True)]


def escaped(text: str) -> str:
    """``text`` as a model may spell it in JSON: every character a ``\\u`` escape (pairs for
    characters beyond the BMP)."""
    units = text.encode("utf-16-be")
    return "".join(f"\\u{units[i]:02x}{units[i + 1]:02x}" for i in range(0, len(units), 2))


SPELLINGS = [
    lambda t: orjson.dumps({"input": t}).decode(),
    lambda t: '{ "input" :\n "' + escaped(t) + '" }',
    lambda t: orjson.dumps({"input": t, "extra": [1, 2]}).decode(),
]


@pytest.mark.parametrize("text", TEXTS)
@pytest.mark.parametrize("spell", SPELLINGS)
def test_whole_and_one_character_at_a_time(text: str, spell: object) -> None:
    arguments = spell(text)  # type: ignore[operator]
    for pieces in ([arguments], list(arguments)):
        released, decoder = run(pieces)
        assert "".join(released) == decoder.input == text


@given(st.text(), st.lists(st.integers(min_value=0), max_size=12), st.sampled_from(SPELLINGS))
def test_any_chunking_releases_the_input_once(text: str, cuts: list[int], spell: object) -> None:
    arguments = spell(text)  # type: ignore[operator]
    released, decoder = run(chunked(arguments, cuts))
    assert "".join(released) == decoder.input == text


def test_characters_are_released_as_soon_as_they_are_decoded() -> None:
    decoder = InputDecoder()
    assert decoder.feed('{"in') == ""
    assert decoder.feed('put": "ab') == "ab"
    assert decoder.feed("\\") == ""  # an escape held until complete
    assert decoder.feed("n\\ud83d") == "\n"  # a high surrogate waits for its low half
    assert decoder.feed('\\ude00c"') == "😀c"
    assert decoder.feed(', "more": 1}') == ""
    assert decoder.close() == "" and decoder.input == "ab\n😀c"


@pytest.mark.parametrize(
    ("arguments", "text"),
    [
        ('{"other": 1, "input": "x"}', "x"),  # another key first: read whole at close
        ('{"input": 5}', '{"input": 5}'),  # not a string: the model's text is its input
        ("a free-form patch", "a free-form patch"),
        ('{"input": "cut sho', "cut sho"),  # the output limit: as far as it got
        ('{"input": "lone \\ud83d here"}', "lone \ufffd here"),
        ('{"input": "lone \\ude00"}', "lone \ufffd"),
        ('{"input": "\\q"}', "q"),
        ("", ""),
    ],
)
def test_arguments_of_another_shape(arguments: str, text: str) -> None:
    released, decoder = run(list(arguments))
    assert "".join(released) == decoder.input == text


def test_the_opening_held_is_bounded() -> None:
    decoder = InputDecoder()
    assert decoder.feed(" " * (MAX_OPENING + 1)) == ""
    assert decoder.stage == "other"


def test_feeding_after_close_is_the_callers_error() -> None:
    decoder = InputDecoder()
    decoder.close()
    with pytest.raises(LocalProtocolError):
        decoder.feed("x")
