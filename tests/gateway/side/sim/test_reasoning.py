"""vLLM 0.32's deepseek_r1 parser as the separated mode models it: the tag only as one token."""

from __future__ import annotations

from gateway.side.sim.pieces import CLOSE_TAG, Channel, Piece, find_tag
from gateway.side.sim.reasoning import separate

R: Channel = "reasoning"
C: Channel = "content"


def parse(*pieces: Piece) -> tuple[Piece, ...]:
    return separate(pieces, find_tag(pieces))


def test_find_tag_points_at_the_piece_where_the_tag_starts() -> None:
    assert find_tag([Piece(R, "a"), Piece(R, "b</"), Piece(R, "think>")]) == 1
    assert find_tag([Piece(R, ""), Piece(R, CLOSE_TAG)]) == 1
    assert find_tag([Piece(R, "</thin"), Piece(C, "k")]) is None


def test_the_tag_token_sends_no_delta_and_the_answer_is_content() -> None:
    assert parse(Piece(R, "why"), Piece(R, CLOSE_TAG), Piece(C, "Hi")) == (
        Piece(R, "why"),
        Piece(R, ""),
        Piece(C, "Hi"),
    )


def test_a_spelled_tag_turns_everything_from_it_into_reasoning() -> None:
    assert parse(Piece(R, "why"), Piece(R, "</th"), Piece(R, "ink>"), Piece(C, "Hi")) == (
        Piece(R, "why"),
        Piece(R, "</th"),
        Piece(R, "ink>"),
        Piece(R, "Hi"),
    )
    assert parse(Piece(R, "why</think>"), Piece(C, "Hi")) == (
        Piece(R, "why</think>"),
        Piece(R, "Hi"),
    )


def test_without_a_whole_tag_channels_stay() -> None:
    pieces = (Piece(R, "why </thi"), Piece(C, "Hi"))
    assert parse(*pieces) == pieces
