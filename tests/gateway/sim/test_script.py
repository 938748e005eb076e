"""The simulator's output plan: deterministic, tokenised realistically, cut by max_tokens."""

from __future__ import annotations

from typing import get_args

import pytest

from gateway.sim.script import (
    CLOSE_TAG,
    OPEN_TAG,
    Piece,
    Script,
    SimMode,
    build_script,
    compose,
    count_prompt_tokens,
    derive_seed,
    interleave,
)

MODES: tuple[SimMode, ...] = get_args(SimMode)
SEEDS = range(40)


def joined(script: Script) -> str:
    return "".join(piece.text for piece in script.pieces)


def expected_text(mode: SimMode, seed: int) -> str:
    text = compose(seed)
    closed = f"{text.reasoning}\n{CLOSE_TAG}\n\n{text.answer}"
    return {"template": closed, "tags": f"{OPEN_TAG}\n{closed}", "none": text.answer}[mode]


@pytest.mark.parametrize("mode", MODES)
def test_same_seed_same_script(mode: SimMode) -> None:
    first = build_script(mode, 7, prompt_tokens=3)
    assert build_script(mode, 7, prompt_tokens=3) == first
    assert build_script(mode, 8, prompt_tokens=3) != first


@pytest.mark.parametrize("mode", ["template", "tags", "none"])
@pytest.mark.parametrize("seed", SEEDS)
def test_joined_pieces_are_the_raw_text(mode: SimMode, seed: int) -> None:
    script = build_script(mode, seed, prompt_tokens=1)
    assert joined(script) == expected_text(mode, seed)
    assert {piece.channel for piece in script.pieces} == {"content"}
    assert script.finish_reason == "stop"
    assert script.reasoning_tokens == 0


@pytest.mark.parametrize("seed", SEEDS)
def test_separated_mode_has_no_tags_and_splits_channels(seed: int) -> None:
    script = build_script("separated", seed, prompt_tokens=1)
    text = compose(seed)
    assert script.text("reasoning") == text.reasoning
    assert script.text("content") == text.answer
    channels = [piece.channel for piece in script.pieces]
    assert channels == sorted(channels, reverse=True)  # all reasoning, then all content
    assert script.reasoning_tokens == channels.count("reasoning")
    assert "think>" not in joined(script)


def test_reasoning_reads_like_r1() -> None:
    text = compose(0).reasoning
    assert text.startswith("Okay, the user asks about ")
    for marker in ("Let me think.", "First,", "Wait,", "So the answer is"):
        assert marker in text


@pytest.mark.parametrize("seed", SEEDS)
def test_pieces_are_short_subwords(seed: int) -> None:
    pieces = [piece.text for piece in build_script("none", seed, prompt_tokens=1).pieces]
    assert all(1 <= len(text) <= 6 for text in pieces)
    assert any(text.startswith(" ") and len(text) > 1 for text in pieces)


def test_tags_are_sometimes_whole_and_sometimes_split() -> None:
    whole = split = 0
    for seed in SEEDS:
        pieces = [piece.text for piece in build_script("template", seed, prompt_tokens=1).pieces]
        if CLOSE_TAG in pieces:
            whole += 1
        else:
            split += 1
            assert CLOSE_TAG in "".join(pieces)
    assert whole > 0
    assert split > 0


def test_max_tokens_cuts_inside_reasoning() -> None:
    full = build_script("template", 3, prompt_tokens=1)
    cut = build_script("template", 3, prompt_tokens=1, max_tokens=10)
    assert cut.finish_reason == "length"
    assert cut.pieces == full.pieces[:10]
    assert cut.completion_tokens == 10
    assert CLOSE_TAG not in joined(cut)


def test_max_tokens_cut_in_separated_mode_leaves_no_content() -> None:
    cut = build_script("separated", 3, prompt_tokens=1, max_tokens=5)
    assert cut.finish_reason == "length"
    assert cut.text("content") is None
    assert cut.reasoning_tokens == 5


def test_max_tokens_equal_to_length_is_a_stop() -> None:
    full = build_script("tags", 4, prompt_tokens=1)
    exact = build_script("tags", 4, prompt_tokens=1, max_tokens=full.completion_tokens)
    assert exact == full


def test_scripted_chunks_are_used_verbatim() -> None:
    chunks = (Piece("content", "<thi"), Piece("content", "nk>a"), Piece("content", "</think>b"))
    script = build_script("tags", 1, prompt_tokens=9, chunks=chunks)
    assert script == Script(chunks, 9, "stop")
    assert (
        build_script("tags", 1, prompt_tokens=9, chunks=chunks, max_tokens=2).pieces == chunks[:2]
    )


def test_prompt_tokens_are_a_quarter_of_the_characters() -> None:
    assert count_prompt_tokens("") == 1
    assert count_prompt_tokens("abc") == 1
    assert count_prompt_tokens("x" * 400) == 100


def test_prompt_seed_is_stable_and_prompt_specific() -> None:
    assert derive_seed("hello") == derive_seed("hello")
    assert derive_seed("hello") != derive_seed("hello!")
    assert 0 <= derive_seed("hello") < 2**64


def test_interleave_round_robins_choices() -> None:
    a = Script((Piece("content", "a1"), Piece("content", "a2")), 1, "stop")
    b = Script(
        (Piece("content", "b1"), Piece("content", "b2"), Piece("content", "b3")), 1, "length"
    )
    emissions = interleave([a, b])
    assert [(e.index, e.piece.text if e.piece else None) for e in emissions] == [
        (0, "a1"),
        (1, "b1"),
        (0, "a2"),
        (1, "b2"),
        (1, "b3"),
    ]
    assert [e.finish_reason for e in emissions] == [None, None, "stop", None, "length"]
    assert [(e.opens_step, e.step_tokens) for e in emissions] == [
        (True, 2),
        (False, 0),
        (True, 2),
        (False, 0),
        (True, 1),
    ]


def test_interleave_gives_an_empty_choice_its_finish() -> None:
    empty = Script((), 1, "stop")
    (emission,) = interleave([empty])
    assert emission.piece is None
    assert emission.finish_reason == "stop"
    assert emission.step_tokens == 0
