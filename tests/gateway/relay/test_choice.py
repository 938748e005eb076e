"""Per-choice splitting, including the repairs for upstream-separated reasoning that real
vLLM 0.32 made necessary (a spelled </think>, and vllm-project/vllm#51641's leaked tag tail)."""

from __future__ import annotations

import pytest

from gateway.relay.choice import ChoiceState
from gateway.relay.formats import BUILTIN
from gateway.relay.thinksplit import ThinkSplitter


def separated(repair: bool = True) -> ChoiceState:
    return ChoiceState(ThinkSplitter("deepseek_r1"), repair_leak=repair)


def feed(state: ChoiceState, deltas: list[tuple[str, str]]) -> tuple[str, str]:
    """Feed (field, text) deltas, the last one final; join what came out per channel."""
    out_r, out_c = [], []
    for i, (field, text) in enumerate(deltas):
        final = i == len(deltas) - 1
        r, c = state.take(
            text if field == "content" else None, text if field != "content" else None, final
        )
        out_r.append(r)
        out_c.append(c)
    return "".join(out_r), "".join(out_c)


def test_a_spelled_end_tag_in_the_reasoning_field_ends_reasoning() -> None:
    # vLLM's parser knows </think> only as one token; spelled, it stays in "reasoning".
    deltas = [
        ("reasoning", "That is 42.\n<"),
        ("reasoning", "/th"),
        ("reasoning", "ink>\n\nThe"),
        ("reasoning", " answer"),
    ]
    assert feed(separated(), deltas) == ("That is 42.\n", "\n\nThe answer")


def test_an_opening_tag_inside_the_reasoning_field_is_literal() -> None:
    assert feed(separated(), [("reasoning", "a <think> b"), ("content", "c")]) == (
        "a <think> b",
        "c",
    )


# Boundaries seen from real vLLM 0.32 streaming with stop strings (vllm-project/vllm#51641):
# what the reasoning field ended with, and how the content field began.
SEEN_51641 = [
    ("That is 42", ["k>", "\n\nThe answer"]),
    ("That is 42", ["k", ">", "\n", "\nThe answer"]),
    ("That is 42.\n</thi", ["think>\n\nThe answer"]),
    ("That is 42.\n</thin", ["nk>\n\nThe answer"]),
    ("That is 42.\n</thin", ["ink>\n\nThe answer"]),
    ("That is", ["h", "i", "nk>", "\n", "\nThe answer"]),
    ("That is 42.", [">\n\nThe answer"]),
    ("That is 42.\n</thi", ["</think>\n\nThe answer"]),
    ("That ", ["/think>\n\nThe answer"]),
    ("That is 42.\n<", ["\n</think>\n\nThe answer"]),
    ("That is 42.\n", ["\n\nThe answer"]),  # undamaged
]


@pytest.mark.parametrize(("reasoning", "content"), SEEN_51641)
def test_the_boundary_garbled_by_vllm_51641_is_repaired(reasoning: str, content: list[str]) -> None:
    state = separated()
    got_reasoning, got_content = feed(
        state, [("reasoning", reasoning), *[("content", c) for c in content]]
    )
    assert got_content == "\n\nThe answer"
    assert "That is 42.\n".startswith(got_reasoning)  # text vLLM lost stays lost
    assert state.leaks_repaired == (0 if content[0].startswith("\n\n") else 1)


@pytest.mark.parametrize("content", [["> a quote"], ["kids"], ["k", "ids"], ["\n\nk>"], ["k"]])
def test_genuine_content_is_untouched(content: list[str]) -> None:
    state = separated()
    deltas = [("reasoning", "r"), *[("content", c) for c in content]]
    assert feed(state, deltas) == ("r", "".join(content))
    assert state.leaks_repaired == 0


def test_no_repair_without_stop_strings() -> None:
    state = separated(repair=False)
    assert feed(state, [("reasoning", "r"), ("content", "hink>x")]) == ("r", "hink>x")


def test_only_the_first_content_is_examined() -> None:
    state = separated()
    deltas = [("reasoning", "r"), ("content", "A"), ("content", "k> later")]
    assert feed(state, deltas) == ("r", "Ak> later")


def test_text_split_choices_count_tag_tokens_as_reasoning() -> None:
    state = ChoiceState(ThinkSplitter("deepseek_r1"))
    feed(state, [("content", "a"), ("content", "</think>"), ("content", "b")])
    assert (state.deltas, state.reasoning_deltas) == (3, 2)


@pytest.mark.parametrize(
    ("name", "tokens", "reasoning_tokens"),
    [
        ("deepseek_r1", ["a", "</thi", "nk>", "b"], 3),  # the marker's two tokens are reasoning
        ("deepseek_r1", ["a", "<", "b", "</think>", "c"], 4),  # a held '<' that was reasoning
        ("kimi_k3", ["r", "<|close|>", "think", "<|sep|>", "Hi"], 4),
        # an "also ends" marker is a content token: it stays in the answer
        ("kimi_k3", ["<|open|>", "response", "<|sep|>", "Hi", " there"], 0),
        ("deepseek_v4", ["r", "<｜DSML｜", "tool_calls", ">", "x"], 1),
    ],
)
def test_held_tokens_count_where_their_text_went(
    name: str, tokens: list[str], reasoning_tokens: int
) -> None:
    state = ChoiceState.start(BUILTIN[name], "text", thinking=True, repair_leak=False)
    feed(state, [("content", t) for t in tokens])
    assert (state.deltas, state.reasoning_deltas) == (len(tokens), reasoning_tokens)


PLAIN_STREAMS = {
    "r1 text": ("text", ["<think>", "\n", "Let", " me", " think", "<", "/think", ">", "\n\n",
                         "The", " answer", " is", " 4", "."]),
    "qwen3 text": ("text", ["<think>\n", "a", " b", "</think>", "\n\nc", " d"]),
    "separated": ("upstream", ["r1", " r2", " <no", " marker>", " r3"]),
}  # fmt: skip


@pytest.mark.parametrize("name", sorted(PLAIN_STREAMS))
def test_the_plain_fast_path_keeps_and_counts_what_take_does(name: str) -> None:
    source, texts = PLAIN_STREAMS[name]
    fmt = BUILTIN["qwen3" if name.startswith("qwen3") else "deepseek_r1"]

    def run(fast: bool) -> tuple[object, ...]:
        state = ChoiceState.start(fmt, source, thinking=True, repair_leak=False)  # type: ignore[arg-type]
        taken = 0
        for text in texts:
            as_reasoning = source == "upstream"
            if fast and state.take_plain(
                text, reasoning=as_reasoning or state.splitter.in_reasoning
            ):
                taken += 1
            elif as_reasoning:
                state.take(None, text, final=False)
            else:
                state.take(text, None, final=False)
        state.take(None, None, final=True)
        return (tuple(state.reasoning), tuple(state.content), state.deltas,
                state.reasoning_deltas, state.reasoning_tokens, taken > 0 or not fast)  # fmt: skip

    slow, fast = run(False), run(True)
    assert fast == slow  # same text kept, same counts; and the fast path took some deltas
