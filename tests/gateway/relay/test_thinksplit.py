"""The think splitter: rule tables run whole, one character at a time and under Hypothesis
chunkings, against an independent whole-string reference of the same rules."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.errors import LocalProtocolError
from gateway.relay.formats import BUILTIN, ReasoningFormat
from gateway.relay.thinksplit import Content, Reasoning, ThinkSplitter


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
def test_rules_whole(parser: str, text: str, reasoning: str | None, content: str | None) -> None:
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
def test_held_back_text_is_only_ever_a_proper_tag_prefix(parser: str, text: str) -> None:
    s = ThinkSplitter(parser)
    for ch in text:
        s.feed(ch)
        held = s._held
        assert len(held) <= len("</think>") - 1
        assert held == "" or "<think>".startswith(held) or "</think>".startswith(held)


# -- every format of the registry (gateway.relay.formats) ------------------------------------------

K3_OPEN, K3_CLOSE = "<|open|>think<|sep|>", "<|close|>think<|sep|>"
K3_RESPONSE = "<|open|>response<|sep|>"
DSML = "<｜DSML｜tool_calls>"

FORMAT_CASES: list[tuple[str, str, str | None, str | None]] = [
    # R1 family markers with the template's opening, and each family's extra end markers
    ("deepseek_v4", "r</think>a", "r", "a"),
    ("deepseek_v4", f"plan{DSML}<｜DSML｜invoke", "plan", f"{DSML}<｜DSML｜invoke"),
    ("deepseek_v4", "r<｜DSML｜tool>x", "r", "<｜DSML｜tool>x"),
    ("deepseek_v4", "r</think>a<｜DSML｜tool_calls>", "r", "a<｜DSML｜tool_calls>"),
    ("qwen3", "<think>\nr\n</think>\n\nA", "\nr\n", "\n\nA"),
    (
        "qwen3",
        "let me call<tool_call>\n{}</tool_call>",
        "let me call",
        "<tool_call>\n{}</tool_call>",
    ),
    ("qwen3", "<tool_call>x", None, "<tool_call>x"),
    ("qwen3", "r</think>a<tool_call>b", "r", "a<tool_call>b"),
    ("qwen3", "r<tool_cal", "r<tool_cal", None),
    ("kimi_k2", "r<|tool_calls_section_begin|>c", "r", "<|tool_calls_section_begin|>c"),
    ("kimi_k2", "r</think>c", "r", "c"),
    ("glm45", "<think>r</think>c", "r", "c"),
    ("glm45", "r<tool_call>f", "r", "<tool_call>f"),
    # Kimi K3: markers of three tokens each, with '<' inside them
    ("kimi_k3", f"{K3_OPEN}r{K3_CLOSE}a", "r", "a"),
    ("kimi_k3", f"r{K3_CLOSE}a", "r", "a"),
    ("kimi_k3", "r<|close|>thin<|close|>think<|sep|>a", "r<|close|>thin", "a"),
    ("kimi_k3", f"{K3_RESPONSE}hello", None, f"{K3_RESPONSE}hello"),
    ("kimi_k3", f"{K3_OPEN}r{K3_RESPONSE}x{K3_CLOSE}a", f"r{K3_RESPONSE}x", "a"),
    ("kimi_k3", f"plan {K3_RESPONSE}x", f"plan {K3_RESPONSE}x", None),
    ("kimi_k3", f" \n{K3_RESPONSE}x", " \n", f"{K3_RESPONSE}x"),
    ("kimi_k3", "r<think></think>a", "r<think></think>a", None),
    ("kimi_k3", "r<|close|>think<|sep|", "r<|close|>think<|sep|", None),
    ("kimi_k3", f"r{K3_CLOSE}{K3_OPEN}x", "r", f"{K3_OPEN}x"),
    # MiniMax M2: the template opened the block; a <think> inside is dropped once
    ("minimax_m2", "r</think>a", "r", "a"),
    ("minimax_m2", "<think>r</think>a", "r", "a"),
    ("minimax_m2", "r<minimax:tool_call><invoke", "r", "<minimax:tool_call><invoke"),
    # no text markers: all content
    ("openai_gptoss", "<think>x</think>y", None, "<think>x</think>y"),
]
FORMAT_NAMES = [name for name, fmt in BUILTIN.items()]


def reference_format(fmt: ReasoningFormat, text: str) -> tuple[str | None, str | None]:
    """The rules of gateway.relay.formats applied to the whole text at once (no streaming)."""
    if not fmt.splits:
        return None, text or None
    assert fmt.close is not None
    reasoning: list[str] = []
    content: list[str] = []
    pos, opening = 0, fmt.opened
    if not fmt.opened:
        assert fmt.open is not None
        at = text.find(fmt.open)
        if at < 0:
            return None, text or None
        content.append(text[:at])
        pos = at + len(fmt.open)
    while True:
        found = [(text.find(fmt.close, pos), fmt.close, "drop")]
        found += [(text.find(m, pos), m, "keep") for m in fmt.ends]
        if opening:
            # only at the very start of the output: whitespace at most before it
            found += [
                (at, m, "keep")
                for m in fmt.ends_unopened
                if (at := text.find(m, pos)) >= 0 and not text[:at].strip()
            ]
            if fmt.open:
                found.append((text.find(fmt.open, pos), fmt.open, "open"))
        hits = sorted((at, m, what) for at, m, what in found if at >= 0)
        if not hits:
            reasoning.append(text[pos:])
            break
        at, marker, what = hits[0]
        reasoning.append(text[pos:at])
        if what == "open":
            pos, opening = at + len(marker), False
            continue
        content.append(text[at + len(marker) :] if what == "drop" else text[at:])
        break
    return "".join(reasoning) or None, "".join(content) or None


@pytest.mark.parametrize(("name", "text", "reasoning", "content"), FORMAT_CASES)
def test_format_rules_whole_char_by_char_and_every_cut(
    name: str, text: str, reasoning: str | None, content: str | None
) -> None:
    assert reference_format(BUILTIN[name], text) == (reasoning, content)
    assert run(name, [text]) == (reasoning, content)
    assert run(name, list(text)) == (reasoning, content)
    for i in range(len(text) + 1):
        assert run(name, [text[:i], text[i:]]) == (reasoning, content), i


@pytest.mark.parametrize("marker", [K3_OPEN, K3_CLOSE, K3_RESPONSE])
def test_multi_token_markers_cut_at_any_two_points(marker: str) -> None:
    text = f"x{marker}y"
    whole = run("kimi_k3", [text])
    for i, j in itertools.combinations(range(len(text) + 1), 2):
        assert run("kimi_k3", [text[:i], text[i:j], text[j:]]) == whole, (i, j)


def test_a_marker_with_multi_byte_characters_cut_between_deltas_is_found() -> None:
    # "<｜DSML｜tool_calls>" in pieces; cuts inside the bytes: tests/gateway/relay/test_rewrite.py.
    s = ThinkSplitter("deepseek_v4")
    assert s.feed("r<") == [Reasoning("r")]
    assert s.feed("｜DS") == []
    assert s.feed("ML｜tool_calls>c") == [Content(f"{DSML}c")]


def test_the_hold_back_ends_as_soon_as_the_text_leaves_every_marker() -> None:
    s = ThinkSplitter("kimi_k3")
    assert s.feed("a<|close|>thi") == [Reasoning("a")]
    assert s.feed("s") == [Reasoning("<|close|>this")]
    assert s.feed(" <|open|>think<|se") == [Reasoning(" ")]
    assert s.feed("x") == [Reasoning("<|open|>think<|sex")]


def test_kimi_k3s_response_opener_ends_reasoning_only_at_the_start_of_the_output() -> None:
    # The model answered without thinking; later, the same marker is text of the reasoning.
    s = ThinkSplitter("kimi_k3")
    assert s.feed("\n<|open|>response<|se") == [Reasoning("\n")]
    assert s.feed("p|>hi") == [Content("<|open|>response<|sep|>hi")]
    late = "Plan: answer inside <|open|>response<|sep|> once done. Secret step 2."
    assert run("kimi_k3", list(late)) == (late, None)


@pytest.mark.parametrize("name", ["qwen3", "deepseek_v4", "glm45", "minimax_m2", "kimi_k2"])
def test_a_reasoning_field_ends_only_at_the_close_marker(name: str) -> None:
    # the engine's parser already took tool calls out: a marker left in its field is text
    fmt = BUILTIN[name]
    s = ThinkSplitter.inside_reasoning(fmt)
    text = f"I could emit {fmt.ends[0]} but first: step 2"
    assert [*s.feed(text), *s.close()] == [Reasoning(text)]


def format_alphabet(fmt: ReasoningFormat) -> st.SearchStrategy[str]:
    markers = [m for m in (fmt.open, fmt.close, *fmt.ends, *fmt.ends_unopened) if m]
    pieces = {"a", " ", "\n", "é", "<", "|", ">", "<think>", "</think>"}
    for m in markers:
        pieces |= {m, m[: len(m) // 2], m[len(m) // 2 :], m[:-1], m[1:]}
    return st.sampled_from(sorted(pieces))


@st.composite
def format_chunkings(draw: st.DrawFn) -> tuple[str, str, list[str]]:
    name = draw(st.sampled_from(FORMAT_NAMES))
    text = draw(st.lists(format_alphabet(BUILTIN[name]), max_size=25).map("".join))
    cuts = sorted(draw(st.lists(st.integers(0, len(text)), max_size=12)))
    bounds = [0, *cuts, len(text)]
    return name, text, [text[a:b] for a, b in itertools.pairwise(bounds)]


@settings(max_examples=1500, deadline=None)
@given(format_chunkings())
def test_every_format_under_any_chunking_matches_the_whole_text_reference(
    case: tuple[str, str, list[str]],
) -> None:
    name, text, pieces = case
    assert run(name, pieces) == reference_format(BUILTIN[name], text)


@settings(max_examples=500, deadline=None)
@given(format_chunkings())
def test_every_format_holds_back_only_a_proper_prefix_of_an_active_marker(
    case: tuple[str, str, list[str]],
) -> None:
    name, text, _ = case
    fmt = BUILTIN[name]
    markers = [m for m in (fmt.open, fmt.close, *fmt.ends, *fmt.ends_unopened) if m]
    longest = max((len(m) for m in markers), default=1)
    s = ThinkSplitter(fmt)
    for ch in text:
        s.feed(ch)
        held = s._held
        assert len(held) <= longest - 1
        assert held == "" or any(m.startswith(held) and m != held for m in markers)


@pytest.mark.parametrize("name", sorted(BUILTIN))
def test_what_hands_back_promises_is_what_feed_does(name: str) -> None:
    """Across every format and the states a stream passes: when ``hands_back`` answers, feed
    gives the text back whole on that channel and the state stays; it answers often."""
    pieces = ["plain", " words", "<", "think>", "\n", "</think>", "\n\n", "x < y", "done", " ",
              "<tool_call>", "a"]  # fmt: skip
    answered = 0
    for start in range(len(pieces)):
        splitter = ThinkSplitter(BUILTIN[name])
        for piece in pieces[:start]:
            splitter.feed(piece)
        for piece in pieces[start:]:
            kind = splitter.hands_back(piece)
            before = (splitter.state, splitter.idle)
            events = splitter.feed(piece)
            if kind is not None:
                answered += 1
                assert [(type(e).__name__, e.text) for e in events] == [
                    ("Reasoning" if kind else "Content", piece)
                ], (name, start, piece)
                assert (splitter.state, splitter.idle) == before
    assert answered > 0
