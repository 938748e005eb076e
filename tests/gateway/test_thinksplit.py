"""The think splitter: rule tables run whole, one character at a time and under Hypothesis
chunkings, against an independent whole-string reference of the same rules."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.errors import LocalProtocolError
from gateway.thinksplit import Content, Reasoning, ThinkSplitter


def run(parser: str, pieces: list[str]) -> tuple[str | None, str | None]:
    """Feed pieces, close, and join each channel; an absent channel is None."""
    splitter = ThinkSplitter(parser)
    events = [e for p in pieces for e in splitter.feed(p)] + splitter.close()
    for event in events:
        assert event.text, "no empty events"
    reasoning = [e.text for e in events if isinstance(e, Reasoning)]
    content = [e.text for e in events if isinstance(e, Content)]
    return ("".join(reasoning) or None, "".join(content) or None)


def reference(parser: str, text: str) -> tuple[str | None, str | None]:
    """The rules, applied to the whole text at once (no streaming)."""
    if parser == "none":
        return None, text or None
    if parser == "think_tags":
        head, sep, rest = text.partition("<think>")
        if not sep:
            return None, text or None
        reasoning, _, tail = rest.partition("</think>")
        return reasoning or None, (head + tail) or None
    reasoning, sep, tail = text.partition("</think>")
    reasoning = reasoning.replace("<think>", "", 1)
    return reasoning or None, tail or None


CASES: list[tuple[str, str, str | None, str | None]] = [
    # deepseek_r1: starts inside reasoning
    ("deepseek_r1", "I think.\n</think>\n\nAnswer.", "I think.\n", "\n\nAnswer."),
    ("deepseek_r1", "<think>\nabc</think>xyz", "\nabc", "xyz"),
    ("deepseek_r1", "a<think>b<think>c</think>d", "ab<think>c", "d"),
    ("deepseek_r1", "only reasoning, cut by length", "only reasoning, cut by length", None),
    ("deepseek_r1", "r</think>c</think>d<think>e", "r", "c</think>d<think>e"),
    ("deepseek_r1", "</think>answer", None, "answer"),
    ("deepseek_r1", "a<thinking>b</ think>c<THINK>", "a<thinking>b</ think>c<THINK>", None),
    (
        "deepseek_r1",
        "x &lt;/think&gt; ＜/think＞ <\u200b/think>",
        "x &lt;/think&gt; ＜/think＞ <\u200b/think>",
        None,
    ),
    ("deepseek_r1", "ends with <", "ends with <", None),
    ("deepseek_r1", "ends with </thin", "ends with </thin", None),
    ("deepseek_r1", "a\r\nb</think>\r\nc", "a\r\nb", "\r\nc"),
    ("deepseek_r1", "<<</think>>", "<<", ">"),
    ("deepseek_r1", "", None, None),
    # think_tags: starts in content
    ("think_tags", "<think>\nr\n</think>\n\nA", "\nr\n", "\n\nA"),
    ("think_tags", "pre <think>r</think> post", "r", "pre  post"),
    ("think_tags", "</think>lit<think>r</think>a", "r", "</think>lit" + "a"),
    ("think_tags", "no tags at all", None, "no tags at all"),
    ("think_tags", "<think>never closed", "never closed", None),
    ("think_tags", "<think>a<think>b</think>c", "a<think>b", "c"),
    ("think_tags", "trailing <thi", None, "trailing <thi"),
    # none
    ("none", "<think>x</think>y", None, "<think>x</think>y"),
]


@pytest.mark.parametrize(("parser", "text", "reasoning", "content"), CASES)
def test_rules_whole(
    parser: str, text: str, reasoning: str | None, content: str | None
) -> None:
    assert run(parser, [text]) == (reasoning, content)
    assert reference(parser, text) == (reasoning, content)


@pytest.mark.parametrize(("parser", "text", "reasoning", "content"), CASES)
def test_rules_char_by_char(
    parser: str, text: str, reasoning: str | None, content: str | None
) -> None:
    assert run(parser, list(text)) == (reasoning, content)


@pytest.mark.parametrize(("parser", "text", "reasoning", "content"), CASES)
def test_rules_every_two_way_cut(
    parser: str, text: str, reasoning: str | None, content: str | None
) -> None:
    for i in range(len(text) + 1):
        assert run(parser, [text[:i], text[i:]]) == (reasoning, content), i


def test_tag_cut_across_chunks_is_held_then_recognised() -> None:
    s = ThinkSplitter("deepseek_r1")
    assert s.feed("reasoning </th") == [Reasoning("reasoning ")]
    assert s.feed("ink>\n\nHi") == [Content("\n\nHi")]
    assert s.reasoning_ended


def test_hold_is_released_the_moment_it_cannot_be_a_tag() -> None:
    s = ThinkSplitter("deepseek_r1")
    assert s.feed("a <") == [Reasoning("a ")]
    assert s.feed("b") == [Reasoning("<b")]
    assert s.feed("</thinx") == [Reasoning("</thinx")]


def test_nothing_is_held_after_reasoning_ended() -> None:
    s = ThinkSplitter("deepseek_r1")
    s.feed("r</think>")
    assert s.feed("<") == [Content("<")]
    assert s.feed("</thi") == [Content("</thi")]


def test_think_tags_holds_only_opening_tag_prefixes() -> None:
    s = ThinkSplitter("think_tags")
    # "</" cannot start <think>, so it is released at once in the BEFORE state
    assert s.feed("x </") == [Content("x </")]
    assert s.feed("<thi") == []
    assert s.feed("nk>r") == [Reasoning("r")]


def test_feed_after_close_is_a_local_error() -> None:
    s = ThinkSplitter()
    s.close()
    with pytest.raises(LocalProtocolError):
        s.feed("x")
    assert s.close() == []


ALPHABET = st.sampled_from(
    [
        "<think>",
        "</think>",
        "<",
        "/",
        "think",
        ">",
        "a",
        " ",
        "\n",
        "\r\n",
        "é",
        "<thi",
        "nk>",
        "</th",
    ]
)
TEXTS = st.lists(ALPHABET, max_size=30).map("".join)
PARSERS = st.sampled_from(["deepseek_r1", "think_tags", "none"])


@st.composite
def chunkings(draw: st.DrawFn) -> tuple[str, list[str]]:
    text = draw(TEXTS)
    cuts = sorted(draw(st.lists(st.integers(0, len(text)), max_size=12)))
    bounds = [0, *cuts, len(text)]
    return text, [text[a:b] for a, b in itertools.pairwise(bounds)]


@settings(max_examples=400, deadline=None)
@given(PARSERS, chunkings())
def test_any_chunking_matches_the_whole_text_reference(
    parser: str, case: tuple[str, list[str]]
) -> None:
    text, pieces = case
    assert run(parser, pieces) == reference(parser, text)


@settings(max_examples=200, deadline=None)
@given(PARSERS, chunkings())
def test_output_is_the_input_minus_the_consumed_tags(
    parser: str, case: tuple[str, list[str]]
) -> None:
    text, pieces = case
    reasoning, content = run(parser, pieces)
    removed = len(text) - len(reasoning or "") - len(content or "")
    assert removed in {0, len("<think>"), len("</think>"), len("<think>") + len("</think>")}


@settings(max_examples=200, deadline=None)
@given(PARSERS, TEXTS)
def test_held_back_text_is_only_ever_a_proper_tag_prefix(
    parser: str, text: str
) -> None:
    s = ThinkSplitter(parser)
    for ch in text:
        s.feed(ch)
        held = s._held
        assert len(held) <= len("</think>") - 1
        assert held == "" or "<think>".startswith(held) or "</think>".startswith(held)
