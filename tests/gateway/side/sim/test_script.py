"""The simulator's output plan: deterministic, tokenised realistically, cut by max_tokens and
stop strings, and parsed in separated mode like vLLM 0.32's deepseek_r1 parser."""

from __future__ import annotations

from typing import get_args

import pytest

from gateway.side.sim.script import (
    CLOSE_TAG,
    OPEN_TAG,
    Piece,
    Script,
    SimMode,
    build_script,
    compose,
    count_prompt_tokens,
    derive_seed,
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
def test_separated_mode_splits_channels_at_a_one_token_tag(seed: int) -> None:
    script = build_script("separated", seed, prompt_tokens=1)
    text = compose(seed)
    assert script.tag_at is not None
    channels = [piece.channel for piece in script.pieces]
    assert channels == sorted(channels, reverse=True)  # all reasoning, then all content
    assert script.reasoning_tokens == channels.count("reasoning")
    if script.split_at is None:  # the model spelled the tag: vLLM's parser misses it
        assert script.text("reasoning") == text.reasoning + CLOSE_TAG + text.answer
        assert script.text("content") is None
        assert script.pieces[script.tag_at].text != CLOSE_TAG
    else:  # the tag token: no delta, still a token
        assert script.pieces[script.split_at] == Piece("reasoning", "")
        assert script.text("reasoning") == text.reasoning
        assert script.text("content") == text.answer
        assert "think>" not in joined(script)


def test_separated_mode_tags_are_split_as_in_template_mode() -> None:
    """The tag's cut is drawn after the texts: the same seed cuts it the same in both modes."""
    parsed = []
    for seed in SEEDS:
        separated = build_script("separated", seed, prompt_tokens=1)
        template = [p.text for p in build_script("template", seed, prompt_tokens=1).pieces]
        parsed.append(separated.split_at is not None)
        assert parsed[-1] == (CLOSE_TAG in template)
    assert any(parsed)
    assert not all(parsed)


def test_separated_scripted_chunks_follow_the_parser() -> None:
    one = (Piece("reasoning", "hm"), Piece("reasoning", CLOSE_TAG), Piece("content", "Hi"))
    parsed = build_script("separated", 1, prompt_tokens=1, chunks=one)
    assert parsed.pieces == (one[0], Piece("reasoning", ""), one[2])
    assert (parsed.tag_at, parsed.split_at, parsed.completion_tokens) == (1, 1, 3)
    spelled = (Piece("reasoning", "hm</th"), Piece("reasoning", "ink>"), Piece("content", "Hi"))
    missed = build_script("separated", 1, prompt_tokens=1, chunks=spelled)
    assert missed.text("reasoning") == "hm</think>Hi"
    assert (missed.text("content"), missed.tag_at, missed.split_at) == (None, 0, None)
    inside = build_script("separated", 1, prompt_tokens=1, chunks=[Piece("content", "a</think>b")])
    assert inside.pieces == (Piece("reasoning", "a</think>b"),)
    untagged = (Piece("reasoning", "a"), Piece("content", "b"))
    assert build_script("separated", 1, prompt_tokens=1, chunks=untagged).pieces == untagged


def test_other_modes_leave_scripted_tags_alone() -> None:
    chunks = (Piece("content", "a"), Piece("content", CLOSE_TAG), Piece("content", "b"))
    script = build_script("template", 1, prompt_tokens=1, chunks=chunks)
    assert (script.pieces, script.tag_at, script.split_at) == (chunks, 1, None)


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
    assert script == Script(chunks, 9, "stop", tag_at=2)
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


def test_a_stop_string_ends_the_text_and_counts_the_token_that_completed_it() -> None:
    chunks = [Piece("content", t) for t in ("ab", "cd", "ef", "gh")]
    script = build_script("template", 1, prompt_tokens=1, chunks=chunks, stops=("de", "zz"))
    assert script.text("content") == "abc"
    assert script.pieces == (Piece("content", "ab"), Piece("content", "c"), Piece("content", ""))
    assert (script.finish_reason, script.stop_reason, script.completion_tokens) == ("stop", "de", 3)


@pytest.mark.parametrize("seed", range(10))
def test_stop_strings_apply_to_the_whole_raw_text(seed: int) -> None:
    """Reasoning included: a stop inside the monologue leaves no answer at all."""
    for mode in ("template", "separated"):
        script = build_script(mode, seed, prompt_tokens=1, stops=["Let me think"])
        assert (
            script.text("content" if mode == "template" else "reasoning")
            == (compose(seed).reasoning.split("Let me think")[0])
        )
        assert (script.finish_reason, script.stop_reason) == ("stop", "Let me think")
        assert script.tag_at is None


def test_stop_in_the_answer_after_a_parsed_tag() -> None:
    seed = next(s for s in SEEDS if build_script("separated", s, prompt_tokens=1).split_at)
    answer = compose(seed).answer
    script = build_script("separated", seed, prompt_tokens=1, stops=[": in short"])
    assert script.text("reasoning") == compose(seed).reasoning
    assert script.text("content") == answer.split(": in short")[0]


def test_max_tokens_before_the_stop_is_a_length_cut() -> None:
    chunks = [Piece("content", t) for t in ("ab", "cd", "ef")]
    early = build_script("none", 1, prompt_tokens=1, chunks=chunks, stops=["e"], max_tokens=2)
    assert (early.pieces, early.finish_reason, early.stop_reason) == (
        tuple(chunks[:2]),
        "length",
        None,
    )
    just = build_script("none", 1, prompt_tokens=1, chunks=chunks, stops=["e"], max_tokens=3)
    assert (just.text("content"), just.finish_reason, just.stop_reason) == ("abcd", "stop", "e")
