"""Incremental splitter of a model's text into reasoning and content (sans-I/O).

``ThinkSplitter(parser).feed(text) -> list[Event]`` and ``close() -> list[Event]``; events are
``Reasoning(text)`` and ``Content(text)``. Non-streaming output goes through ``feed(all)`` then
``close()``: one code path, so streamed and whole results can never disagree.

Rules (they follow vLLM's ``deepseek_r1`` reasoning parser where vLLM defines the result):

- Tags are exactly ``<think>`` and ``</think>``, case-sensitive. ``<thinking>``, ``<THINK>``,
  ``</ think>``, entities and look-alike characters are ordinary text.
- ``deepseek_r1``: the chat template already opened the block, so the output starts *inside*
  reasoning. The first ``<think>`` before the first ``</think>`` is removed (R1-0528 emits one
  itself); any later ``<think>`` inside reasoning is literal. Everything up to the first
  ``</think>`` is reasoning; with no ``</think>`` at all (``finish_reason: length``) everything
  is reasoning and content is absent.
- ``think_tags``: the output starts in content; the first ``<think>`` opens reasoning (text
  before it stays content); a ``</think>`` before any ``<think>`` is literal content.
- ``none``: everything is content.
- After the first ``</think>`` everything is content, verbatim, further tags included.
- Whitespace and CRLF are never touched.

States and the tags active in each (the whole transition table)::

    R1_OPENING  reasoning  <think> -> R1_REASONING (tag dropped)   </think> -> ANSWER
    R1_REASONING reasoning                                          </think> -> ANSWER
    BEFORE      content    <think> -> REASONING
    REASONING   reasoning                                           </think> -> ANSWER
    ANSWER      content    (no tags: pass through, nothing held)

Hold-back: only the longest suffix that is a proper prefix of a tag active in the current state
is held (at most ``len("</think>") - 1`` characters), and released the moment it cannot become a
tag. Both tags start with ``<`` and contain no other ``<``, so that suffix can only start at the
last ``<``: one ``rfind`` over the last seven characters finds it. Each call scans the held
suffix (≤ 7 characters) plus the new text once, with ``str.find`` in C: O(chunk), never O(stream).
At ``close()`` the held suffix is flushed as literal text of the current channel. A chunk with
no ``<`` and nothing held cannot touch a tag and is passed through without scanning further.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Literal

from gateway.errors import LocalProtocolError

OPEN_TAG = "<think>"
CLOSE_TAG = "</think>"
_WINDOW = len(CLOSE_TAG) - 1

ReasoningParser = Literal["deepseek_r1", "think_tags", "none"]


@dataclass(frozen=True, slots=True)
class Reasoning:
    text: str


@dataclass(frozen=True, slots=True)
class Content:
    text: str


SplitEvent = Reasoning | Content


class State(enum.Enum):
    R1_OPENING = enum.auto()
    R1_REASONING = enum.auto()
    BEFORE = enum.auto()
    REASONING = enum.auto()
    ANSWER = enum.auto()


# state -> (channel is reasoning, tags to look for, where each tag leads)
_TRANSITIONS: dict[State, tuple[bool, dict[str, State]]] = {
    State.R1_OPENING: (True, {OPEN_TAG: State.R1_REASONING, CLOSE_TAG: State.ANSWER}),
    State.R1_REASONING: (True, {CLOSE_TAG: State.ANSWER}),
    State.BEFORE: (False, {OPEN_TAG: State.REASONING}),
    State.REASONING: (True, {CLOSE_TAG: State.ANSWER}),
    State.ANSWER: (False, {}),
}

_INITIAL: dict[ReasoningParser, State] = {
    "deepseek_r1": State.R1_OPENING,
    "think_tags": State.BEFORE,
    "none": State.ANSWER,
}


class ThinkSplitter:
    """Splits one choice's text stream; create one per choice index."""

    __slots__ = ("_closed", "_held", "state")

    def __init__(self, parser: ReasoningParser = "deepseek_r1") -> None:
        self.state = _INITIAL[parser]
        self._held = ""
        self._closed = False

    @classmethod
    def inside_reasoning(cls) -> ThinkSplitter:
        """For reasoning text whose block was opened and its ``<think>`` removed upstream (a
        reasoning field): only ``</think>`` is a tag; a ``<think>`` in it is literal."""
        splitter = cls("deepseek_r1")
        splitter.state = State.R1_REASONING
        return splitter

    @property
    def idle(self) -> bool:
        """Nothing is held back."""
        return not self._held

    @property
    def reasoning_ended(self) -> bool:
        """True once the output is in the answer (always true for ``none``)."""
        return self.state is State.ANSWER

    def feed(self, text: str) -> list[SplitEvent]:
        if self._closed:
            raise LocalProtocolError("feed() after close()")
        if self.state is State.ANSWER:  # the hot path once reasoning is over
            return [Content(text)] if text else []
        if not self._held and "<" not in text:  # the hot path inside reasoning: no tag can start
            if not text:
                return []
            return [Reasoning(text) if _TRANSITIONS[self.state][0] else Content(text)]
        out: list[SplitEvent] = []
        buf = self._held + text
        self._held = ""
        while buf:
            buf = self._step(buf, out)
        return out

    def drop_held(self) -> str:
        """Forget the held text (a caller that knows it was a damaged tag); return it."""
        held, self._held = self._held, ""
        return held

    def release(self) -> list[SplitEvent]:
        """Give up waiting on held text: it is literal text of the current channel. For a
        caller that knows no tag can continue it (the upstream moved on to another field)."""
        out: list[SplitEvent] = []
        _emit(out, _TRANSITIONS[self.state][0], self._held)
        self._held = ""
        return out

    def close(self) -> list[SplitEvent]:
        """End of the stream: flush whatever was held as literal text of the current channel."""
        if self._closed:
            return []
        self._closed = True
        out: list[SplitEvent] = []
        _emit(out, _TRANSITIONS[self.state][0], self._held)
        self._held = ""
        return out

    def _step(self, buf: str, out: list[SplitEvent]) -> str:
        """Consume ``buf`` up to and including the first active tag; return the rest."""
        reasoning, tags = _TRANSITIONS[self.state]
        if not tags:
            _emit(out, reasoning, buf)
            return ""
        pos, tag = _first_tag(buf, tags)
        if tag is None:
            keep = _held_suffix(buf, tags)
            _emit(out, reasoning, buf[: len(buf) - keep])
            self._held = buf[len(buf) - keep :]
            return ""
        _emit(out, reasoning, buf[:pos])
        self.state = tags[tag]
        return buf[pos + len(tag) :]


def _first_tag(buf: str, tags: dict[str, State]) -> tuple[int, str | None]:
    best, found = len(buf), None
    for tag in tags:
        pos = buf.find(tag, 0, best + len(tag))
        if 0 <= pos < best:
            best, found = pos, tag
    return best, found


def _held_suffix(buf: str, tags: dict[str, State]) -> int:
    """Length of the longest suffix of ``buf`` that is a proper prefix of an active tag."""
    start = buf.rfind("<", max(0, len(buf) - _WINDOW))
    if start < 0:
        return 0
    suffix = buf[start:]
    return len(suffix) if any(tag.startswith(suffix) for tag in tags) else 0


def _emit(out: list[SplitEvent], reasoning: bool, text: str) -> None:
    if not text:
        return
    if out and isinstance(out[-1], Reasoning if reasoning else Content):
        text = out.pop().text + text
    out.append(Reasoning(text) if reasoning else Content(text))
