"""The simulator's vocabulary: a choice's output as a tuple of tokens (``Piece``) in a ``Script``.

Rules:

- One piece is one completion token, whatever its text. A piece with empty text is a token
  that sends no delta: vLLM skips empty deltas (the ``</think>`` token its reasoning parser
  consumed, or text a stop string cut away), yet counts the token.
- A choice may end in one tool call (``Script.tool``): its arguments are the ``tool`` pieces,
  streamed as ``tool_calls`` deltas; a call the budget did not cut ends with ``tool_calls``.
- ``Script.tag_at`` is the piece where the first complete close marker (``Script.close``,
  ``</think>`` unless the model's format says otherwise) of the generated text starts (it may
  be spelled across several pieces); ``None`` if the text has no whole marker.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

SimMode = Literal["template", "tags", "separated", "none"]
Channel = Literal["content", "reasoning", "tool"]  # tool: arguments of the choice's tool call
FinishReason = Literal["stop", "length", "tool_calls"]

OPEN_TAG = "<think>"
CLOSE_TAG = "</think>"


@dataclass(frozen=True, slots=True)
class Piece:
    """One token of output and the delta field it travels in."""

    channel: Channel
    text: str


@dataclass(frozen=True, slots=True)
class ScriptedCall:
    """The function a choice calls (vLLM's ids: ``chatcmpl-tool-<hex>``)."""

    id: str
    name: str


@dataclass(frozen=True, slots=True)
class Script:
    """Everything one choice will emit, in order; one piece is one completion token.

    ``stop_reason`` is the stop string that ended the choice (vLLM's field), else ``None``.
    """

    pieces: tuple[Piece, ...]
    prompt_tokens: int
    finish_reason: FinishReason
    stop_reason: str | None = None
    tag_at: int | None = None
    close: str = CLOSE_TAG  # the format's close marker
    tool: ScriptedCall | None = None

    @property
    def completion_tokens(self) -> int:
        return len(self.pieces)

    @property
    def reasoning_tokens(self) -> int:
        return sum(1 for piece in self.pieces if piece.channel == "reasoning")

    @property
    def split_at(self) -> int | None:
        """The ``</think>`` token a reasoning parser consumed (it has no text left): reasoning
        before it, content after it. ``None`` if no parser recognised a tag."""
        at = self.tag_at
        return at if at is not None and not self.pieces[at].text else None

    def text(self, channel: Channel) -> str | None:
        """The joined text of one channel, or ``None`` if no piece of it has any text."""
        parts = [piece.text for piece in self.pieces if piece.channel == channel and piece.text]
        return "".join(parts) if parts else None


def find_tag(pieces: Sequence[Piece], close: str = CLOSE_TAG) -> int | None:
    """The index of the piece where the first complete ``close`` marker starts, if any."""
    at = "".join(piece.text for piece in pieces).find(close)
    if at < 0:
        return None
    for index, piece in enumerate(pieces):
        at -= len(piece.text)
        if at < 0:
            return index
    raise AssertionError("unreachable: the tag lies inside the joined text")
