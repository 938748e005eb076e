"""Streamed deltas: merged tokens, vLLM #51641's garbled boundary, and lockstep choices."""

from __future__ import annotations

from typing import get_args

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gateway.side.sim.deltas import Delta, interleave, leak_width, plan_deltas
from gateway.side.sim.pieces import CLOSE_TAG, Channel, Piece, Script, SimMode
from gateway.side.sim.script import build_script, compose

R: Channel = "reasoning"
C: Channel = "content"


def script(*pieces: Piece) -> Script:
    return build_script("separated", 0, prompt_tokens=1, chunks=pieces)


PARSED = script(Piece(R, "ab"), Piece(R, "cd"), Piece(R, CLOSE_TAG), Piece(C, "Hi"), Piece(C, "!"))


# --- merged tokens -------------------------------------------------------------------------


def test_one_token_per_delta_by_default() -> None:
    assert plan_deltas(PARSED) == (
        Delta(R, "ab", 1),
        Delta(R, "cd", 1),
        Delta(R, "", 1),
        Delta(C, "Hi", 1),
        Delta(C, "!", 1),
    )


def test_merge_joins_a_channel_and_breaks_at_the_tag_and_channel_changes() -> None:
    assert plan_deltas(PARSED, merge=4) == (
        Delta(R, "abcd", 2),
        Delta(R, "", 1),
        Delta(C, "Hi!", 2),
    )
    raw = build_script(
        "template",
        0,
        prompt_tokens=1,
        chunks=[Piece(C, t) for t in ("a", "b", "</th", "ink>", "c")],
    )
    assert [d.text for d in plan_deltas(raw, merge=2)] == ["ab", "</think>", "c"]
    assert [d.text for d in plan_deltas(raw, merge=9)] == ["ab", "</think>c"]


@pytest.mark.parametrize("merge", [1, 2, 3, 7])
@pytest.mark.parametrize("mode", get_args(SimMode))
def test_merged_deltas_keep_text_and_token_count(mode: SimMode, merge: int) -> None:
    for seed in range(10):
        planned = build_script(mode, seed, prompt_tokens=1)
        deltas = plan_deltas(planned, merge=merge)
        assert sum(d.tokens for d in deltas) == planned.completion_tokens
        assert all(1 <= d.tokens <= merge for d in deltas)
        channels: tuple[Channel, ...] = (R, C)
        for channel in channels:
            text = "".join(d.text for d in deltas if d.channel == channel) or None
            assert text == planned.text(channel)


# --- vllm-project/vllm#51641 ---------------------------------------------------------------


@pytest.mark.parametrize(
    ("stops", "width"),
    [((), 0), (("x",), 0), (("Xy",), 1), (("Xyz", "a"), 2), (("abcdef",), 5), (("z" * 30,), 7)],
)
def test_leak_width_is_the_longest_stop_minus_one_at_most_seven(
    stops: tuple[str, ...], width: int
) -> None:
    assert leak_width(stops) == width


@pytest.mark.parametrize(("leak", "tail"), [(1, ">"), (2, "k>"), (5, "hink>"), (7, "/think>")])
def test_leak_moves_reasoning_tail_out_and_a_tag_tail_in(leak: int, tail: str) -> None:
    deltas = plan_deltas(PARSED, leak=leak)
    reasoning = "".join(d.text for d in deltas if d.channel == R)
    content = "".join(d.text for d in deltas if d.channel == C)
    assert reasoning == "abcd"[: max(0, 4 - leak)]
    assert content == tail + "Hi!"
    assert next(d.text for d in deltas if d.channel == C) == tail + "Hi"
    assert sum(d.tokens for d in deltas) == PARSED.completion_tokens


def test_leak_needs_a_parsed_tag() -> None:
    spelled = script(Piece(R, "ab"), Piece(R, "</th"), Piece(R, "ink>"), Piece(C, "Hi"))
    assert plan_deltas(spelled, leak=3) == plan_deltas(spelled)
    raw = build_script("template", 0, prompt_tokens=1, chunks=[Piece(C, "a</think>b")])
    assert plan_deltas(raw, leak=3) == plan_deltas(raw)
    assert plan_deltas(PARSED, leak=0) == plan_deltas(PARSED)


def test_leak_with_a_generated_script() -> None:
    seed = next(s for s in range(40) if build_script("separated", s, prompt_tokens=1).split_at)
    planned = build_script("separated", seed, prompt_tokens=1)
    deltas = plan_deltas(planned, merge=3, leak=2)
    text = compose(seed)
    assert "".join(d.text for d in deltas if d.channel == R) == text.reasoning[:-2]
    assert "".join(d.text for d in deltas if d.channel == C) == "k>" + text.answer


@given(st.integers(0, 7), st.integers(1, 5), st.lists(st.text("ab", max_size=3), max_size=6))
def test_leak_and_merge_keep_every_token(leak: int, merge: int, answer: list[str]) -> None:
    planned = script(Piece(R, "why"), Piece(R, CLOSE_TAG), *(Piece(C, t) for t in answer))
    deltas = plan_deltas(planned, merge=merge, leak=leak)
    assert sum(d.tokens for d in deltas) == planned.completion_tokens
    content = "".join(d.text for d in deltas if d.channel == C)
    expected = "".join(answer)
    assert content == ((CLOSE_TAG[-leak:] if leak else "") + expected if expected else "")


# --- lockstep ------------------------------------------------------------------------------


def test_interleave_round_robins_choices() -> None:
    a = Script((Piece(C, "a1"), Piece(C, "a2")), 1, "stop")
    b = Script((Piece(C, "b1"), Piece(C, "b2"), Piece(C, "b3")), 1, "length")
    emissions = interleave([a, b])
    assert [(e.index, e.delta.text if e.delta else None) for e in emissions] == [
        (0, "a1"),
        (1, "b1"),
        (0, "a2"),
        (1, "b2"),
        (1, "b3"),
    ]
    assert [e.finish_reason for e in emissions] == [None, None, "stop", None, "length"]
    assert [(e.opens_step, e.step_tokens, e.step_decodes) for e in emissions] == [
        (True, 2, 1),
        (False, 0, 0),
        (True, 2, 1),
        (False, 0, 0),
        (True, 1, 1),
    ]


def test_interleave_steps_by_merged_deltas() -> None:
    a = Script(tuple(Piece(C, t) for t in "abcde"), 1, "stop")
    b = Script(tuple(Piece(C, t) for t in "xy"), 1, "stop")
    emissions = interleave([a, b], merge=2)
    assert [(e.index, e.delta.text if e.delta else None) for e in emissions] == [
        (0, "ab"),
        (1, "xy"),
        (0, "cd"),
        (0, "e"),
    ]
    assert [(e.step_tokens, e.step_decodes) for e in emissions if e.opens_step] == [
        (4, 2),
        (2, 2),
        (1, 1),
    ]


def test_interleave_gives_an_empty_choice_its_finish() -> None:
    empty = Script((), 1, "stop")
    (emission,) = interleave([empty])
    assert emission.delta is None
    assert emission.finish_reason == "stop"
    assert emission.step_tokens == 0
