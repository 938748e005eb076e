"""Where generation ends: stop strings and ``max_tokens`` applied to one choice's tokens (sans-I/O).

``end_generation(pieces, stops, max_tokens) -> Ending`` keeps the tokens vLLM would have
generated and the text it would have returned.

Rules (vLLM 0.32):

- Stop strings are matched against the whole generated text, reasoning and think tags
  included (vLLM checks them before any reasoning parser runs).
- Generation stops at the first token that *completes* a stop string, as vLLM checks after
  every token: of all occurrences, the one ending first wins (ties: the one starting first).
  That token and every one before it are generated and counted; the returned text ends just
  before the stop string (``include_stop_str_in_output`` is false), so pieces at or after
  its start lose their text and become empty tokens, which send no delta.
- ``finish_reason`` is ``"stop"`` and ``stop_reason`` is the matched string, unless
  ``max_tokens`` ran out first: then the first ``max_tokens`` pieces are kept untouched and
  ``finish_reason`` is ``"length"``. Without either, the choice stops at its end (EOS:
  ``stop_reason`` null). Empty stop strings match nothing.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from itertools import accumulate

from gateway.side.sim.pieces import FinishReason, Piece


@dataclass(frozen=True, slots=True)
class StopHit:
    """A stop string found in the text: it spans characters ``start`` to ``end``."""

    stop: str
    start: int
    end: int


@dataclass(frozen=True, slots=True)
class Ending:
    """The generated pieces and why generation ended."""

    pieces: tuple[Piece, ...]
    finish_reason: FinishReason
    stop_reason: str | None


def end_generation(pieces: Sequence[Piece], stops: Sequence[str], max_tokens: int | None) -> Ending:
    """Apply the stop strings and the token budget to the planned ``pieces``."""
    limit = len(pieces) if max_tokens is None else max_tokens
    hit = find_stop("".join(piece.text for piece in pieces), stops)
    if hit is not None:
        ends = list(accumulate(len(piece.text) for piece in pieces))
        generated = next(i for i, end in enumerate(ends) if end >= hit.end) + 1
        if generated <= limit:
            return Ending(_truncate(pieces[:generated], hit.start), "stop", hit.stop)
    if len(pieces) > limit:
        return Ending(tuple(pieces[:limit]), "length", None)
    return Ending(tuple(pieces), "stop", None)


def find_stop(text: str, stops: Sequence[str]) -> StopHit | None:
    """The occurrence generation would stop at: the earliest end, then the earliest start."""
    hits = [StopHit(s, i, i + len(s)) for s in stops if s and (i := text.find(s)) >= 0]
    return min(hits, key=lambda hit: (hit.end, hit.start), default=None)


def _truncate(pieces: Sequence[Piece], keep: int) -> tuple[Piece, ...]:
    """The pieces with their text cut at character ``keep`` (empty pieces stay, as tokens)."""
    kept: list[Piece] = []
    for piece in pieces:
        text = piece.text[: max(keep, 0)]
        keep -= len(piece.text)
        kept.append(piece if text == piece.text else Piece(piece.channel, text))
    return tuple(kept)
