"""vLLM's ``deepseek_r1`` reasoning parser, as the ``separated`` mode models it (sans-I/O).

``separate(pieces, tag_at) -> pieces`` assigns the delta field of every token the way
``vllm serve --reasoning-parser deepseek_r1`` does when the chat template already opened the
think block (so the output starts inside reasoning).

Rules (vLLM 0.32):

- The parser finds the end of reasoning only by the *token id* of ``</think>``. A piece whose
  text is exactly ``</think>`` is that token: it sends no delta (its text is dropped, it still
  counts as a token) and the pieces after it keep their channel (the answer: ``content``).
- A tag the model *spelled* across several pieces (or wrote inside a longer piece) is plain
  text to the parser: that piece and every piece after it, the answer included, travel in
  ``reasoning``, so ``content`` stays empty (non-streaming: ``null``).
- Without a whole tag (``tag_at`` is ``None``) the pieces are left as they are. Scripted
  chunks go through the same rules, keeping the channel they were given otherwise.
"""

from __future__ import annotations

from collections.abc import Sequence

from gateway.side.sim.pieces import CLOSE_TAG, Piece


def separate(
    pieces: Sequence[Piece], tag_at: int | None, close: str = CLOSE_TAG
) -> tuple[Piece, ...]:
    """The pieces with the channels vLLM's deepseek_r1 parser gives them (``close``: the
    format's close marker, one token when it is one piece)."""
    if tag_at is None:
        return tuple(pieces)
    before, tag, after = pieces[:tag_at], pieces[tag_at], pieces[tag_at + 1 :]
    if tag.text == close:
        return (*before, Piece("reasoning", ""), *after)
    return (*before, *(_as_reasoning(piece) for piece in pieces[tag_at:]))


def _as_reasoning(piece: Piece) -> Piece:
    """Text after a spelled tag is reasoning to the parser; a tool call's arguments were taken
    out by the tool parser already."""
    return piece if piece.channel == "tool" else Piece("reasoning", piece.text)
